"""A host's leases (actorkeep/cluster/keeper.py) on a real PostgreSQL and on the simulator's
in-memory store (sim/cluster/store.py): a fair share among the live hosts, partitions handed
over when a host joins or leaves, taken over when one dies, and served only while the host's
own clock says the lease holds."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from actorkeep.cluster import ClusterStore, LeaseKeeper, LeaseSettings, create
from actorkeep.cluster.keeper import HANDOVER_LIMIT
from actorkeep.cluster.records import Store
from sim.cluster.store import MemoryCluster

SETTINGS = LeaseSettings(ttl=0.6, margin=0.2)
PARTITIONS = 8


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Stores:
    """``make(partitions)`` creates a cluster; ``keeper(host, clock=None)`` opens a host's
    keeper on it; ``wait(seconds)`` lets the store's clock run."""

    def __init__(
        self, open_store: Callable[[int, str, Clock], Store], wait: Callable[[float], None]
    ) -> None:
        self._open_store = open_store
        self.wait = wait
        self.partitions = 0

    def make(self, partitions: int) -> None:
        self.partitions = partitions

    def keeper(self, host: str, clock: Clock | None = None) -> LeaseKeeper:
        c = clock or Clock()
        return LeaseKeeper(self._open_store(self.partitions, host, c), SETTINGS, c)


@pytest.fixture(params=["postgres", "memory"])
def stores(request: pytest.FixtureRequest) -> Iterator[Stores]:
    if request.param == "postgres":
        conninfo = request.getfixturevalue("pg_conninfo")
        created: set[int] = set()

        def open_pg(partitions: int, host: str, clock: Clock) -> Store:
            if partitions not in created:
                create(conninfo, partitions)
                created.add(partitions)
            return ClusterStore(conninfo, host, clock=clock)

        yield Stores(open_pg, time.sleep)
        return
    now = [1000.0]
    clusters: dict[int, MemoryCluster] = {}

    def open_memory(partitions: int, host: str, clock: Clock) -> Store:
        cluster = clusters.setdefault(partitions, MemoryCluster(partitions, lambda: now[0]))
        return cluster.connect(host, clock)

    def wait(seconds: float) -> None:
        now[0] += seconds

    yield Stores(open_memory, wait)


def test_one_host_takes_every_partition(stores: Stores) -> None:
    stores.make(PARTITIONS)
    a = stores.keeper("a")
    a.tick()
    assert sorted(a.held) == list(range(PARTITIONS))
    assert all(lease.epoch == 1 for lease in a.held.values())


def test_a_host_that_joins_gets_its_share_from_the_others(stores: Stores) -> None:
    stores.make(PARTITIONS)
    a, b = stores.keeper("a"), stores.keeper("b")
    a.tick()
    b.tick()  # alive now, but every partition is a's
    assert b.held == {}
    a.tick()  # two live hosts: a hands over what is above its share...
    leaving = a.leaving
    assert len(leaving) == PARTITIONS // 2 and len(a.held) == PARTITIONS
    assert all(a.accepts(p) is None and a.lease_for(p) is not None for p in leaving)
    a.tick()  # ...held until the host is done with them (work in flight finishes)...
    assert a.leaving == leaving and len(a.held) == PARTITIONS
    a.handed(leaving)
    a.tick()  # ...then released...
    assert len(a.held) == PARTITIONS // 2 and a.leaving == frozenset()
    b.tick()  # ...and b takes them
    assert sorted(b.held) == sorted(leaving)
    assert set(a.held).isdisjoint(b.held)
    assert all(lease.epoch == 2 for lease in b.held.values())  # each taken over once


def handing_over(stores: Stores, clock: Clock | None = None) -> tuple[LeaseKeeper, LeaseKeeper]:
    """Host a holds every partition, b joins: after a's next tick, half of them are leaving."""
    stores.make(PARTITIONS)
    a, b = stores.keeper("a", clock), stores.keeper("b")
    a.tick()
    b.tick()
    a.tick()
    assert len(a.leaving) == PARTITIONS // 2
    return a, b


def test_a_partition_handed_over_is_released_after_the_limit_all_the_same(
    stores: Stores,
) -> None:
    clock = Clock()
    a, b = handing_over(stores, clock)
    leaving = a.leaving
    busy = min(leaving)
    a.working(busy, +1)  # an event that never ends
    a.handed(leaving - {busy})  # the host is done with the others
    a.tick()
    assert sorted(a.held) == sorted(set(range(PARTITIONS)) - leaving | {busy})
    ticks = 0
    while busy in a.held and ticks < 20:
        stores.wait(SETTINGS.every)
        clock.now += SETTINGS.every
        a.tick()
        b.tick()
        ticks += 1
    assert ticks == round(HANDOVER_LIMIT * 3)  # every ``ttl / 3``: the limit, in ticks
    assert len(a.held) == PARTITIONS // 2


def test_a_partition_handed_over_stays_if_the_share_grows_back(stores: Stores) -> None:
    a, b = handing_over(stores)
    b.release_all()  # b leaves before taking anything
    a.tick()
    assert a.leaving == frozenset() and len(a.held) == PARTITIONS


def test_the_partitions_of_a_host_that_dies_are_taken_once_its_leases_expire(
    stores: Stores,
) -> None:
    stores.make(PARTITIONS)
    a, b = stores.keeper("a"), stores.keeper("b")
    for k in (a, b, a, b):
        k.tick()
    theirs = {p: lease.epoch for p, lease in a.held.items()}
    stores.wait(0.2)
    b.tick()  # a is still alive by PostgreSQL's clock: b takes nothing of it
    assert set(b.held).isdisjoint(theirs)
    stores.wait(SETTINGS.ttl + 0.1)  # a stopped ticking: killed, or cut off
    b.tick()
    assert sorted(b.held) == list(range(PARTITIONS))
    assert all(b.held[p].epoch == epoch + 1 for p, epoch in theirs.items())  # fenced


def test_a_lease_is_served_only_while_the_host_s_own_clock_says_it_holds(
    stores: Stores,
) -> None:
    stores.make(2)
    clock = Clock()
    a = stores.keeper("a", clock)
    a.tick()
    assert a.lease_for(0) is not None and a.lease_for(5) is None
    clock.now += SETTINGS.ttl - SETTINGS.margin  # paused through its lease, less the margin
    assert a.lease_for(0) is None  # stops serving before anyone may take over
    a.tick()  # renewed in time (by PostgreSQL's clock)
    assert a.lease_for(0) is not None


def test_a_planned_stop_hands_every_partition_over_at_once(stores: Stores) -> None:
    stores.make(PARTITIONS)
    a, b = stores.keeper("a"), stores.keeper("b")
    a.tick()
    b.tick()
    a.release_all()
    b.tick()  # no wait for expiry
    assert sorted(b.held) == list(range(PARTITIONS)) and a.held == {}


def test_lease_settings_are_checked() -> None:
    for ttl, margin in ((6.0, 3.0), (6.0, 0.0), (1.0, 2.0)):
        with pytest.raises(ValueError):
            LeaseSettings(ttl=ttl, margin=margin)
    assert LeaseSettings().every == 1.0
