"""The simulator's model of the cluster's store (sim/cluster/store.py): seeded latency, replies
lost after the call took effect, and a failover that keeps what was committed; and cluster hosts
running on it through the production seam (``ClusterStorage(..., run_store=...)``), as on
PostgreSQL."""

from __future__ import annotations

import functools
import random
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import actorkeep as ak
import shards
from actorkeep.cluster import LeaseKeeper, LeaseSettings
from actorkeep.cluster.backend import ClusterStorage, NotServedHere
from actorkeep.cluster.database import ClusterDatabase
from actorkeep.cluster.frames import LogFormatError
from actorkeep.cluster.partitions import partition_of
from actorkeep.cluster.records import StoreError, Write
from actorkeep.cluster.replica import Replica, held
from actorkeep.runtime.storage import FileDatabase
from actorkeep.testing import open_host
from sim.cluster.store import (
    MemoryCluster,
    MemoryStore,
    ReplyLost,
    RequestLost,
    StoreLink,
    StoreUnreachable,
)


async def test_a_link_is_slow_loses_replies_and_waits_out_a_failover(
    autojump_clock: trio.testing.MockClock,
) -> None:
    cluster = MemoryCluster(4, clock=trio.current_time)
    store = cluster.connect("a", trio.current_time)
    link = StoreLink(cluster, random.Random(7), latency=(0.01, 0.02))
    lease = await link.run(lambda: store.acquire(0, 30.0, 1.0))
    assert lease is not None
    epoch = lease.epoch
    link.lost_replies = 0.5
    start = trio.current_time()
    outcomes = []
    for seq in range(1, 21):
        write = Write(0, epoch, "c/x", seq, b"f")
        try:
            await link.run(functools.partial(store.commit, [write]))
            outcomes.append("ok")
        except ReplyLost:
            outcomes.append("lost")
    took = trio.current_time() - start
    assert 20 * 0.02 <= took <= 20 * 0.04  # two delays a call, from the range
    assert "ok" in outcomes and "lost" in outcomes
    # Every call ran, lost reply or not: all twenty batches are committed.
    assert [s for s, _ in store.frames("c/x")] == list(range(1, 21))
    cluster.fail_over(5.0)
    with pytest.raises(StoreUnreachable):
        await link.run(lambda: store.commit([Write(0, epoch, "c/x", 21, b"g")]))
    await trio.sleep(5.0)
    link.lost_replies = 0.0
    await link.run(lambda: store.commit([Write(0, epoch, "c/x", 21, b"g")]))
    assert [s for s, _ in store.frames("c/x")] == list(range(1, 22))  # nothing lost over it


async def test_a_call_lost_on_its_way_to_the_store_does_not_run(
    autojump_clock: trio.testing.MockClock,
) -> None:
    cluster = MemoryCluster(4, clock=trio.current_time)
    store = cluster.connect("a", trio.current_time)
    link = StoreLink(cluster, random.Random(7), lost_requests=1.0)
    with pytest.raises(RequestLost):
        await link.run(lambda: store.acquire(0, 30.0, 1.0))
    assert cluster.leases[0].owner is None  # not taken: the call never ran
    link.lost_requests = 0.0
    assert await link.run(lambda: store.acquire(0, 30.0, 1.0)) is not None


async def test_a_seed_draws_the_same_latencies_and_losses(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def run(seed: int) -> tuple[float, list[bool]]:
        cluster = MemoryCluster(2, clock=trio.current_time)
        store = cluster.connect("a", trio.current_time)
        link = StoreLink(cluster, random.Random(seed), lost_replies=0.3)
        start, lost = trio.current_time(), []
        for _ in range(30):
            try:
                await link.run(lambda: store.heartbeat(1.0))
                lost.append(False)
            except ReplyLost:
                lost.append(True)
        return round(trio.current_time() - start, 9), lost

    assert await run(3) == await run(3)
    assert await run(3) != await run(4)


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
    async def get(self, key: str) -> str | None:
        entry = await kv.get(key)
        return None if entry is None else entry.value.decode()


def storage_on(cluster: MemoryCluster, root: Path, host: str, link: StoreLink) -> ClusterStorage:
    store = cluster.connect(host, time.monotonic)
    return ClusterStorage(root, store, LeaseKeeper(store, SETTINGS, time.monotonic), link.run)


async def call(t: Any, method: str, **args: Any) -> Any:
    end = trio.current_time() + 10
    while True:
        resp = await t.request("POST", f"/w/w/_rpc/{method}", json=args)
        if resp.status != 503 or trio.current_time() > end:
            return resp
        await trio.sleep(0.05)


async def test_hosts_on_the_model_keep_every_acknowledged_write(tmp_path: Path) -> None:
    """Two in-process hosts over the model, the first with a fifth of the store's replies
    lost: every put it acknowledged is read on the second after a planned stop; a put whose
    commit's reply was lost was not acknowledged (its outcome is unknown)."""
    cluster = MemoryCluster(8, clock=time.monotonic)
    lossy = StoreLink(cluster, random.Random(11), lost_replies=0.2)
    a = storage_on(cluster, tmp_path / "a", "a", lossy)
    acked: dict[str, int] = {}  # key: the last put acknowledged (its i)
    tried: dict[str, list[int]] = {}
    async with trio.open_nursery() as nursery:
        while True:  # its first tick may lose its reply: the host then starts over
            try:
                await nursery.start(a.run)
                break
            except ReplyLost:
                a = storage_on(cluster, tmp_path / "a", "a", lossy)
        async with open_host(app, storage=a, alarm_index=lambda _: a.alarms) as t:
            for i in range(40):
                key = f"k{i % 10}"
                tried.setdefault(key, []).append(i)
                resp = await call(t, "put", key=key, value=f"v{i}")
                if resp.status == 200:
                    acked[key] = i
        nursery.cancel_scope.cancel()
    assert lossy.lost > 0 and acked
    clean = StoreLink(cluster, random.Random(12))
    b = storage_on(cluster, tmp_path / "b", "b", clean)
    async with trio.open_nursery() as nursery:
        await nursery.start(b.run)
        async with open_host(app, storage=b, alarm_index=lambda _: b.alarms) as t:
            for key, last in acked.items():
                got = (await call(t, "get", key=key)).json()
                # The last acknowledged value, or one tried after it (its reply lost).
                allowed = {f"v{i}" for i in tried[key] if i >= last}
                assert got in allowed, (key, got, last)
        nursery.cancel_scope.cancel()


def one_host(
    root: Path, latency: float, settings: LeaseSettings | None = None
) -> tuple[MemoryCluster, MemoryStore, StoreLink, LeaseKeeper, ClusterStorage]:
    """A store of 2 partitions and the storage of one host over it, on trio's clock."""
    cluster = MemoryCluster(2, clock=trio.current_time)
    store = cluster.connect("h1", trio.current_time)
    link = StoreLink(cluster, random.Random(1), latency=(latency, latency))
    keeper = LeaseKeeper(store, settings or LeaseSettings(), trio.current_time)
    return cluster, store, link, keeper, ClusterStorage(root, store, keeper, run_store=link.run)


async def synced_table(storage: ClusterStorage, address: str) -> ClusterDatabase:
    """``address`` opened on ``storage``, with a table ``t (k)`` created and synced."""
    class_name, name = address.split("/")
    await storage.ready(class_name, name)
    db = storage.open_actor(class_name, name)
    db.conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY)")
    await db.sync()
    return db


async def test_a_close_during_a_failing_sync_leaves_no_hole_in_the_store(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """An actor closed (evicted) while a sync of it is in flight ships its last writes only
    after that sync ended, and not at all if it failed: batch 3 on top of a batch 2 that never
    landed would restore a broken file. And a store that holds such a hole is refused."""
    cluster, store, _, _, storage = one_host(tmp_path, 0.005)
    real_commit = store.commit

    def commit(writes: Any, alarms: Any = ()) -> None:
        if any(w.seq == 2 for w in writes):
            raise StoreError("the connection dropped: batch 2 not committed")
        real_commit(writes, alarms)

    store.commit = commit  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        await nursery.start(storage.run)
        await storage.ready("kv", "a")
        db = storage.open_actor("kv", "a")
        db.conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)")
        db.conn.executemany("INSERT INTO t VALUES (?, 'x')", [(i,) for i in range(50)])
        await db.sync()  # batch 1, with the first image
        db.conn.executemany("INSERT INTO t VALUES (?, 'y')", [(i,) for i in range(50, 100)])
        failed: list[BaseException] = []

        async def gate_sync() -> None:
            try:
                await db.sync()  # batch 2: fails, its outcome unknown
            except Exception as exc:
                failed.append(exc)

        nursery.start_soon(gate_sync)
        await trio.sleep(0.002)  # batch 2 is on its way
        db.conn.executemany("INSERT INTO t VALUES (?, 'z')", [(i,) for i in range(100, 150)])
        db.close()  # evicted: its batch 3 waits for batch 2, which fails
        await storage.settle()
        assert failed and sorted(cluster.frames["kv/a"]) == [1]
        restored = held(store, "kv/a").image
        nursery.cancel_scope.cancel()
    path = tmp_path / "restored.sqlite"
    path.write_bytes(restored)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert conn.execute("SELECT count(*) FROM t").fetchone() == (50,)
    conn.close()
    cluster.frames["kv/a"][3] = cluster.frames["kv/a"][1]  # a hole: batch 2 missing
    with pytest.raises(LogFormatError, match="batch 2 is missing"):
        held(store, "kv/a")


async def test_no_sync_reads_the_log_while_a_checkpoint_starts_it_afresh(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by ``bench/cluster_actors.py`` (a shard's sync failed with "the log went back from
    frame 4266 to 0", and its held replies with it): SQLite, starting the log afresh in the
    checkpoint's thread, resets the log's index before it rewrites the log's header, and a
    gate's sync that read the log in between saw the old log with no frames. A sync asked for
    during a checkpoint waits until the checkpoint has ended; then it reads the new log."""
    _, _, _, _, storage = one_host(tmp_path, 0.005)
    in_checkpoint, go_on = trio.Event(), trio.Event()
    real_checkpoint = FileDatabase.checkpoint

    async def checkpoint(db: FileDatabase) -> None:
        in_checkpoint.set()
        await go_on.wait()
        await real_checkpoint(db)

    monkeypatch.setattr(FileDatabase, "checkpoint", checkpoint)
    reads: list[bool] = []  # per read of the log: whether the checkpoint had gone on
    real_ship = Replica.ship

    def ship(replica: Replica, epoch: int) -> Any:
        reads.append(go_on.is_set())
        return real_ship(replica, epoch)

    monkeypatch.setattr(Replica, "ship", ship)
    async with trio.open_nursery() as nursery:
        await nursery.start(storage.run)
        db = await synced_table(storage, "kv/a")
        db.conn.execute("INSERT INTO t VALUES (1)")
        await db.prepare_checkpoint()
        nursery.start_soon(db.checkpoint)
        await in_checkpoint.wait()  # its own read is done; the log is about to start afresh
        assert reads == [False, False]
        synced = trio.Event()

        async def gate_sync() -> None:  # a gate's sync, asked for meanwhile
            await db.sync()
            synced.set()

        nursery.start_soon(gate_sync)
        await trio.sleep(1.0)
        assert reads == [False, False]  # it waits
        go_on.set()
        await synced.wait()
        assert reads == [False, False, True]
        db.conn.execute("INSERT INTO t VALUES (2)")  # the first write of the new log
        await db.sync()
        nursery.cancel_scope.cancel()


async def test_a_sync_asked_for_after_a_close_ends_with_the_close_s_commit(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """An actor evicted while its gate still has a sync to run (found by the cluster
    simulator: the sync then read a closed log and failed, so its held replies were refused
    though the close shipped their writes): the sync waits for the commit of what the close
    shipped, and succeeds with it; after a close that could not ship, it fails (503)."""
    cluster, store, _, keeper, storage = one_host(tmp_path, 0.005)
    async with trio.open_nursery() as nursery:
        await nursery.start(storage.run)
        db = await synced_table(storage, "kv/a")
        db.conn.execute("INSERT INTO t VALUES (1)")
        db.close()  # evicted; the gate asks for its sync after
        await db.sync()  # durable: the close's batch is committed
        assert sorted(cluster.frames["kv/a"]) == [1, 2]

        other = await synced_table(storage, "kv/b")
        other.conn.execute("INSERT INTO t VALUES (1)")
        partition = other.partition
        store.release([keeper.held[partition]])  # the lease is gone before the close
        await storage.in_thread(keeper.tick)
        other.close()  # cannot ship: the file is given up
        with pytest.raises(NotServedHere):
            await other.sync()
        nursery.cancel_scope.cancel()


async def test_a_late_renewal_holds_a_sync_instead_of_failing_it(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """The host's clock says the lease ran out only because its renewal is late (the store
    slow to answer): a sync asked for then waits for the next tick and goes on once the lease
    is renewed (no other host can have taken it: a renewal needs it live and unchanged). One
    that is still not renewed after a tick's interval fails (503)."""
    settings = LeaseSettings(ttl=3.0, margin=1.0)
    cluster, _, link, keeper, storage = one_host(tmp_path, 0.001, settings)
    async with trio.open_nursery() as nursery:
        await nursery.start(storage.run)
        db = await synced_table(storage, "kv/a")
        link.pause()  # the next renewals hang
        until = keeper.held[db.partition].until
        await trio.sleep(until - trio.current_time() + 0.1)
        assert keeper.lapsed(db.partition)
        db.conn.execute("INSERT INTO t VALUES (1)")
        done: list[float | Exception] = []
        synced = trio.Event()

        async def sync() -> None:
            try:
                await db.sync()
                done.append(trio.current_time())
            except Exception as exc:
                done.append(exc)
            synced.set()

        nursery.start_soon(sync)
        await trio.sleep(0.3)
        if done:
            link.resume()
        assert done == []  # held, not failed
        resumed = trio.current_time()
        link.resume()  # the renewal lands while the store still has the lease live
        with trio.fail_after(settings.every + 1):
            await synced.wait()
        assert isinstance(done[0], float) and done[0] >= resumed
        assert sorted(cluster.frames["kv/a"]) == [1, 2]

        db.conn.execute("INSERT INTO t VALUES (2)")
        link.pause()
        await trio.sleep(keeper.held[db.partition].until - trio.current_time() + 0.1)
        try:
            with pytest.raises(NotServedHere):
                await db.sync()  # a whole tick's interval, and still no renewal
        finally:
            link.resume()
        nursery.cancel_scope.cancel()


async def test_alarm_events_are_retried_once_the_store_answers_again(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """After renewals failed (the store unreachable), the first one that works tells the
    alarm scheduler (``retry`` of the index's ``watch``), so that alarm events that failed on
    the store meanwhile run at once instead of waiting out their back-off."""
    settings = LeaseSettings(ttl=3.0, margin=1.0)
    _, _, link, _, storage = one_host(tmp_path, 0.001, settings)
    retried: list[float] = []
    storage.alarms.watch(lambda at: None, lambda: retried.append(trio.current_time()))
    async with trio.open_nursery() as nursery:
        await nursery.start(storage.run)
        await trio.sleep(settings.every * 3)
        assert retried == []  # every renewal worked: nothing to retry
        link.cut = True
        await trio.sleep(5.0)
        assert retried == []
        link.cut = False
        healed = trio.current_time()
        await trio.sleep(settings.every * 3)
        nursery.cancel_scope.cancel()
    assert len(retried) == 1 and retried[0] - healed <= settings.every + link.timeout


async def test_alarms_of_a_lease_whose_renewal_is_late_are_kept_and_fire_once_renewed(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """While the lease has lapsed by the host's clock with its renewal late (found by the
    cluster simulator: a push queue that never drained), an alarm change is still recorded
    (its commit waits for the renewal and takes it along), and the due entries the scans pass
    over wake the scheduler once the renewal comes."""
    settings = LeaseSettings(ttl=3.0, margin=1.0)
    _, _, link, keeper, storage = one_host(tmp_path, 0.001, settings)
    index = storage.alarms
    pokes: list[float] = []
    poked = trio.Event()

    def poke(at: float) -> None:
        pokes.append(at)
        poked.set()

    index.watch(poke, lambda: None)
    address = next(f"q/{i}" for i in range(100) if partition_of(f"q/{i}", 2) == 0)
    async with trio.open_nursery() as nursery:
        await nursery.start(storage.run)
        index.put(address, 5.0)
        link.pause()  # the next renewals hang
        try:
            await trio.sleep(keeper.held[0].until - trio.current_time() + 0.1)
            assert keeper.lapsed(0)
            index.put(address, 1.0)  # the actor's event moves its alarm earlier meanwhile
            assert index.get(address) == 1.0 and index.pending[address].at == 1.0
            assert index.due(100.0, None, 10) == []  # passed over: not served by this clock
            pokes.clear()
            poked = trio.Event()
        finally:
            link.resume()
        with trio.fail_after(settings.every + 1):
            await poked.wait()
        assert pokes == [1.0]
        assert index.due(100.0, None, 10) == [(address, 1.0)]
        nursery.cancel_scope.cancel()
