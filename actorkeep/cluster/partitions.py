"""Which partition an actor belongs to: FNV-1a of its address, modulo the cluster's partition
count (fixed when the cluster is created)."""

from __future__ import annotations

from ..address import split_address
from ..hashing import fnv1a64

#: Partitions of a new cluster unless told otherwise.
DEFAULT_PARTITIONS = 1024

#: The most partitions a cluster may have: one lease row each, renewed by its owner.
MAX_PARTITIONS = 65536


def check_partitions(n: object) -> int:
    """``n`` if it is a valid partition count, else ``ValueError``."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_PARTITIONS:
        raise ValueError(f"partitions must be an integer from 1 to {MAX_PARTITIONS}, not {n!r}")
    return n


def partition_of(address: str, partitions: int) -> int:
    """The partition of the actor at ``address`` (``class/name``, validated)."""
    split_address(address)
    return fnv1a64(address.encode()) % partitions
