"""What the cluster's store deals in, and what a store must do (``Store``): the interface that
PostgreSQL's ``ClusterStore`` (``store.py``) and the simulator's in-memory model
(``sim/cluster_store.py``) both implement, kept apart from the PostgreSQL client."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class Fenced(Exception):
    """A partition's epoch has moved on: another host owns it now. Nothing was written."""

    def __init__(self, partitions: Sequence[int]) -> None:
        super().__init__(f"fenced: partitions {sorted(partitions)} have a newer owner")
        self.partitions = sorted(partitions)


class StoreError(Exception):
    """A store that is not PostgreSQL could not answer (the simulator's): the call's outcome is
    unknown, as for a ``psycopg.Error`` of ``ClusterStore``."""


class ClusterMismatch(Exception):
    """The database holds a cluster created with another partition count."""


@dataclass(frozen=True)
class Lease:
    """A partition this host owns at ``epoch``. ``until`` is on the host's own monotonic clock:
    the host serves the partition only before it (the lease's time less the margin, counted from
    before the request was sent, so it ends before PostgreSQL's expiry does)."""

    partition: int
    epoch: int
    until: float


@dataclass(frozen=True)
class Write:
    """One durable write of an actor: frame ``seq`` of ``address``, under ``epoch``."""

    partition: int
    epoch: int
    address: str
    seq: int
    data: bytes


@dataclass(frozen=True)
class AlarmChange:
    """An entry of the alarm index set (``at``) or dropped (``at`` None), under ``epoch``."""

    partition: int
    epoch: int
    address: str
    at: float | None


class Store(Protocol):
    """One host's handle on the cluster's store (decision 0016 says what each call promises).

    Every call is one atomic step of the store; a call that raises something else than
    ``Fenced`` or ``ValueError`` may or may not have taken effect.
    """

    host_id: str
    partitions: int
    secret: bytes

    def close(self) -> None: ...

    def acquire(self, partition: int, ttl: float, margin: float) -> Lease | None: ...

    def renew(self, leases: Sequence[Lease], ttl: float, margin: float) -> list[Lease]: ...

    def heartbeat(self, ttl: float, address: str | None = None) -> int: ...

    def leave(self) -> None: ...

    def free_partitions(self, limit: int) -> list[int]: ...

    def release(self, leases: Sequence[Lease]) -> None: ...

    def commit(self, writes: Sequence[Write], alarms: Sequence[AlarmChange] = ()) -> None: ...

    def alarms_of(self, partitions: Sequence[int]) -> list[tuple[int, str, float]]: ...

    def load(self, address: str) -> tuple[int, bytes, list[tuple[int, bytes]]]: ...

    def compact(self, partition: int, epoch: int, address: str, seq: int, image: bytes) -> None: ...

    def frames(self, address: str, after: int = 0) -> list[tuple[int, bytes]]: ...

    def forget_actor(self, partition: int, epoch: int, address: str) -> None: ...

    def owners(self) -> dict[int, tuple[str, str | None]]: ...

    def lease_of(self, partition: int) -> tuple[str | None, int]: ...


def lease_partition(lease: Lease) -> int:
    return lease.partition


def check_lease_times(ttl: float, margin: float) -> None:
    """``ValueError`` unless ``0 < margin < ttl <= 3600``."""
    if not 0 < margin < ttl <= 3600:
        raise ValueError(f"need 0 < margin < ttl <= 3600 seconds, not ttl={ttl}, margin={margin}")
