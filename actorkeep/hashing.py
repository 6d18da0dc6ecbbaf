"""FNV-1a, 64 bits: the placement hash of KV keys over shards and of actor addresses over a
cluster's partitions. Stable across processes, versions and machines (unlike ``hash()``)."""

from __future__ import annotations

from typing import Final

_OFFSET: Final = 0xCBF29CE484222325
_PRIME: Final = 0x100000001B3
_MASK: Final = (1 << 64) - 1


def fnv1a64(data: bytes) -> int:
    """The 64-bit FNV-1a hash of ``data``."""
    h = _OFFSET
    for byte in data:
        h = ((h ^ byte) * _PRIME) & _MASK
    return h
