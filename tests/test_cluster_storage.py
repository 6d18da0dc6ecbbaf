"""Hosts on the cluster's storage backend (actorkeep/cluster/backend.py) over a real
PostgreSQL: durable KV puts acknowledged on one host are read on another after a handover or a
takeover, and a host that has lost its partitions acknowledges nothing more."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import outcome
import pytest
import trio

import actorkeep as ak
import shards
from actorkeep.cluster import ClusterStore, LeaseKeeper, LeaseSettings, create
from actorkeep.cluster.backend import ClusterStorage, NotServedHere
from actorkeep.cluster.committer import Committer, Ticket
from actorkeep.cluster.records import AlarmChange, Write
from actorkeep.cluster.router import ClusterRouter
from actorkeep.errors import OutcomeUnknown
from actorkeep.runtime.gate import Gate
from actorkeep.testing import open_host
from tests.pg import wait_for_a_lock_wait

SETTINGS = LeaseSettings(ttl=0.6, margin=0.2)
app = ak.App()
app.mount(shards.KVShard, "kv")
kv = ak.kv.Client("kv", shards=4)


@app.actor("w")
class Writer(ak.Actor):
    @ak.rpc
    async def put(self, key: str, value: str) -> int:
        return await kv.put(key, value.encode())

    @ak.rpc
    async def put_error(self, key: str, value: str) -> str | None:
        """The kind of error a durable put raised here, if any."""
        try:
            await kv.put(key, value.encode())
        except ak.RemoteError as exc:
            return f"{type(exc).__name__}: {exc}"
        return None

    @ak.rpc
    async def put_plain(self, key: str, value: str) -> int:
        return await kv.put(key, value.encode(), local=True)

    @ak.rpc
    async def slow_get(self, key: str, seconds: float) -> str | None:
        await trio.sleep(seconds)
        return await self.get(key)

    @ak.rpc
    async def get(self, key: str) -> str | None:
        entry = await kv.get(key)
        return None if entry is None else entry.value.decode()


def cluster_storage(
    conninfo: str, root: Path, host: str, clock: Callable[[], float] = time.monotonic
) -> ClusterStorage:
    store = ClusterStore(conninfo, host, clock=clock)
    return ClusterStorage(root, store, LeaseKeeper(store, SETTINGS, clock))


async def serving_all(storage: ClusterStorage, deadline: float = 10.0) -> None:
    """Until the host holds every partition (its keeper ticks on its own: poll it)."""
    for _ in range(int(deadline / 0.05)):
        if len(storage.keeper.held) == storage.store.partitions:
            return
        await trio.sleep(0.05)
    raise AssertionError(f"holds {sorted(storage.keeper.held)} after {deadline} s")


async def call(t: Any, method: str, deadline: float = 10.0, **args: Any) -> Any:
    """``w/w``'s ``method``; retried while the host answers 503 (a partition not served yet)."""
    end = trio.current_time() + deadline
    while True:
        resp = await t.request("POST", f"/w/w/_rpc/{method}", json=args)
        if resp.status != 503 or trio.current_time() > end:
            return resp
        await trio.sleep(0.05)


async def test_what_one_host_acknowledged_another_restores(
    pg_conninfo: str, tmp_path: Path
) -> None:
    create(pg_conninfo, 8)
    a = cluster_storage(pg_conninfo, tmp_path / "a", "a")
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        async with open_host(app, storage=a) as t:
            for i in range(20):
                resp = await call(t, "put", key=f"k{i}", value=f"v{i}")
                assert resp.status == 200, resp.body
        nursery.cancel_scope.cancel()  # a planned stop: its partitions are handed over
    b = cluster_storage(pg_conninfo, tmp_path / "b", "b")  # another host, its own empty disk
    async with trio.open_nursery() as nursery:
        await nursery.start(b.run)
        assert len(b.keeper.held) == 8  # at its first tick: a handed everything over
        async with open_host(app, storage=b) as t:
            for i in range(20):
                resp = await call(t, "get", key=f"k{i}")
                assert resp.status == 200 and resp.json() == f"v{i}", resp.body
            resp = await call(t, "put", key="k0", value="again")  # and writes on from there
            assert resp.status == 200
        nursery.cancel_scope.cancel()
    assert not list((tmp_path / "b" / "actors").rglob("shard-*.sqlite-wal"))  # closed cleanly


async def test_an_actors_batches_are_folded_into_its_image_as_they_grow(
    pg_conninfo: str, tmp_path: Path
) -> None:
    """Past ``compact_after`` batches since its image, the owner folds them into a new image
    in the background, and again at once if as many were committed while it folded: what the
    store holds of a busy actor stays an image and a few batches, and a restore from it on
    another host reads every acknowledged write."""
    import psycopg

    def held() -> tuple[int, int]:
        with psycopg.connect(pg_conninfo) as conn:
            row = conn.execute(
                "SELECT i.seq, (SELECT count(*) FROM actorkeep_frames f WHERE f.address = "
                "i.address) FROM actorkeep_images i WHERE i.address = %s",
                (kv.address_of("k"),),
            ).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    create(pg_conninfo, 8)
    a = cluster_storage(pg_conninfo, tmp_path / "a", "a")
    a.compact_after = 5
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        async with open_host(app, storage=a) as t:
            for i in range(40):
                assert (await call(t, "put", key="k", value=f"v{i}")).status == 200
            await a.settle()
            for _ in range(1000):  # until the last folds end (10 s at most)
                found = await trio.to_thread.run_sync(held)
                if found[1] < a.compact_after:
                    break
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    image_seq, frames = found
    assert image_seq >= 36 and frames < a.compact_after, found
    b = cluster_storage(pg_conninfo, tmp_path / "b", "b")
    async with trio.open_nursery() as nursery:
        await nursery.start(b.run)
        async with open_host(app, storage=b) as t:
            assert (await call(t, "get", key="k")).json() == "v39"
        nursery.cancel_scope.cancel()


async def test_batches_committed_while_a_fold_writes_are_folded_without_another_write(
    pg_conninfo: str, tmp_path: Path
) -> None:
    """A fold reads an actor's batches, then writes the new image; batches committed in
    between stay counted, and once as many as ``compact_after`` are left, the owner folds again
    at once, rather than at the actor's next write (which may never come)."""
    import threading

    create(pg_conninfo, 8)
    a = cluster_storage(pg_conninfo, tmp_path / "a", "a")
    a.compact_after = 3
    store = a.store
    assert isinstance(store, ClusterStore)
    real = store.compact
    folding, go = threading.Event(), threading.Event()

    def held_up(partition: int, epoch: int, address: str, seq: int, image: bytes) -> None:
        if seq > 0 and not go.is_set():  # a fold's image (not an actor's first one)
            folding.set()
            go.wait(10)
        real(partition, epoch, address, seq, image)

    store.compact = held_up  # type: ignore[method-assign]
    shard = kv.address_of("k")
    frames: list[tuple[int, bytes]] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        async with open_host(app, storage=a) as t:
            for i in range(3):  # the third batch starts a fold, held before it writes
                assert (await call(t, "put", key="k", value=f"v{i}")).status == 200
            assert await trio.to_thread.run_sync(folding.wait, 10)
            for i in range(3, 7):  # four more while it is held: counted, not in its image
                assert (await call(t, "put", key="k", value=f"v{i}")).status == 200
            go.set()
            for _ in range(300):  # 3 s at most
                frames = await trio.to_thread.run_sync(store.frames, shard)
                if not frames:
                    break
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert frames == [], [seq for seq, _ in frames]


async def test_a_host_whose_partitions_were_taken_acknowledges_nothing(
    pg_conninfo: str, tmp_path: Path
) -> None:
    """Host a's clock stands still, so it believes its leases hold for ever; it stops ticking
    (paused, cut off), b takes its partitions over once they expire, and a's next durable put is
    fenced: refused, and not in what b reads."""
    create(pg_conninfo, 8)
    frozen = 1000.0
    a = cluster_storage(pg_conninfo, tmp_path / "a", "a", clock=lambda: frozen)
    b = cluster_storage(pg_conninfo, tmp_path / "b", "b")
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        async with open_host(app, storage=a) as ta:
            assert (await call(ta, "put", key="x", value="1")).status == 200
            a.keeper.tick = lambda: None  # type: ignore[method-assign]  # a stops renewing
            await trio.sleep(SETTINGS.ttl + SETTINGS.every + 0.1)
            await nursery.start(b.run)
            await serving_all(b)
            async with open_host(app, storage=b) as tb:
                assert (await call(tb, "get", key="x")).json() == "1"
                stale = await call(ta, "put", key="x", value="2")
                assert stale.status != 200  # fenced: never acknowledged
                assert (await call(tb, "get", key="x")).json() == "1"
        nursery.cancel_scope.cancel()


async def test_a_plain_write_survives_its_actor_leaving_memory(
    pg_conninfo: str, tmp_path: Path
) -> None:
    """Its frames were never shipped by a sync: the close ships them, so the plain write is
    read back after the shard left memory (and by the next owner after a planned stop), as on
    a single host."""
    create(pg_conninfo, 8)
    a = cluster_storage(pg_conninfo, tmp_path / "a", "a")
    durable, plain = "d0", next(k for k in (f"p{i}" for i in range(100)) if same_shard(k, "d0"))
    others = [k for k in (f"o{i}" for i in range(100)) if not same_shard(k, "d0")][:6]
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        async with open_host(app, storage=a, max_active=2) as t:
            assert (await call(t, "put", key=durable, value="kept")).status == 200
            assert (await call(t, "put_plain", key=plain, value="also kept")).status == 200
            for key in others:  # the shard leaves memory
                assert (await call(t, "get", key=key)).status == 200
            assert (await call(t, "get", key=durable)).json() == "kept"
            assert (await call(t, "get", key=plain)).json() == "also kept"
            assert (await call(t, "put_plain", key=plain, value="at the stop")).status == 200
        await a.settle()
        nursery.cancel_scope.cancel()
    b = cluster_storage(pg_conninfo, tmp_path / "b", "b")
    async with trio.open_nursery() as nursery:
        await nursery.start(b.run)
        async with open_host(app, storage=b) as t:
            assert (await call(t, "get", key=plain)).json() == "at the stop"
        nursery.cancel_scope.cancel()


def same_shard(a: str, b: str) -> bool:
    return kv.address_of(a) == kv.address_of(b)


class Clock:
    """A host's monotonic clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_no_answer_leaves_a_host_once_its_lease_ran_out_by_its_clock(
    pg_conninfo: str, tmp_path: Path
) -> None:
    """The cluster's router checks the partition's lease before the event and before the
    reply: an actor in memory stops answering the moment the lease runs out by the host's own
    clock, reads included, and an event that was running when it ran out gets no answer out."""
    create(pg_conninfo, 8)
    clock = Clock()
    a = cluster_storage(pg_conninfo, tmp_path / "a", "a", clock=clock)
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        async with open_host(app, storage=a, router=lambda host: ClusterRouter(host, a)) as t:
            assert (await call(t, "put", key="k", value="v")).status == 200
            assert (await call(t, "get", key="k")).json() == "v"  # in memory now
            a.keeper.tick = lambda: None  # type: ignore[method-assign]  # no more renewals
            answers: list[Any] = []

            async def slow() -> None:
                answers.append(
                    await t.request("POST", "/w/w/_rpc/slow_get", json={"key": "k", "seconds": 0.3})
                )

            async with trio.open_nursery() as inner:
                inner.start_soon(slow)
                await trio.sleep(0.1)  # the event runs...
                clock.now += SETTINGS.ttl  # ...when the lease runs out by this host's clock
            assert answers[0].status == 503  # its reply does not leave
            resp = await t.request("POST", "/w/w/_rpc/get", json={"key": "k"})
            assert resp.status == 503 and resp.headers["retry-after"] == "1"
        nursery.cancel_scope.cancel()


async def test_an_actor_in_memory_when_its_partition_left_and_came_back_is_restored(
    pg_conninfo: str, tmp_path: Path
) -> None:
    """Host a keeps an actor in memory; its partitions go to b, which writes, then come back
    to a under a newer epoch. a must not answer from what it held: the router sees the actor
    was opened under an older epoch, takes it out of memory, and its next open restores b's
    write from the store."""
    create(pg_conninfo, 8)
    a = cluster_storage(pg_conninfo, tmp_path / "a", "a")
    b = cluster_storage(pg_conninfo, tmp_path / "b", "b")
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        async with open_host(app, storage=a, router=lambda h: ClusterRouter(h, a)) as ta:
            assert (await call(ta, "put", key="x", value="from a")).status == 200
            assert (await call(ta, "get", key="x")).json() == "from a"  # in memory on a
            ticking = a.keeper.tick
            a.keeper.tick = lambda: None  # type: ignore[method-assign]
            a.keeper.release_all()  # a hands everything over...
            await nursery.start(b.run)
            await serving_all(b)
            async with open_host(app, storage=b) as tb:  # ...b writes...
                assert (await call(tb, "put", key="x", value="from b")).status == 200
            b.keeper.tick = lambda: None  # type: ignore[method-assign]
            b.keeper.release_all()  # ...and hands everything back
            a.keeper.tick = ticking  # type: ignore[method-assign]
            await serving_all(a)
            assert (await call(ta, "get", key="x")).json() == "from b"
        nursery.cancel_scope.cancel()


async def test_a_host_serves_again_after_postgres_restarts(
    pg_conninfo: str, postgres: Any, tmp_path: Path
) -> None:
    """PostgreSQL restarts under a running host: its leases run out meanwhile (503), then its
    store connects again, takes its partitions back under new epochs, and serves what was
    acknowledged before, restored from the store."""
    create(pg_conninfo, 8)
    a = cluster_storage(pg_conninfo, tmp_path / "a", "a")
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        async with open_host(app, storage=a, router=lambda h: ClusterRouter(h, a)) as t:
            assert (await call(t, "put", key="x", value="before")).status == 200
            await trio.to_thread.run_sync(postgres.stop, "fast")
            await trio.sleep(SETTINGS.ttl)  # the leases run out by the host's clock
            assert (await t.request("POST", "/w/w/_rpc/get", json={"key": "x"})).status == 503
            await trio.to_thread.run_sync(postgres.start)
            await serving_all(a)
            assert (await call(t, "get", key="x")).json() == "before"
            assert (await call(t, "put", key="x", value="after")).status == 200
            assert (await call(t, "get", key="x")).json() == "after"
        nursery.cancel_scope.cancel()


async def opened(storage: ClusterStorage, name: str) -> Any:
    """The database of ``counter/<name>`` as the host opens it: ``ready()``, then
    ``open_actor``, with a table to write to."""
    await storage.ready("counter", name)
    db = storage.open_actor("counter", name)
    db.conn.execute("CREATE TABLE IF NOT EXISTS t (x INTEGER)")
    return db


def through(
    committer: Committer, nursery: trio.Nursery, commit: Callable[[Any], Awaitable[None]]
) -> Callable[[Any], Ticket]:
    """A ``Committer.submit`` whose writes go through ``commit`` instead (to fail or delay
    them); put it in place with ``committer.submit = through(...)``."""

    def submit(write: Any) -> Ticket:
        ticket = Ticket()

        async def run() -> None:
            try:
                await commit(write)
                ticket.box.append(outcome.Value(None))
            except Exception as exc:
                ticket.box.append(outcome.Error(exc))
            finally:
                ticket.done.set()

        nursery.start_soon(run)
        return ticket

    return submit


async def test_after_a_failed_sync_a_database_syncs_no_more(
    pg_conninfo: str, tmp_path: Path
) -> None:
    """A sync that failed may have left a batch out of the store: no later batch may land on
    top of that hole. Every later sync of the database refuses; its next open restores what
    the store has."""
    create(pg_conninfo, 8)
    a = cluster_storage(pg_conninfo, tmp_path / "a", "a")
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        db = await opened(a, "c")
        db.conn.execute("INSERT INTO t VALUES (1)")
        await db.sync()
        real = a.committer.submit

        async def failing(write: Any) -> None:
            raise OSError("injected: the store did not answer")

        a.committer.submit = through(a.committer, nursery, failing)  # type: ignore[method-assign,assignment]
        db.conn.execute("INSERT INTO t VALUES (2)")
        with pytest.raises(OutcomeUnknown, match="may be durable") as failed:
            await db.checkpoint()  # a sync outside the gate, as a checkpoint makes
        assert "injected" in str(failed.value.__cause__)  # the store's error: it may have run
        a.committer.submit = real  # type: ignore[method-assign]
        db.conn.execute("INSERT INTO t VALUES (3)")
        with pytest.raises(NotServedHere):
            await db.sync()  # the store works again, but this database is done
        db.close()
        again = await opened(a, "c")
        assert again.conn.execute("SELECT x FROM t").fetchall() == [(1,)]
        again.close()
        nursery.cancel_scope.cancel()


async def test_the_next_open_waits_for_the_commit_of_a_closed_database(
    pg_conninfo: str, tmp_path: Path
) -> None:
    """An actor evicted while its last sync is still committing: its next open restores only
    once that commit has ended, so the restore has what the commit acknowledges."""
    create(pg_conninfo, 8)
    a = cluster_storage(pg_conninfo, tmp_path / "a", "a")
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        db = await opened(a, "c")
        real = a.committer.submit
        go = trio.Event()

        async def slow(write: Any) -> None:
            await go.wait()
            await real(write).wait()

        a.committer.submit = through(a.committer, nursery, slow)  # type: ignore[method-assign,assignment]
        db.conn.execute("INSERT INTO t VALUES (1)")
        nursery.start_soon(db.sync)
        await trio.sleep(0.05)  # the sync is committing...
        db.close()  # ...when the actor leaves memory
        reopened: list[Any] = []
        done = trio.Event()

        async def reopen() -> None:
            reopened.append(await opened(a, "c"))
            done.set()

        nursery.start_soon(reopen)
        await trio.sleep(0.2)
        assert reopened == []  # waits for the commit
        go.set()
        with trio.fail_after(5):
            await done.wait()
        assert reopened[0].conn.execute("SELECT x FROM t").fetchall() == [(1,)]
        reopened[0].close()
        nursery.cancel_scope.cancel()


async def test_syncs_of_one_database_never_overlap(pg_conninfo: str, tmp_path: Path) -> None:
    """Batches of one actor must land in order, and none after one that failed: its syncs
    (the gate's, a checkpoint's) run one at a time, however many are asked for at once."""
    create(pg_conninfo, 8)
    a = cluster_storage(pg_conninfo, tmp_path / "a", "a")
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        await serving_all(a)
        await a.ready("c", "x")
        db = a.open_actor("c", "x")
        db.conn.execute("CREATE TABLE t (n INTEGER)")
        committer = a.committer
        real_submit = committer.submit
        running, overlaps, commits = 0, 0, 0

        async def slow_commit(write: Any) -> None:
            nonlocal running, overlaps, commits
            running += 1
            overlaps += running > 1
            await trio.sleep(0.05)  # a slow round trip: another sync would start meanwhile
            try:
                await real_submit(write).wait()
            finally:
                running -= 1
                commits += 1

        committer.submit = through(committer, nursery, slow_commit)  # type: ignore[method-assign,assignment]
        async with trio.open_nursery() as syncs:
            for n in range(6):
                db.conn.execute("INSERT INTO t VALUES (?)", (n,))
                syncs.start_soon(db.sync)
                await trio.sleep(0.01)
        assert commits >= 2 and overlaps == 0, (commits, overlaps)
        db.close()
        await a.settle()
        nursery.cancel_scope.cancel()
    b = cluster_storage(pg_conninfo, tmp_path / "b", "b")
    async with trio.open_nursery() as nursery:
        await nursery.start(b.run)
        await serving_all(b)
        await b.ready("c", "x")
        restored = b.open_actor("c", "x")
        assert [n for (n,) in restored.conn.execute("SELECT n FROM t ORDER BY n")] == list(range(6))
        restored.close()
        nursery.cancel_scope.cancel()


async def test_commits_do_not_queue_behind_the_stores_other_calls(
    pg_conninfo: str, tmp_path: Path
) -> None:
    """Commits have a thread (and a connection) of their own: with every other thread of the
    store taken by calls that wait (heartbeats held up by a row lock, as restores' loads or a
    renewal can be), a commit still goes through at once."""
    import psycopg

    from actorkeep.cluster import Write

    create(pg_conninfo, 1)
    a = cluster_storage(pg_conninfo, tmp_path / "a", "a")
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        await serving_all(a)
        lease = a.keeper.lease_for(0)
        assert lease is not None
        with psycopg.connect(pg_conninfo) as holder:
            holder.execute(
                "SELECT 1 FROM actorkeep_hosts WHERE host_id = %s FOR UPDATE", (a.store.host_id,)
            )
            for _ in range(6):  # more than the store's threads
                nursery.start_soon(a.in_thread, lambda: a.store.heartbeat(SETTINGS.ttl))
            with psycopg.connect(pg_conninfo, autocommit=True) as probe:
                await trio.to_thread.run_sync(wait_for_a_lock_wait, probe)
            await trio.sleep(0.2)  # and the other threads wait behind it
            with trio.fail_after(5):
                await a.committer.commit(Write(0, lease.epoch, "c/x", 1, b"one"))
            holder.commit()
        assert await a.in_thread(lambda: a.store.frames("c/x")) == [(1, b"one")]
        nursery.cancel_scope.cancel()


async def test_writes_that_could_not_reach_the_store_are_refused_not_unknown(
    pg_conninfo: str, postgres: Any, tmp_path: Path
) -> None:
    """PostgreSQL down while the host's lease still holds by its own clock: a durable write's
    commit cannot open a connection, so nothing of it was sent, and its caller hears a refusal
    (503 ``Overloaded``: not durable, try again), not ``OutcomeUnknown``."""
    create(pg_conninfo, 8)
    store = ClusterStore(pg_conninfo, "a", clock=time.monotonic)
    keeper = LeaseKeeper(store, LeaseSettings(ttl=30.0, margin=1.0), time.monotonic)
    a = ClusterStorage(tmp_path / "a", store, keeper)
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        async with open_host(app, storage=a, router=lambda h: ClusterRouter(h, a)) as t:
            assert (await call(t, "put", key="x", value="before")).status == 200
            await trio.to_thread.run_sync(postgres.stop, "fast")
            try:
                error = (await call(t, "put_error", key="x", value="no")).json()
            finally:
                await trio.to_thread.run_sync(postgres.start)
            assert error.startswith("Overloaded: "), error
            assert "could not reach the cluster's store" in error
            assert (await call(t, "get", key="x")).json() == "before"
        nursery.cancel_scope.cancel()


def failing(storage: ClusterStorage) -> dict[str, bool]:
    """Make ``storage``'s commits fail before they reach the store while ``state["fail"]``
    (an error of the call: their outcome is unknown)."""
    real = storage.commit_now
    state = {"fail": False}

    async def commit(writes: Sequence[Write], alarms: Sequence[AlarmChange]) -> None:
        if state["fail"]:
            raise OSError("injected: the store did not answer")
        await real(writes, alarms)

    storage.commit_now = commit  # type: ignore[method-assign]
    return state


def committed_soon(storage: ClusterStorage) -> list[Any]:
    """The databases whose syncs go through ``storage``'s committer (``commit_soon``), in
    order, from now on."""
    seen: list[Any] = []
    real = storage.commit_soon

    def commit_soon(db: Any) -> bool:
        seen.append(db)
        return real(db)

    storage.commit_soon = commit_soon  # type: ignore[method-assign]
    return seen


class TaskSteps(trio.abc.Instrument):
    """Counts the trio tasks' steps, to tell whether two things happened in one step."""

    def __init__(self) -> None:
        self.n = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.n += 1


async def test_a_sync_asked_for_during_a_commit_joins_the_next_batch_in_the_same_step(
    pg_conninfo: str, tmp_path: Path
) -> None:
    """The gate's syncs go through the committer without a task of their own: an actor that
    writes again while its sync commits has its next batch started in the step the first one
    ended, so the commits' thread never waits for the trio thread's other work."""
    create(pg_conninfo, 8)
    a = cluster_storage(pg_conninfo, tmp_path / "a", "a")
    steps = TaskSteps()
    trio.lowlevel.add_instrument(steps)
    started: list[int] = []  # the step count when each commit began, and when it came back
    ended: list[int] = []
    go = trio.Event()
    real = a.commit_now

    async def timed(writes: Sequence[Write], alarms: Sequence[AlarmChange]) -> None:
        started.append(steps.n)
        await go.wait()
        try:
            await real(writes, alarms)
        finally:
            ended.append(steps.n)

    a.commit_now = timed  # type: ignore[method-assign]
    failed: list[BaseException] = []
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(a.run)
            go.set()
            db = await opened(a, "c")
            await db.sync()  # its first image and table
            started.clear()
            ended.clear()
            gate = Gate(db, nursery.start_soon, print, print, failed.append)
            go = trio.Event()
            db.conn.execute("INSERT INTO t VALUES (1)")
            gate.write()
            await trio.sleep(0.05)  # its sync commits...
            db.conn.execute("INSERT INTO t VALUES (2)")
            gate.write()  # ...when it writes again
            go.set()
            with trio.fail_after(5):
                await gate.wait()
            db.close()
            await a.settle()
            nursery.cancel_scope.cancel()
    finally:
        trio.lowlevel.remove_instrument(steps)
    assert not failed and len(started) == 2 and started[1] == ended[0], (started, ended)


async def test_a_sync_in_the_committer_fails_when_the_lease_runs_out_not_when_the_store_answers(
    pg_conninfo: str, tmp_path: Path
) -> None:
    """A host cut off from the store: the commit of a durable write hangs, and the write's
    caller hears that its outcome is unknown once the lease runs out by the host's clock,
    while the commit still hangs; the actor's next open waits for the commit's end."""
    create(pg_conninfo, 8)
    clock = Clock()
    a = cluster_storage(pg_conninfo, tmp_path / "a", "a", clock=clock)
    cut_off = hanging(a)
    through_committer = committed_soon(a)
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        async with open_host(app, storage=a, router=lambda h: ClusterRouter(h, a)) as t:
            assert (await call(t, "put", key="k", value="before")).status == 200
            a.keeper.tick = lambda: None  # type: ignore[method-assign]  # no more renewals
            through_committer.clear()
            cut_off["hang"] = True
            answers: list[Any] = []
            answered = trio.Event()

            async def put() -> None:
                answers.append(await t.request("POST", "/w/w/_rpc/put_error",
                                               json={"key": "k", "value": "during"}))  # fmt: skip
                answered.set()

            nursery.start_soon(put)
            await trio.sleep(0.1)  # the commit hangs...
            assert answers == []
            clock.now += SETTINGS.ttl  # ...when the lease runs out by this host's clock
            with trio.fail_after(2):  # 0.5 s here
                await answered.wait()
            assert not cut_off["go"].is_set()
            assert answers[0].status == 503 and b"OutcomeUnknown" in answers[0].body
            [shard] = {db.address for db in through_committer if db.address.startswith("kv/")}
            reopened = trio.Event()

            async def reopen() -> None:
                with contextlib.suppress(NotServedHere):  # the lease is gone by then
                    await a.ready(*shard.split("/"))
                reopened.set()

            nursery.start_soon(reopen)
            await trio.sleep(0.1)
            assert not reopened.is_set()  # the actor's next open waits for the commit's end
            cut_off["go"].set()
            with trio.fail_after(2):
                await reopened.wait()
        nursery.cancel_scope.cancel()


async def test_after_a_sync_in_the_committer_failed_the_database_syncs_no_more(
    pg_conninfo: str, tmp_path: Path
) -> None:
    """The gate's sync run by the committer (``start_sync``) fails with its batch's outcome
    unknown: as for a sync of its own, no later batch of the database may land on top of
    the one that may be missing; its next open restores what the store has."""
    create(pg_conninfo, 8)
    a = cluster_storage(pg_conninfo, tmp_path / "a", "a")
    commits = failing(a)
    through_committer = committed_soon(a)
    failed: list[BaseException] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        db = await opened(a, "c")
        db.conn.execute("INSERT INTO t VALUES (1)")
        await db.sync()
        gate = Gate(db, nursery.start_soon, print, print, failed.append)
        commits["fail"] = True
        db.conn.execute("INSERT INTO t VALUES (2)")
        gate.write()
        assert through_committer == [db]
        with pytest.raises(OutcomeUnknown, match="may be durable"):
            await gate.wait()
        assert len(failed) == 1
        commits["fail"] = False
        db.conn.execute("INSERT INTO t VALUES (3)")
        with pytest.raises(NotServedHere):
            await db.sync()  # the store works again, but this database is done
        db.close()
        again = await opened(a, "c")
        assert again.conn.execute("SELECT x FROM t").fetchall() == [(1,)]
        again.close()
        nursery.cancel_scope.cancel()


def hanging(storage: ClusterStorage) -> dict[str, Any]:
    """Make ``storage``'s commits wait, while ``state["hang"]``, for ``state["go"]``."""
    real = storage.commit_now
    state: dict[str, Any] = {"hang": False, "go": trio.Event()}

    async def commit(writes: Sequence[Write], alarms: Sequence[AlarmChange]) -> None:
        if state["hang"]:
            await state["go"].wait()
        await real(writes, alarms)

    storage.commit_now = commit  # type: ignore[method-assign]
    return state


async def test_a_sync_with_nothing_to_ship_ends_at_once_and_no_reply_leaves_past_the_lease(
    pg_conninfo: str, tmp_path: Path
) -> None:
    """A gated write's reply whose frames went with the batch before is released only under
    a good lease: the sync asked for after that batch has nothing to ship, ends in the step
    it is taken (not after a batch of its own, which could end past the lease)."""
    create(pg_conninfo, 8)
    clock = Clock()
    a = cluster_storage(pg_conninfo, tmp_path / "a", "a", clock=clock)
    state = hanging(a)
    released: list[tuple[Any, bool]] = []  # (what, whether the lease was good then)
    failed: list[BaseException] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        a.keeper.tick = lambda: None  # type: ignore[method-assign]  # no more renewals
        db = await opened(a, "c")
        await db.sync()

        def release(item: Any, result: Any) -> None:
            released.append((item, a.keeper.lease_for(db.partition) is not None))

        gate = Gate(db, nursery.start_soon, release, print, failed.append)
        state["hang"] = True
        db.conn.execute("INSERT INTO t VALUES (1)")
        gate.write()  # its sync waits for the next batch
        db.conn.execute("INSERT INTO t VALUES (2)")
        gate.write()  # the gate's sync runs: this one is asked for after it
        gate.hold("reply", outcome.Value(None))
        await trio.sleep(0.02)  # the batch took both rows and hangs
        go, state["go"] = state["go"], trio.Event()
        go.set()  # it ends; the next sync has nothing to ship
        await trio.sleep(0.02)
        clock.now += SETTINGS.ttl
        state["go"].set()
        await trio.sleep(0.02)
        nursery.cancel_scope.cancel()
    assert released == [("reply", True)] and not failed


async def test_a_sync_with_nothing_to_ship_does_not_fail_with_a_batch(
    pg_conninfo: str, tmp_path: Path
) -> None:
    """A sync that has nothing to ship is not in a batch, so a batch that fails (its outcome
    unknown) does not take the database's local file, plain writes and all, with it."""
    create(pg_conninfo, 8)
    a = cluster_storage(pg_conninfo, tmp_path / "a", "a")
    commits = failing(a)
    failed: list[BaseException] = []
    ran: list[int] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        db = await opened(a, "c")
        db.conn.execute("INSERT INTO t VALUES (1)")
        await db.sync()
        gate = Gate(db, nursery.start_soon, print, print, failed.append)
        commits["fail"] = True
        gate.after(lambda: ran.append(1))  # nothing new to ship
        await trio.sleep(0.05)
        assert ran == [1] and not failed
        commits["fail"] = False
        db.conn.execute("INSERT INTO t VALUES (2)")
        await db.sync()  # the database goes on
        nursery.cancel_scope.cancel()


async def test_a_failing_callback_at_a_leases_end_does_not_stop_the_storage(
    pg_conninfo: str, tmp_path: Path
) -> None:
    """Ending a sync past its lease tells the gate, which tells the host: an error there is
    logged, and the storage (every other actor's commits) goes on."""
    create(pg_conninfo, 8)
    clock = Clock()
    a = cluster_storage(pg_conninfo, tmp_path / "a", "a", clock=clock)
    state = hanging(a)

    def boom(exc: BaseException) -> None:
        raise RuntimeError("injected: a bug in the host's bookkeeping")

    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        a.keeper.tick = lambda: None  # type: ignore[method-assign]  # no more renewals
        db = await opened(a, "c")
        await db.sync()
        gate = Gate(db, nursery.start_soon, print, print, boom)
        state["hang"] = True
        db.conn.execute("INSERT INTO t VALUES (1)")
        gate.write()
        await trio.sleep(0.05)
        clock.now += SETTINGS.ttl
        await trio.sleep(3 * SETTINGS.every)  # the storage ended the sync meanwhile
        assert gate.failed is not None
        state["go"].set()
        nursery.cancel_scope.cancel()


async def test_syncs_waiting_in_the_committer_end_when_the_storage_stops(
    pg_conninfo: str, tmp_path: Path
) -> None:
    """Cancelled with a batch in flight (the simulator's store calls are cancellable): the
    syncs asked for meanwhile end too, so that nothing waits for them (an actor's next open,
    its gate's waiters)."""
    create(pg_conninfo, 8)
    store = ClusterStore(pg_conninfo, "a", clock=time.monotonic)
    slow = False

    async def run_store(fn: Callable[[], Any]) -> Any:
        if slow:
            await trio.sleep(0.5)
        return fn()

    a = ClusterStorage(
        tmp_path / "a", store, LeaseKeeper(store, SETTINGS, time.monotonic), run_store=run_store
    )
    failed: dict[str, list[BaseException]] = {"c": [], "d": []}
    async with trio.open_nursery() as outer:
        async with trio.open_nursery() as nursery:
            await nursery.start(a.run)
            c, d = await opened(a, "c"), await opened(a, "d")
            await c.sync()
            await d.sync()
            gates = {
                n: Gate(db, outer.start_soon, print, print, failed[n].append)
                for n, db in (("c", c), ("d", d))
            }
            slow = True
            c.conn.execute("INSERT INTO t VALUES (1)")
            gates["c"].write()
            await trio.sleep(0.05)  # c's batch in flight
            d.conn.execute("INSERT INTO t VALUES (1)")
            gates["d"].write()  # d's waits for the next
            await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
        assert failed["c"] and failed["d"]
        assert not gates["c"].syncing and not gates["d"].syncing
        outer.cancel_scope.cancel()
