"""Group commit to a real PostgreSQL (actorkeep/cluster/committer.py): many actors' writes in
one transaction, a fenced actor failing alone, an unknown outcome failing its whole batch."""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import partial
from typing import Any

import psycopg
import pytest
import trio

from actorkeep.cluster import ClusterStore, Fenced, Write, create
from actorkeep.cluster.committer import CommitNow, Committer
from actorkeep.cluster.records import AlarmChange, Store


def in_thread(store: Store) -> CommitNow:
    """``store.commit`` in a thread, as the committer awaits it."""

    async def commit(writes: Sequence[Write], alarms: Sequence[AlarmChange]) -> None:
        await trio.to_thread.run_sync(store.commit, writes, alarms)

    return commit


def write(partition: int, epoch: int, actor: int, seq: int) -> Write:
    return Write(partition, epoch, f"counter/c{actor}", seq, b"frames %d" % seq)


async def test_writers_that_ask_together_share_transactions(pg_conninfo: str) -> None:
    create(pg_conninfo, 4)
    store = ClusterStore(pg_conninfo, "a", clock=time.monotonic)
    epochs = {}
    for p in range(4):
        lease = store.acquire(p, 30.0, 1.0)
        assert lease is not None
        epochs[p] = lease.epoch
    async with trio.open_nursery() as nursery:
        committer = Committer(in_thread(store), nursery.start_soon)

        async def actor(i: int) -> None:
            for seq in range(1, 11):  # one at a time, as an actor's gate asks
                await committer.commit(write(i % 4, epochs[i % 4], i, seq))

        async with trio.open_nursery() as actors:
            for i in range(32):
                actors.start_soon(actor, i)
    assert committer.writes == 320
    assert committer.transactions <= 320 / 4  # at least four writes a transaction on average
    assert all(len(store.frames(f"counter/c{i}")) == 10 for i in range(32))
    store.close()


async def test_a_fenced_writer_fails_alone(pg_conninfo: str) -> None:
    create(pg_conninfo, 2)
    a = ClusterStore(pg_conninfo, "a", clock=time.monotonic)
    b = ClusterStore(pg_conninfo, "b", clock=time.monotonic)
    l0, l1 = a.acquire(0, 30.0, 1.0), a.acquire(1, 0.3, 0.1)
    assert l0 is not None and l1 is not None
    await trio.sleep(0.4)  # partition 1's lease expires, and b takes it
    assert b.acquire(1, 30.0, 1.0) is not None
    outcomes: dict[int, object] = {}
    async with trio.open_nursery() as nursery:
        committer = Committer(in_thread(a), nursery.start_soon)

        async def one(i: int, w: Write) -> None:
            try:
                await committer.commit(w)
                outcomes[i] = "ok"
            except Fenced as exc:
                outcomes[i] = exc.partitions

        for i, w in enumerate([write(0, l0.epoch, 0, 1), write(1, l1.epoch, 1, 1)] * 2):
            nursery.start_soon(one, i, Write(w.partition, w.epoch, w.address, i + 1, w.data))
    assert outcomes == {0: "ok", 1: [1], 2: "ok", 3: [1]}
    assert len(a.frames("counter/c0")) == 2 and a.frames("counter/c1") == []
    a.close()
    b.close()


async def test_a_commit_of_unknown_outcome_fails_its_whole_batch(pg_conninfo: str) -> None:
    create(pg_conninfo, 1)
    store = ClusterStore(pg_conninfo, "a", clock=time.monotonic)
    lease = store.acquire(0, 30.0, 1.0)
    assert lease is not None
    store.commit([write(0, lease.epoch, 0, 1)])
    failed: list[BaseException] = []
    async with trio.open_nursery() as nursery:
        committer = Committer(in_thread(store), nursery.start_soon)

        async def one(w: Write) -> None:
            try:
                await committer.commit(w)
            except psycopg.Error as exc:
                failed.append(exc)

        nursery.start_soon(one, write(0, lease.epoch, 0, 1))  # seq 1 again: refused
        nursery.start_soon(one, write(0, lease.epoch, 1, 1))  # in the same transaction
    assert len(failed) == 2
    assert store.frames("counter/c1") == []
    with pytest.raises(psycopg.errors.UniqueViolation):
        raise failed[0]
    store.close()


async def test_a_runner_that_fails_fails_its_batch_and_the_next_one_goes_on() -> None:
    """If running the store's call fails (no thread left, a lost reply in the simulator), the
    batch's outcome is unknown: its writers hear the error, and the committer goes on with the
    next batch instead of stopping (it used to end its task, and no commit ran again)."""
    from sim.cluster.store import MemoryCluster

    cluster = MemoryCluster(2, clock=trio.current_time)
    store = cluster.connect("a", trio.current_time)
    lease = store.acquire(0, 30.0, 1.0)
    assert lease is not None
    fail_next = [True]

    async def run(fn: Any) -> Any:
        await trio.lowlevel.checkpoint()
        if fail_next[0]:
            fail_next[0] = False
            raise RuntimeError("no thread to run it")
        return fn()

    async with trio.open_nursery() as nursery:
        committer = Committer(
            lambda writes, alarms: run(partial(store.commit, writes, alarms)), nursery.start_soon
        )
        with pytest.raises(RuntimeError, match="no thread"):
            await committer.commit(write(0, lease.epoch, 1, 1))
        await committer.commit(write(0, lease.epoch, 1, 2))  # the next batch commits
    assert [seq for seq, _ in store.frames("counter/c1")] == [2]


async def test_alarm_changes_of_unknown_outcome_fail_those_that_waited_for_them() -> None:
    """A batch of alarm changes alone (``commit(None)``) whose commit failed: whoever waited
    for it hears the error (its changes go back to the index for the next batch), not that it
    was committed; a batch after it that commits tells so."""
    from sim.cluster.store import MemoryCluster

    cluster = MemoryCluster(2, clock=trio.current_time)
    store = cluster.connect("a", trio.current_time)
    lease = store.acquire(0, 30.0, 1.0)
    assert lease is not None
    pending = [AlarmChange(0, lease.epoch, "counter/c1", 5.0)]
    requeued: list[list[AlarmChange]] = []

    class Index:
        def take(self) -> list[AlarmChange]:
            taken = list(pending)
            pending.clear()
            return taken

        def failed(self, changes: Sequence[AlarmChange], fenced: set[int]) -> None:
            requeued.append(list(changes))
            pending.extend(changes)

    fail_next = [True]

    async def commit(writes: Sequence[Write], alarms: Sequence[AlarmChange]) -> None:
        await trio.lowlevel.checkpoint()
        if fail_next[0]:
            fail_next[0] = False
            raise OSError("injected: the store did not answer")
        store.commit(writes, alarms)

    async with trio.open_nursery() as nursery:
        committer = Committer(commit, nursery.start_soon, Index())
        with pytest.raises(OSError, match="injected"):
            await committer.commit(None)
        assert requeued == [[AlarmChange(0, lease.epoch, "counter/c1", 5.0)]]
        assert store.alarms_of([0]) == []
        await committer.commit(None)
    assert store.alarms_of([0]) == [(0, "counter/c1", 5.0)]
