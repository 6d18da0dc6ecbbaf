"""One host's leases: which partitions it serves, kept by renewing them, shared out fairly
among the live hosts (decision 0016).

Each ``tick()`` (the host calls it every ``ttl / 3`` seconds, from a sync thread: the store
blocks) renews what the host holds and records that it is alive; then, from what PostgreSQL says
of the live hosts, the host keeps its fair share: it takes free or expired partitions below
it, and hands over those above it (another host takes them once they are released). A hand-over
takes two steps: the partition is first marked leaving (``accepts`` says no: no new event
starts on it, while what runs still finishes under the lease, which is renewed), and released at
a later tick once the host says it is done with it (``handed``: no work in flight, open
actors shipped), or after ``HANDOVER_LIMIT`` TTLs all the same. ``lease_for`` is what the host
asks before it lets an event's outputs out: a lease good by its own clock, or None; and
``owner_of`` where to send an event for a partition held elsewhere (the owners as PostgreSQL had
them at the last tick, or at the last ``refresh_owners``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from .records import Lease, Store

#: A partition being handed over is released after this many TTLs even with work in flight.
HANDOVER_LIMIT = 2.0


@dataclass(frozen=True)
class LeaseSettings:
    """``ttl``: how long a lease lasts by PostgreSQL's clock once taken or renewed. ``margin``:
    how much earlier the host stops serving by its own clock (it must cover the clocks'
    drift over ``ttl`` and the time an answer takes to leave)."""

    ttl: float = 3.0
    margin: float = 1.0

    def __post_init__(self) -> None:
        if not 0 < self.margin < self.ttl / 2:
            raise ValueError(f"need 0 < margin < ttl / 2, not ttl={self.ttl}, margin={self.margin}")

    @property
    def every(self) -> float:
        """How often to tick: three renewals per lease, so one late tick loses nothing."""
        return self.ttl / 3


class LeaseKeeper:
    """The leases of one host, over its store (``ClusterStore``, or the simulator's)."""

    def __init__(self, store: Store, settings: LeaseSettings, clock: Callable[[], float]) -> None:
        self._store = store
        self.settings = settings
        self._clock = clock
        self._held: dict[int, Lease] = {}
        self._leaving: dict[int, float] = {}  # partition -> when it began leaving (own clock)
        self._handed: frozenset[int] = frozenset()  # leaving partitions the host is done with
        self._work: dict[int, int] = {}  # partition -> events and commits in flight
        self._owners: dict[int, tuple[str, str | None]] = {}
        #: This host's internal port (``host:port``) as the others reach it; None: none yet.
        self.address: str | None = None

    @property
    def held(self) -> dict[int, Lease]:
        """The leases held after the last tick, by partition."""
        return dict(self._held)

    def lease_for(self, partition: int) -> Lease | None:
        """The lease to serve ``partition`` under, if this host holds one still good by its
        own clock."""
        lease = self._held.get(partition)
        return lease if lease is not None and self._clock() < lease.until else None

    def last(self, partition: int) -> Lease | None:
        """The lease on ``partition`` from the last tick, whether or not it is still good by
        this host's clock (a renewal may be late)."""
        return self._held.get(partition)

    def accepts(self, partition: int) -> Lease | None:
        """The lease to start new work on ``partition`` under: ``lease_for``, unless the
        partition is being handed over."""
        return None if partition in self._leaving else self.lease_for(partition)

    @property
    def leaving(self) -> frozenset[int]:
        """The partitions being handed over (still held, taking no new work)."""
        return frozenset(self._leaving)

    def working(self, partition: int, delta: int) -> None:
        """An event or a commit of ``partition`` begins (+1) or ends (-1) on this host."""
        n = self._work.get(partition, 0) + delta
        if n:
            self._work[partition] = n
        else:
            del self._work[partition]

    def idle(self, partition: int) -> bool:
        """Whether no event or commit of ``partition`` is in flight on this host."""
        return partition not in self._work

    def handed(self, partitions: frozenset[int]) -> None:
        """The host is done with these leaving partitions: the next tick releases them."""
        self._handed = partitions

    def lapsed(self, partition: int) -> bool:
        """Whether this host still holds ``partition`` from its last tick but its own clock
        says the lease ran out: a renewal that comes late, or never (the store unreachable)."""
        lease = self._held.get(partition)
        return lease is not None and self._clock() >= lease.until

    def remaining(self, partition: int) -> float:
        """Seconds left, by this host's clock, of its lease on ``partition`` (0 if none)."""
        lease = self._held.get(partition)
        return 0.0 if lease is None else max(0.0, lease.until - self._clock())

    def owner_of(self, partition: int) -> str | None:
        """The internal address of the other host that owns ``partition``, as last read; None
        if nobody does, this host does, or the owner gave no address."""
        owner = self._owners.get(partition)
        if owner is None or owner[0] == self._store.host_id:
            return None
        return owner[1]

    def refresh_owners(self) -> None:
        """Read the owners again (an event went to a host that no longer owns its partition)."""
        self._owners = self._store.owners()

    def tick(self) -> None:
        """Renew, say this host is alive, then give up or take partitions toward the share;
        read who owns the rest."""
        s = self.settings
        renewed = self._store.renew(list(self._held.values()), s.ttl, s.margin)
        held = {lease.partition: lease for lease in renewed}
        now = self._clock()
        leaving = {p: since for p, since in self._leaving.items() if p in held}
        done = [
            p
            for p, since in leaving.items()
            if p in self._handed or now - since >= HANDOVER_LIMIT * s.ttl
        ]
        if done:
            self._store.release([held[p] for p in done])
            for p in done:
                del held[p], leaving[p]
        self._held, self._leaving = held, leaving
        live = self._store.heartbeat(s.ttl, self.address)
        share = math.ceil(self._store.partitions / max(1, live))
        staying = [p for p in sorted(held) if p not in leaving]
        if len(staying) > share:
            self._leaving = {**leaving, **dict.fromkeys(staying[share:], now)}
        elif leaving and len(staying) < share:  # a host went meanwhile: keep some after all
            back = sorted(leaving)[: share - len(staying)]
            self._leaving = {p: since for p, since in leaving.items() if p not in back}
        elif len(held) < share:
            for partition in self._store.free_partitions(share - len(held)):
                lease = self._store.acquire(partition, s.ttl, s.margin)
                if lease is not None:
                    self._held[partition] = lease
        self._owners = self._store.owners()

    def release_all(self) -> None:
        """A planned shutdown: every partition goes at once, to whoever takes it next."""
        self._store.release(list(self._held.values()))
        self._held, self._leaving = {}, {}
        self._store.leave()
