"""What the cluster keeps in PostgreSQL, as an in-memory model for the simulator: the same
``Store`` interface as ``actorkeep.cluster.store.ClusterStore`` (decision 0016), each call one
atomic step, so that histories over it are linearizable by construction.

``MemoryCluster(partitions, clock, secret)`` is the database; ``clock()`` is its own clock
(PostgreSQL's, which alone decides when a lease expires). ``cluster.connect(host_id, clock)``
is one host's handle, ``clock`` the host's own monotonic clock, as for ``ClusterStore``.
``tests/test_cluster_store.py`` runs the same checks against both.

``StoreLink`` is how one host reaches the model: on the trio thread (``ClusterStorage``'s
``run_store``), each call after a seeded delay, some replies lost after the call took effect,
and nothing answering while the store fails over (``MemoryCluster.fail_over``), after which
everything committed before is still there.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import trio

from actorkeep.cluster.partitions import check_partitions
from actorkeep.cluster.records import (
    AlarmChange,
    Fenced,
    Lease,
    StoreError,
    Write,
    check_lease_times,
    lease_partition,
)
from actorkeep.hashing import fnv1a64

T = TypeVar("T")


class StoreUnreachable(StoreError):
    """The store did not answer (it is failing over): the call did not run."""


class ReplyLost(StoreError):
    """The call ran, and what it wrote is committed, but its reply was lost."""


class RequestLost(StoreError):
    """The connection dropped before the call reached the store: it did not run."""


@dataclass
class _LeaseRow:
    owner: str | None = None
    epoch: int = 0
    expires_at: float | None = None


@dataclass
class MemoryCluster:
    """The cluster's tables, in memory."""

    partitions: int
    clock: Callable[[], float]
    secret: bytes = b"\0" * 32
    leases: dict[int, _LeaseRow] = field(default_factory=dict)
    hosts: dict[str, tuple[float, str | None]] = field(default_factory=dict)  # seen, address
    images: dict[str, tuple[int, int, int, bytes]] = field(default_factory=dict)  # p, e, seq
    frames: dict[str, dict[int, tuple[int, int, bytes]]] = field(default_factory=dict)
    alarms: dict[str, tuple[int, float]] = field(default_factory=dict)  # partition, at
    #: Until when (on ``clock``) the store answers nothing: a failover in progress.
    down_until: float = -math.inf

    def __post_init__(self) -> None:
        check_partitions(self.partitions)
        self.leases = {p: _LeaseRow() for p in range(self.partitions)}

    def connect(self, host_id: str, clock: Callable[[], float]) -> MemoryStore:
        """One host's handle."""
        return MemoryStore(self, host_id, clock)

    def fail_over(self, seconds: float) -> None:
        """The primary is lost and a standby takes over in ``seconds``: until then no call
        runs; what was committed stays (a synchronous standby has all of it)."""
        self.down_until = max(self.down_until, self.clock() + seconds)

    def live(self, row: _LeaseRow) -> bool:
        return (
            row.owner is not None and row.expires_at is not None and row.expires_at > self.clock()
        )


class MemoryStore:
    """``ClusterStore``'s calls over a ``MemoryCluster``."""

    def __init__(self, cluster: MemoryCluster, host_id: str, clock: Callable[[], float]) -> None:
        if not host_id or len(host_id) > 200:
            raise ValueError("host_id must be 1 to 200 characters")
        self.cluster = cluster
        self.host_id = host_id
        self.partitions = cluster.partitions
        self.secret = cluster.secret
        self._clock = clock
        self.closed = False

    def close(self) -> None:
        self.closed = True

    def acquire(self, partition: int, ttl: float, margin: float) -> Lease | None:
        check_lease_times(ttl, margin)
        sent = self._clock()
        row = self.cluster.leases[partition]
        if row.owner is not None and self.cluster.live(row):
            return None
        row.owner, row.epoch, row.expires_at = (
            self.host_id,
            row.epoch + 1,
            self.cluster.clock() + ttl,
        )
        return Lease(partition, row.epoch, sent + ttl - margin)

    def renew(self, leases: Sequence[Lease], ttl: float, margin: float) -> list[Lease]:
        check_lease_times(ttl, margin)
        sent = self._clock()
        renewed = []
        for lease in leases:
            row = self.cluster.leases.get(lease.partition)
            if row is None or row.owner != self.host_id or row.epoch != lease.epoch:
                continue
            if not self.cluster.live(row):
                continue
            row.expires_at = self.cluster.clock() + ttl
            renewed.append(Lease(lease.partition, lease.epoch, sent + ttl - margin))
        return sorted(renewed, key=lease_partition)

    def heartbeat(self, ttl: float, address: str | None = None) -> int:
        now = self.cluster.clock()
        self.cluster.hosts[self.host_id] = (now, address)
        others = sum(
            1
            for h, (seen, _) in self.cluster.hosts.items()
            if h != self.host_id and seen > now - ttl
        )
        return others + 1

    def leave(self) -> None:
        self.cluster.hosts.pop(self.host_id, None)

    def free_partitions(self, limit: int) -> list[int]:
        if limit <= 0:
            return []
        offset = fnv1a64(self.host_id.encode()) % self.partitions
        free = [p for p, row in self.cluster.leases.items() if not self.cluster.live(row)]
        free.sort(key=lambda p: (p + offset) % self.partitions)
        return free[:limit]

    def release(self, leases: Sequence[Lease]) -> None:
        for lease in leases:
            row = self.cluster.leases.get(lease.partition)
            if row is not None and row.owner == self.host_id and row.epoch == lease.epoch:
                row.owner = row.expires_at = None

    def commit(self, writes: Sequence[Write], alarms: Sequence[AlarmChange] = ()) -> None:
        if not writes and not alarms:
            return
        epochs: dict[int, int] = {}
        for partition, epoch in [(w.partition, w.epoch) for w in writes] + [
            (a.partition, a.epoch) for a in alarms
        ]:
            if epochs.setdefault(partition, epoch) != epoch:
                raise ValueError(f"writes to partition {partition} under two epochs")
        moved = self.moved(epochs)
        if moved:
            raise Fenced(moved)
        frames = self.cluster.frames
        for w in writes:  # the primary key, as in PostgreSQL: nothing is written twice
            if w.seq in frames.get(w.address, {}):
                raise ValueError(f"{w.address}: batch {w.seq} is already committed")
        for w in writes:
            frames.setdefault(w.address, {})[w.seq] = (w.partition, w.epoch, w.data)
        for a in alarms:
            if a.at is None:
                self.cluster.alarms.pop(a.address, None)
            else:
                self.cluster.alarms[a.address] = (a.partition, float(a.at))

    def moved(self, epochs: dict[int, int]) -> list[int]:
        """The partitions of a commit (``partition: epoch`` of its writes) whose lease has a
        newer epoch: the fencing check, as the statement's epoch join in PostgreSQL."""
        return [p for p, e in epochs.items() if self.cluster.leases[p].epoch != e]

    def alarms_of(self, partitions: Sequence[int]) -> list[tuple[int, str, float]]:
        wanted = set(partitions)
        return [(p, a, at) for a, (p, at) in self.cluster.alarms.items() if p in wanted]

    def load(self, address: str) -> tuple[int, bytes, list[tuple[int, bytes]]]:
        found = self.cluster.images.get(address)
        seq, image = (0, b"") if found is None else (found[2], found[3])
        return seq, image, self.frames(address, after=seq)

    def compact(self, partition: int, epoch: int, address: str, seq: int, image: bytes) -> None:
        if self.cluster.leases[partition].epoch != epoch:
            raise Fenced([partition])
        current = self.cluster.images.get(address)
        if current is None or current[2] <= seq:
            self.cluster.images[address] = (partition, epoch, seq, image)
        batches = self.cluster.frames.get(address, {})
        for old in [s for s in batches if s <= seq]:
            del batches[old]

    def forget_actor(self, partition: int, epoch: int, address: str) -> None:
        if self.cluster.leases[partition].epoch != epoch:
            raise Fenced([partition])
        self.cluster.images.pop(address, None)
        self.cluster.frames.pop(address, None)
        self.cluster.alarms.pop(address, None)

    def frames(self, address: str, after: int = 0) -> list[tuple[int, bytes]]:
        batches = self.cluster.frames.get(address, {})
        return [(s, batches[s][2]) for s in sorted(batches) if s > after]

    def owners(self) -> dict[int, tuple[str, str | None]]:
        hosts = self.cluster.hosts
        return {
            p: (row.owner, hosts.get(row.owner, (0.0, None))[1])
            for p, row in self.cluster.leases.items()
            if row.owner is not None and self.cluster.live(row)
        }

    def lease_of(self, partition: int) -> tuple[str | None, int]:
        row = self.cluster.leases.get(partition)
        if row is None:
            raise ValueError(f"no partition {partition} (the cluster has {self.partitions})")
        return row.owner, row.epoch


@dataclass
class StoreLink:
    """One host's way to the simulated store, for ``ClusterStorage(..., run_store=link.run)``.

    Each call waits a delay drawn from ``latency`` (seconds, uniform) before it reaches the
    store and again before its reply does; while the store fails over, a call raises
    ``StoreUnreachable`` and does not run; a fraction ``lost_replies`` of the calls that ran
    raise ``ReplyLost`` instead of answering, and a fraction ``lost_requests`` of the calls
    raise ``RequestLost`` without running (the host cannot tell the two apart). Every draw
    comes from ``rng``.

    The host's side of the link: ``cut`` (the host cannot reach the store: each call fails
    after ``timeout``, without running), ``pause`` (the host is stopped: a call neither leaves
    nor hears its reply until ``resume``), ``kill`` (the host is dead: nothing it asks runs
    any more).
    """

    cluster: MemoryCluster
    rng: random.Random
    latency: tuple[float, float] = (0.0002, 0.002)
    lost_replies: float = 0.0
    lost_requests: float = 0.0
    timeout: float = 1.0
    calls: int = 0
    lost: int = 0
    cut: bool = False
    dead: bool = False
    _resumed: trio.Event | None = None

    def pause(self) -> None:
        if self._resumed is None:
            self._resumed = trio.Event()

    def resume(self) -> None:
        if self._resumed is not None:
            self._resumed.set()
            self._resumed = None

    def kill(self) -> None:
        self.dead = True
        self.resume()

    async def _unpaused(self) -> None:
        while self._resumed is not None:
            await self._resumed.wait()
        if self.dead:
            raise StoreUnreachable("this host is dead")

    async def run(self, fn: Callable[[], T]) -> T:
        self.calls += 1
        await self._unpaused()
        if self.cut:
            await trio.sleep(self.timeout)
            raise StoreUnreachable("this host cannot reach the cluster's store")
        await trio.sleep(self.rng.uniform(*self.latency))
        await self._unpaused()
        if self.cluster.clock() < self.cluster.down_until:
            raise StoreUnreachable("the cluster's store is failing over")
        if self.lost_requests and self.rng.random() < self.lost_requests:
            self.lost += 1
            raise RequestLost("the connection to the store dropped; the call did not run")
        result = fn()
        lose = self.rng.random() < self.lost_replies
        await trio.sleep(self.rng.uniform(*self.latency))
        await self._unpaused()
        if lose:
            self.lost += 1
            raise ReplyLost("the store's reply was lost; the call took effect")
        return result
