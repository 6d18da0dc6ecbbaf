"""The cluster's store on a real PostgreSQL (tests/pg.py): partitions, leases decided by
PostgreSQL's clock, epochs that grow at every takeover, and commits fenced by them. The checks
of what a store promises run against the simulator's in-memory model too (``sim/cluster/store.py``,
its clock moved by hand): the two must agree."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import psycopg
import pytest
import trio

from actorkeep.cluster import (
    ClusterMismatch,
    ClusterStore,
    Fenced,
    Write,
    create,
    partition_of,
)
from actorkeep.cluster.nonblocking import NonblockingCommits
from actorkeep.cluster.records import AlarmChange, Store
from actorkeep.cluster.store import COMMIT_FRAMES, COMMIT_ONE
from sim.cluster.store import MemoryCluster
from tests.pg import wait_for_a_lock_wait

TTL, MARGIN = 0.6, 0.2


def store(conninfo: str, host: str, clock: float | None = None) -> ClusterStore:
    return ClusterStore(conninfo, host, clock=time.monotonic if clock is None else lambda: clock)


@dataclass
class Backend:
    """A store to check: ``make(partitions)`` creates a cluster and gives the function that
    opens one host's handle (``open(host, clock=None)``: a host clock held at ``clock``, or
    running); ``wait(seconds)`` lets the store's own clock run."""

    make: Callable[[int], Callable[..., Store]]
    wait: Callable[[float], None]


class Nonblocking:
    """A ``ClusterStore`` whose commits go as a host's do (``NonblockingCommits``, each in a
    trio run of its own)."""

    def __init__(self, inner: ClusterStore) -> None:
        self._inner = inner
        self._commits = NonblockingCommits(inner.commits, trio.to_thread.run_sync)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def commit(self, writes: Sequence[Write], alarms: Sequence[AlarmChange] = ()) -> None:
        trio.run(self._commits.commit, writes, alarms)


@pytest.fixture(params=["postgres", "nonblocking", "memory"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    if request.param in ("postgres", "nonblocking"):
        conninfo = request.getfixturevalue("pg_conninfo")
        wrap = request.param == "nonblocking"

        def make_pg(partitions: int) -> Callable[..., Store]:
            create(conninfo, partitions)

            def open_(host: str, clock: float | None = None) -> Store:
                opened = store(conninfo, host, clock)
                return cast(Store, Nonblocking(opened)) if wrap else opened

            return open_

        yield Backend(make_pg, time.sleep)
        return
    now = [1000.0]

    def make_memory(partitions: int) -> Callable[..., Store]:
        cluster = MemoryCluster(partitions, clock=lambda: now[0])

        def open_(host: str, clock: float | None = None) -> Store:
            return cluster.connect(host, (lambda: now[0]) if clock is None else (lambda: clock))

        return open_

    def wait(seconds: float) -> None:
        now[0] += seconds

    yield Backend(make_memory, wait)


def test_partition_of_is_stable_and_in_range() -> None:
    assert partition_of("kv/shard-3", 1024) == partition_of("kv/shard-3", 1024)
    seen = {partition_of(f"counter/c{i}", 16) for i in range(1000)}
    assert seen == set(range(16))  # every partition gets actors
    with pytest.raises(ValueError):
        partition_of("no-slash", 16)


def test_create_is_idempotent_and_the_partition_count_fixed(pg_conninfo: str) -> None:
    create(pg_conninfo, 8)
    create(pg_conninfo, 8)
    with pytest.raises(ClusterMismatch, match="8 partitions, not 16"):
        create(pg_conninfo, 16)
    with pytest.raises(ValueError):
        create(pg_conninfo, 0)
    s = store(pg_conninfo, "a")
    assert s.partitions == 8
    assert [s.lease_of(p) for p in range(8)] == [(None, 0)] * 8
    s.close()


def test_a_store_needs_a_created_cluster(pg_conninfo: str) -> None:
    with pytest.raises(ClusterMismatch, match="no cluster"):
        store(pg_conninfo, "a")


def test_one_owner_until_the_lease_expires_by_postgres_clock(backend: Backend) -> None:
    open_ = backend.make(4)
    # The hosts' own clocks stand still: only PostgreSQL's clock decides expiry.
    a, b = open_("a", clock=100.0), open_("b", clock=5.0)
    lease = a.acquire(0, TTL, MARGIN)
    assert lease is not None and lease.epoch == 1
    assert lease.until == pytest.approx(100.0 + TTL - MARGIN)  # from before the request
    assert b.acquire(0, TTL, MARGIN) is None
    assert a.acquire(0, TTL, MARGIN) is None  # not even its owner takes it twice
    backend.wait(TTL + 0.1)
    taken = b.acquire(0, TTL, MARGIN)
    assert taken is not None and taken.epoch == 2
    assert a.renew([lease], TTL, MARGIN) == []  # lost: a must stop serving partition 0
    assert [x.epoch for x in b.renew([taken], TTL, MARGIN)] == [2]
    assert b.lease_of(0) == ("b", 2)
    a.close()
    b.close()


def test_a_fenced_owner_commits_nothing(backend: Backend) -> None:
    open_ = backend.make(4)
    a, b = open_("a"), open_("b")
    p = partition_of("counter/x", 4)
    old = a.acquire(p, TTL, MARGIN)
    assert old is not None
    a.commit([Write(p, old.epoch, "counter/x", 1, b"one")])
    backend.wait(TTL + 0.1)  # a is paused past its lease...
    new = b.acquire(p, TTL, MARGIN)
    assert new is not None and new.epoch == old.epoch + 1
    with pytest.raises(Fenced) as fenced:  # ...and wakes up to write: refused
        a.commit([Write(p, old.epoch, "counter/x", 2, b"stale")])
    assert fenced.value.partitions == [p]
    b.commit([Write(p, new.epoch, "counter/x", 2, b"two")])
    assert b.frames("counter/x") == [(1, b"one"), (2, b"two")]
    assert b.frames("counter/x", after=1) == [(2, b"two")]
    a.close()
    b.close()


def test_a_commit_is_all_or_nothing_across_partitions(backend: Backend) -> None:
    open_ = backend.make(2)
    a, b = open_("a"), open_("b")
    l0, l1 = a.acquire(0, TTL, MARGIN), a.acquire(1, TTL, MARGIN)
    assert l0 is not None and l1 is not None
    backend.wait(TTL + 0.1)
    assert a.renew([l0], TTL, MARGIN) == []  # expired; a renews nothing that lapsed
    assert b.acquire(1, TTL, MARGIN) is not None  # only partition 1 changes hands
    writes = [Write(0, l0.epoch, "c/zero", 1, b"0"), Write(1, l1.epoch, "c/one", 1, b"1")]
    with pytest.raises(Fenced) as fenced:
        a.commit(writes)
    assert fenced.value.partitions == [1]
    assert a.frames("c/zero") == [] and a.frames("c/one") == []
    with pytest.raises(ValueError, match="two epochs"):
        a.commit([Write(0, 1, "c/zero", 1, b""), Write(0, 2, "c/zero", 2, b"")])
    a.close()
    b.close()


def test_release_hands_a_partition_over_at_once(backend: Backend) -> None:
    open_ = backend.make(2)
    a, b = open_("a"), open_("b")
    lease = a.acquire(1, 30.0, 1.0)
    assert lease is not None and b.acquire(1, 30.0, 1.0) is None
    a.release([lease])
    taken = b.acquire(1, 30.0, 1.0)
    assert taken is not None and taken.epoch == lease.epoch + 1
    with pytest.raises(Fenced):
        a.commit([Write(1, lease.epoch, "c/x", 1, b"late")])
    a.close()
    b.close()


def test_bad_lease_arguments_are_refused(pg_conninfo: str) -> None:
    create(pg_conninfo, 2)
    a = store(pg_conninfo, "a")
    for ttl, margin in ((0.5, 0.5), (1.0, 0.0), (0.0, -1.0), (4000.0, 1.0)):
        with pytest.raises(ValueError):
            a.acquire(0, ttl, margin)
    assert a.lease_of(0) == (None, 0)  # nothing taken
    with pytest.raises(ValueError):
        ClusterStore(pg_conninfo, "", clock=time.monotonic)
    a.close()


@pytest.mark.parametrize("statement", ["COMMIT_FRAMES", "COMMIT_ONE"])
def test_a_takeover_waits_for_a_commit_in_flight(pg_conninfo: str, statement: str) -> None:
    """The check of a commit holds a share lock on the lease row to its end, so a takeover's
    epoch bump is ordered after the commit: the new owner sees every frame the old one made.
    The commit's very statement runs here in a transaction held open, as if the commit were
    still in flight. (Without ``FOR SHARE`` in it the takeover goes ahead at once.)"""
    create(pg_conninfo, 1)
    a, b = store(pg_conninfo, "a"), store(pg_conninfo, "b")
    lease = a.acquire(0, TTL, MARGIN)
    assert lease is not None
    time.sleep(TTL + 0.1)
    took: list[object] = []
    with psycopg.connect(pg_conninfo) as raw:
        if statement == "COMMIT_FRAMES":
            params: dict[str, object] = {
                "parts": [0], "epochs": [lease.epoch], "n": 1,
                "addresses": ["c/x"], "seqs": [1], "partitions": [0],
                "frame_epochs": [lease.epoch], "data": [b"in flight"],
                "put_addresses": [], "put_partitions": [], "put_at": [], "dropped": [],
            }  # fmt: skip
            query = COMMIT_FRAMES
        else:
            params = {"partition": 0, "epoch": lease.epoch, "address": "c/x", "seq": 1}
            params["data"] = b"in flight"
            query = COMMIT_ONE
        assert raw.execute(query, params).fetchone() == ([0],)
        thread = threading.Thread(target=lambda: took.append(b.acquire(0, TTL, MARGIN)))
        thread.start()
        thread.join(0.5)
        assert thread.is_alive() and not took  # the takeover waits for the commit...
        raw.commit()
    thread.join(10)
    assert took and took[0] is not None  # ...then goes ahead, and sees what it committed
    assert b.frames("c/x") == [(1, b"in flight")]
    a.close()
    b.close()


@pytest.mark.parametrize("method", ["renew", "release"])
def test_renewals_and_releases_lock_lease_rows_in_partition_order(
    pg_conninfo: str, method: str
) -> None:
    """A commit share-locks its partitions' lease rows in partition order, on a connection of
    its own; a renewal or a release on the other connection must lock its rows in the same
    order, or each could wait for a row the other holds. With partition 1 held by a commit in
    flight, a renewal of partitions 2, 0 and 1 waits at 1 holding 0 only: 2 is still free.
    (A plain UPDATE locks 2 first here: the list starts with it, and the table holds it first,
    as the lease rows were taken in that order.)"""
    create(pg_conninfo, 3)
    a = store(pg_conninfo, "a")
    leases = [a.acquire(p, 30.0, 1.0) for p in (2, 0, 1)]
    assert all(leases)
    done: list[object] = []
    call = {
        "renew": lambda: done.append(a.renew(leases, 30.0, 1.0)),  # type: ignore[arg-type]
        "release": lambda: done.append(a.release(leases)),  # type: ignore[arg-type]
    }[method]
    with (
        psycopg.connect(pg_conninfo) as commit,
        psycopg.connect(pg_conninfo, autocommit=True) as probe,
    ):
        params = {"partition": 1, "epoch": leases[2].epoch, "address": "c/x", "seq": 1}  # type: ignore[union-attr]
        assert commit.execute(COMMIT_ONE, {**params, "data": b"x"}).fetchone() == ([1],)
        thread = threading.Thread(target=call)
        thread.start()
        wait_for_a_lock_wait(probe)
        with probe.transaction():  # raises LockNotAvailable if 2 was locked before 1
            probe.execute(
                "SELECT partition FROM actorkeep_leases WHERE partition = 2 FOR UPDATE NOWAIT"
            )
        commit.commit()
    thread.join(10)
    assert done and not thread.is_alive()
    owners = [a.lease_of(p)[0] for p in range(3)]
    assert owners == (["a"] * 3 if method == "renew" else [None] * 3)
    a.close()


def test_a_commit_does_not_wait_behind_the_hosts_other_statements(pg_conninfo: str) -> None:
    """Commits have a connection of their own: while a heartbeat of the same store waits for a
    row lock (as a renewal, a load or a compaction's image can take a while), a commit still
    goes through at once."""
    create(pg_conninfo, 1)
    a = store(pg_conninfo, "a")
    lease = a.acquire(0, 30.0, 1.0)
    assert lease is not None
    a.heartbeat(30.0)
    beat = threading.Thread(target=lambda: a.heartbeat(30.0))
    with (
        psycopg.connect(pg_conninfo) as holder,
        psycopg.connect(pg_conninfo, autocommit=True) as probe,
    ):
        holder.execute("SELECT 1 FROM actorkeep_hosts WHERE host_id = 'a' FOR UPDATE")
        beat.start()
        wait_for_a_lock_wait(probe)  # the heartbeat waits for the row...
        committed = threading.Thread(
            target=lambda: a.commit([Write(0, lease.epoch, "c/x", 1, b"one")])
        )
        committed.start()
        committed.join(5)
        assert not committed.is_alive()  # ...and the commit does not wait for the heartbeat
        assert beat.is_alive()
        holder.commit()
    beat.join(10)
    assert a.frames("c/x") == [(1, b"one")]
    a.close()


def test_alarm_changes_commit_with_their_frames_or_not_at_all(backend: Backend) -> None:
    open_ = backend.make(2)
    a, b = open_("a"), open_("b")
    lease = a.acquire(0, TTL, MARGIN)
    assert lease is not None
    e = lease.epoch
    a.commit([Write(0, e, "c/x", 1, b"f")], [AlarmChange(0, e, "c/x", 5.0)])
    assert a.alarms_of([0]) == [(0, "c/x", 5.0)] and a.alarms_of([1]) == []
    a.commit([], [AlarmChange(0, e, "c/x", 7.5), AlarmChange(0, e, "c/y", 1)])
    assert sorted(a.alarms_of([0, 1])) == [(0, "c/x", 7.5), (0, "c/y", 1.0)]
    a.commit([], [AlarmChange(0, e, "c/y", None)])
    assert a.alarms_of([0]) == [(0, "c/x", 7.5)]
    backend.wait(TTL + 0.1)
    assert b.acquire(0, TTL, MARGIN) is not None
    with pytest.raises(Fenced):  # the old owner's change and frames fail together
        a.commit([Write(0, e, "c/x", 2, b"g")], [AlarmChange(0, e, "c/x", None)])
    assert b.alarms_of([0]) == [(0, "c/x", 7.5)] and b.frames("c/x") == [(1, b"f")]
    a.close()
    b.close()


def test_images_and_batches_load_in_one_snapshot(backend: Backend) -> None:
    open_ = backend.make(2)
    a = open_("a")
    lease = a.acquire(1, 30.0, 1.0)
    assert lease is not None
    e = lease.epoch
    a.compact(1, e, "c/z", 0, b"image0")
    for seq in (1, 2, 3):
        a.commit([Write(1, e, "c/z", seq, bytes([seq]))])
    assert a.load("c/z") == (0, b"image0", [(1, b"\x01"), (2, b"\x02"), (3, b"\x03")])
    a.compact(1, e, "c/z", 2, b"image2")  # folds batches 1 and 2
    assert a.load("c/z") == (2, b"image2", [(3, b"\x03")])
    a.compact(1, e, "c/z", 1, b"older")  # an older image never replaces a newer one
    assert a.load("c/z") == (2, b"image2", [(3, b"\x03")])
    a.heartbeat(30.0, "10.0.0.1:9000")
    assert a.owners() == {1: ("a", "10.0.0.1:9000")}
    a.release([lease])
    assert a.owners() == {} and set(a.free_partitions(5)) == {0, 1}
    a.close()


def test_a_link_replaces_a_connection_the_server_ended_but_never_within_a_use(
    pg_conninfo: str,
) -> None:
    """A connection the server ended while it was idle is replaced at the next use, before a
    statement fails on it; a use inside another one gets the same connection, so the
    statements of one transaction never move to a new one."""
    from actorkeep.cluster.connections import Link

    link = Link(pg_conninfo, "test")
    with psycopg.connect(pg_conninfo, autocommit=True) as admin:
        with link.use() as conn:
            pid = conn.info.backend_pid
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            time.sleep(0.2)  # the server's goodbye reaches the socket
            with link.use() as inner:
                assert inner is conn  # not replaced within a use
        with link.use() as conn:  # the next use: a new connection, which works
            assert conn.info.backend_pid != pid
            assert conn.execute("SELECT 1").fetchone() == (1,)
    link.close()
    with pytest.raises(psycopg.OperationalError), link.use():
        pass
