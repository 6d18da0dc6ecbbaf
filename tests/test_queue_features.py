"""Queues beyond send/lease/ack: unique keys and debounce, message groups, expiry, per-message
attempts, fail, workers, recurring sends (docs/queues.md)."""

from __future__ import annotations

import contextlib
import functools
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

import actorkeep as ak
from actorkeep.queue import Bury, Config, Fail, Lease
from actorkeep.runtime.clock import Clock
from actorkeep.schedules import Timetable
from actorkeep.testing import open_host
from actorkeep.wire.queue import SEND, outcome_from_wire
from tests.queue_support import (
    CountingQueue,
    Remote,
    app,
    check_chains,
    deliveries,
    now,
    queue_file,
    raw,
    table_rows,
)

#: A fixed epoch at trio time zero, on a whole day: the cron times fall where the test says.
EPOCH = 1799020800.0


@pytest.fixture(autouse=True)
def _reset() -> None:
    deliveries.clear()


# -- keys ---------------------------------------------------------------------------------------


async def test_a_key_queues_one_message_while_it_is_live(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        first = await q.send(b"a", key="order-42")
        assert await q.send(b"b", key="order-42") == first  # ready: the same id
        assert await q.send(b"c", key="order-43") != first
        assert await q.send(b"d", key="order-43") != first
        (lease,) = await q.lease(max=1, visibility=30)
        assert (lease.id, lease.body, lease.key) == (first, b"a", "order-42")
        assert await q.send(b"e", key="order-42") == first  # leased: still the same
        assert await q.retry(first, 1, delay=50)
        assert await q.send(b"f", key="order-42") == first  # delayed after a retry
        stats = await q.stats()
        assert (stats.ready + stats.delayed + stats.leased, stats.keys) == (2, 2)
        (again,) = await q.lease(max=1, visibility=30)  # order-42 after its retry: not yet
        assert again.key == "order-43"
        assert await q.ack(again.id, again.attempt)
        await trio.sleep(51)
        (lease,) = await q.lease(max=1, visibility=30)
        assert lease.id == first and lease.body == b"a"  # keep: the first body stays
        assert await q.ack(first, 2)
        fresh = await q.send(b"g", key="order-42")  # acked, not remembered: a new message
        assert fresh > first


async def test_remember_keeps_a_key_after_ack(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        first = await q.send(b"a", key="k", remember=60)
        (lease,) = await q.lease(max=1, visibility=30)
        assert await q.ack(lease.id, lease.attempt)
        assert await q.send(b"b", key="k") == first  # remembered: nothing queued
        assert (await q.stats()).keys == 1 and await q.lease(max=5, visibility=30) == []
        await host.restart()  # the window is stored
        q = Remote(host)
        assert await q.send(b"b", key="k") == first
        await trio.sleep(61)
        second = await q.send(b"c", key="k")
        assert second > first
        assert (await q.stats()).keys == 1


async def test_replace_debounces_a_waiting_message(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        t0 = now(host)
        i = await q.send(b"v1", delay=10, key="doc-7", on_duplicate="replace")
        await trio.sleep(5)
        assert await q.send(b"v2", delay=10, key="doc-7", on_duplicate="replace") == i
        job = await q.get(i)
        assert job.body == b"v2" and job.visible_at == pytest.approx(t0 + 15)  # pushed back
        await trio.sleep(8)
        assert await q.lease(max=1, visibility=30) == []  # not due at t0 + 13
        await trio.sleep(3)
        (lease,) = await q.lease(max=1, visibility=30)
        assert (lease.id, lease.body) == (i, b"v2")
        # leased: not replaced
        assert await q.send(b"v3", delay=10, key="doc-7", on_duplicate="replace") == i
        assert (await q.get(i)).body == b"v2"
        assert (await q.stats()).ready + (await q.stats()).delayed == 0


async def test_keys_in_a_batch_are_atomic(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        ids = await q.send_batch([b"a", b"b", b"c", b"d"], keys=["x", None, "x", "y"])
        assert ids[0] == ids[2] and len(set(ids)) == 3  # the batch's own duplicate
        again = await q.send_batch([b"e", b"f"], keys=["y", "z"])
        assert again[0] == ids[3] and again[1] > max(ids)
        replaced = await q.send_batch(
            [b"x2", b"y2"], keys=["x", "y"], on_duplicate="replace", delay=5
        )
        assert replaced == [ids[0], ids[3]]
        assert [(await q.get(i)).body for i in replaced] == [b"x2", b"y2"]
        # a refused batch changes nothing
        with pytest.raises(ValueError, match="one entry per body"):
            await q.send_batch([b"a", b"b"], keys=["only-one"])
        resp = await raw(host, "send", SEND.pack(bodies=[b"a"], keys=["k", "l"]))
        assert resp.status == 400 and b"one entry per body" in resp.body
        assert (await q.stats()).keys == 3  # x, y, z


# -- groups -------------------------------------------------------------------------------------


async def test_a_group_leases_one_message_at_a_time_in_order(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        a = await q.send_batch([b"a1", b"a2", b"a3"], groups=["A"] * 3)
        b = await q.send_batch([b"b1", b"b2"], groups=["B", "B"])
        plain = await q.send(b"p")
        leases = await q.lease(max=10, visibility=30)
        assert [x.id for x in leases] == [a[0], b[0], plain]  # one per group
        assert {x.group for x in leases} == {"A", "B", None}
        assert await q.lease(max=10, visibility=30) == []
        # a retried head blocks its group until it is done: FIFO with retries
        assert await q.retry(a[0], 1, delay=20)
        assert await q.ack(b[0], 1)
        (nxt,) = await q.lease(max=10, visibility=30)
        assert nxt.id == b[1]
        await trio.sleep(21)
        (again,) = await q.lease(max=10, visibility=30)
        assert (again.id, again.attempt) == (a[0], 2)
        assert await q.ack(a[0], 2)
        (second,) = await q.lease(max=10, visibility=30)
        assert second.id == a[1]
        stats = await q.stats()
        # a2, b2 and p leased; a3 waits behind a2
        assert stats.groups == 2 and stats.leased == 3 and stats.delayed == 1


async def test_a_dead_or_expired_head_lets_its_group_go_on(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        first = await q.send(b"1", group="g", max_attempts=1)
        second = await q.send(b"2", group="g", expires=100)
        third = await q.send(b"3", group="g")
        (lease,) = await q.lease(max=5, visibility=10)
        assert lease.id == first
        await trio.sleep(11)  # its only lease ran out: dead
        (lease,) = await q.lease(max=5, visibility=500)
        assert lease.id == second
        await trio.sleep(100)  # expired while leased
        (lease,) = await q.lease(max=5, visibility=30)
        assert lease.id == third
        dead = {d.id: d for d in await q.dead_letters()}
        assert dead[first].reason == "max attempts exceeded"
        assert dead[second].reason == "expired" and dead[second].group == "g"
        assert await q.cancel(third)
        fourth = await q.send(b"4", group="g")
        assert [x.id for x in await q.lease(max=5, visibility=30)] == [fourth]


async def test_a_grouped_send_whose_ids_were_not_foreseen_queues_nothing(
    data_dir: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A grouped send links its messages by the ids SQLite is about to give them, and checks
    them after the insert: ids it did not foresee fail the send whole (500), and the group
    stays as it was."""
    import queues.sending

    async with open_host(app, data_dir) as host:
        q = Remote(host)
        first = await q.send(b"a", group="g")
        monkeypatch.setattr(queues.sending, "next_id", lambda sql: first + 5)
        with pytest.raises(ak.RemoteError) as raised:
            await q.send_batch([b"b", b"c"], groups=["g", "g"])
        assert raised.value.status == 500
        monkeypatch.undo()
        with contextlib.closing(sqlite3.connect(queue_file(data_dir))) as conn:
            assert conn.execute("SELECT id FROM actorkeep_queue").fetchall() == [(first,)]
            check_chains(conn)
        second = await q.send(b"b", group="g")
        assert [x.id for x in await q.lease(max=5, visibility=30)] == [first]
        assert await q.ack(first, 1)
        assert [x.id for x in await q.lease(max=5, visibility=30)] == [second]


async def test_groups_share_leases_fairly(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        for g in "ABC":  # each group's messages sent together, A's first
            await q.send_batch([f"{g}{i}".encode() for i in range(4)], groups=[g] * 4)
        order: list[str] = []
        for _ in range(6):
            await trio.sleep(1)
            (lease,) = await q.lease(max=1, visibility=30)
            order.append(lease.body.decode())
            assert await q.ack(lease.id, lease.attempt)
        assert order == ["A0", "B0", "C0", "A1", "B1", "C1"]  # round robin, not A's backlog


async def test_redrive_puts_grouped_messages_at_the_end_of_their_group(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        bad = await q.send(b"bad", group="g", key="k")
        later = await q.send(b"later", group="g")
        (lease,) = await q.lease(max=5, visibility=30)
        assert await q.fail(lease.id, lease.attempt, "poison")
        assert await q.redrive() == 1
        (lease,) = await q.lease(max=5, visibility=30)
        assert lease.id == later
        assert await q.ack(lease.id, lease.attempt)
        (lease,) = await q.lease(max=5, visibility=30)
        assert lease.body == b"bad" and lease.id > later and lease.key is None
        assert bad < later


# -- per-message options, fail, workers ----------------------------------------------------------


async def test_expiry_and_attempts_per_message(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        t0 = now(host)
        short = await q.send(b"s", expires=30, max_attempts=2)
        delayed = await q.send(b"d", delay=100, expires=50)
        job = await q.get(short)
        assert job.expires_at == pytest.approx(t0 + 30) and job.max_attempts == 2
        assert (await q.get(delayed)).max_attempts == 5  # the queue's, resolved
        (lease,) = await q.lease(max=5, visibility=1)
        assert await q.retry(lease.id, 1, delay=0.001)
        await trio.sleep(0.01)
        (lease,) = await q.lease(max=5, visibility=1)
        assert lease.attempt == 2
        await trio.sleep(2)  # its second (last) lease ran out
        assert (await q.get(short)).state == "dead"
        await trio.sleep(50)  # the delayed one expired before it was due
        job = await q.get(delayed)
        assert job.state == "dead" and job.last_error == "expired"
        assert job.failed_at == pytest.approx(t0 + 50)


async def test_expiry_reaches_the_dead_letters_without_a_caller(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        t0 = now(host)
        i = await q.send(b"x", expires=60)
    await trio.sleep(100)
    async with open_host(app, data_dir):
        await trio.sleep(1)  # the alarm fires at once after the restart
        (row,) = table_rows(data_dir, "actorkeep_queue_dead")
        assert row[0] == i and row[4] >= t0 + 60 and row[5] == "expired"


async def test_fail_and_worker_names(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        i = await q.send(b"x", key="k", group="g")
        await q.lease(max=1, visibility=30, worker="worker-3")
        job = await q.get(i)
        assert job.worker == "worker-3" and job.key == "k" and job.group == "g"
        assert await q.fail(i, 2, "stale attempt") is False
        assert await q.settle([Bury(i, 1, "cannot parse")]) == [True]
        job = await q.get(i)
        assert job.state == "dead" and job.last_error == "cannot parse" and job.attempts == 1
        (dead,) = await q.dead_letters()
        assert (dead.worker, dead.key, dead.group, dead.reason) == (
            "worker-3",
            "k",
            "g",
            "cannot parse",
        )
        with pytest.raises(ValueError, match="reason must not be empty"):
            Fail("")
        with pytest.raises(ValueError, match="worker"):
            await q.lease(max=1, visibility=30, worker="w" * 201)


async def test_a_consumer_returns_fail(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async def poison(actor: ak.Actor, msg: Lease) -> Fail | None:
        return Fail("poison message") if msg.body == b"bad" else None

    deliveries.behaviour["worker/w"] = poison  # type: ignore[assignment]
    async with open_host(app, data_dir) as host:
        q = Remote(host, "queue/push")
        await q.configure(Config(consumer="worker/w"))
        bad = await q.send(b"bad")
        await q.send(b"good")
        await trio.sleep(5)
        (dead,) = await q.dead_letters()
        assert (dead.id, dead.reason, dead.attempts, dead.worker) == (
            bad,
            "poison message",
            1,
            "worker/w",
        )
        assert (await q.stats()).ready == 0 and len(deliveries.seen) == 2


async def test_bad_options_are_refused_before_any_file(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        cases: list[tuple[dict[str, Any], str]] = [
            ({"keys": [""]}, "key must not be empty"),
            ({"keys": ["k" * 201]}, "longer than 200"),
            ({"keys": [5]}, "key must be a str"),
            ({"groups": "g"}, "groups must be a list"),
            ({"on_duplicate": "merge"}, "on_duplicate"),
            ({"remember": -1}, "remember"),
            ({"expires": 0}, "expires must be at least"),
            ({"max_attempts": 0}, "max_attempts"),
        ]
        for fields, message in cases:
            resp = await raw(host, "send", SEND.pack(bodies=[b"x"], **fields), "queue/fresh")
            assert resp.status == 400 and message.encode() in resp.body, (fields, resp.body)
            with pytest.raises(ValueError, match=message):
                SEND.frame(bodies=[b"x"], **fields)
        assert not queue_file(data_dir, "queue/fresh").exists()
    for outcome in ({"id": 1, "attempt": 1, "op": "fail"}, {"id": 1, "attempt": 1, "op": "x"}):
        with pytest.raises(ValueError, match="outcome"):
            outcome_from_wire(outcome)


# -- recurring sends ----------------------------------------------------------------------------


async def test_recurring_sends_one_message_per_occurrence(
    data_dir: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock(anchor=EPOCH)
    async with open_host(app, data_dir, clock=clock) as host:
        q = Remote(host, "timed/q")
        await q.stats()  # opens the queue: its setup declares the schedules
        assert (await q.stats()).schedules == 2
        await trio.sleep(35)
        assert [x.body for x in await q.lease(max=100, visibility=1e6)] == [b"tick"] * 3
        # A crash after a send, before its schedule moved on, runs the occurrence again:
        # it must find it sent.
        advance = Timetable.advance
        crashes = iter([True])

        def crash_once(self: Timetable, row: Any, after: float | None) -> None:
            if next(crashes, False):
                raise OSError("crash before the schedule moved on")
            advance(self, row, after)

        monkeypatch.setattr(Timetable, "advance", crash_once)
        await trio.sleep(10)
        monkeypatch.setattr(Timetable, "advance", advance)
        await trio.sleep(1)
        assert [x.body for x in await q.lease(max=100, visibility=1e6)] == [b"tick"]
    await trio.sleep(3600)  # down for an hour: "once" sends one of each
    async with open_host(app, data_dir, clock=clock) as host:
        q = Remote(host, "timed/q")
        await trio.sleep(1)
        leases = await q.lease(max=100, visibility=1000)
        assert sorted(x.body for x in leases) == [b"h", b"tick"]
        (hourly,) = [x for x in leases if x.body == b"h"]
        assert hourly.group == "cron"
    conn = sqlite3.connect(queue_file(data_dir, "timed/q"))
    marks = dict(conn.execute("SELECT key, sent_due FROM actorkeep_queue_recurring"))
    conn.close()
    assert set(marks) == {"tick", "hourly"}


def test_recurring_declarations_are_checked() -> None:
    import queues

    other = ak.App()
    with pytest.raises(TypeError, match="recurring maps"):
        other.mount(queues.Queue, "q", recurring={"x": [("tick", "* * * * *")]})
    with pytest.raises(ValueError, match="repeat a key"):
        other.mount(
            queues.Queue,
            "q",
            recurring={
                "x": [
                    queues.Recurring("a", "* * * * *", b""),
                    queues.Recurring("a", "0 * * * *", b""),
                ]
            },
        )
    with pytest.raises(ValueError, match="bad cron"):
        queues.Recurring("a", "every minute", b"")


# -- an old queue file --------------------------------------------------------------------------


async def test_a_queue_file_of_the_first_version_is_upgraded(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    path = queue_file(data_dir, "queue/old")
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path)
    conn.executescript(
        """CREATE TABLE actorkeep_queue (id INTEGER PRIMARY KEY AUTOINCREMENT, body BLOB NOT NULL,
        enqueued_at REAL NOT NULL, visible_at REAL NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
        last_error TEXT, priority INTEGER NOT NULL DEFAULT 0, leased INTEGER NOT NULL DEFAULT 0);
        CREATE INDEX actorkeep_queue_order ON actorkeep_queue (priority DESC, visible_at, id);
        CREATE TABLE actorkeep_queue_dead (id INTEGER PRIMARY KEY, body BLOB NOT NULL,
        enqueued_at REAL NOT NULL, attempts INTEGER NOT NULL, failed_at REAL NOT NULL,
        reason TEXT NOT NULL, priority INTEGER NOT NULL DEFAULT 0);
        INSERT INTO actorkeep_queue (body, enqueued_at, visible_at) VALUES (x'6f6c64', 0, 0);"""
    )
    conn.commit()
    conn.close()
    async with open_host(app, data_dir) as host:
        q = Remote(host, "queue/old")
        (lease,) = await q.lease(max=5, visibility=30)
        assert lease.body == b"old"
        assert await q.send(b"new", key="k", group="g") > lease.id


async def test_a_queue_file_whose_groups_were_an_index_is_chained(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A file of the version before chains (groups found by an index of (group, id)): at its
    next start each grouped message names the one before it, and the queue goes on in order."""
    path = queue_file(data_dir, "queue/grouped")
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path)
    conn.executescript(
        """CREATE TABLE actorkeep_queue (id INTEGER PRIMARY KEY AUTOINCREMENT, body BLOB NOT NULL,
        enqueued_at REAL NOT NULL, visible_at REAL NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
        last_error TEXT, priority INTEGER NOT NULL DEFAULT 0, leased INTEGER NOT NULL DEFAULT 0,
        key TEXT, grp TEXT, blocked INTEGER NOT NULL DEFAULT 0, expires_at REAL,
        max_attempts INTEGER, remember REAL, worker TEXT);
        CREATE INDEX actorkeep_queue_group ON actorkeep_queue (grp, id) WHERE grp IS NOT NULL;
        CREATE TABLE actorkeep_queue_dead (id INTEGER PRIMARY KEY, body BLOB NOT NULL,
        enqueued_at REAL NOT NULL, attempts INTEGER NOT NULL, failed_at REAL NOT NULL,
        reason TEXT NOT NULL, priority INTEGER NOT NULL DEFAULT 0, key TEXT, grp TEXT,
        worker TEXT);
        INSERT INTO actorkeep_queue (body, enqueued_at, visible_at, grp, blocked) VALUES
        ('g1', 0, 0, 'g', 0), ('h1', 0, 0, 'h', 0), ('g2', 0, 0, 'g', 1), ('x', 0, 0, NULL, 0),
        ('g3', 0, 0, 'g', 1), ('h2', 0, 0, 'h', 1);
        UPDATE actorkeep_queue SET body = CAST(body AS BLOB);"""
    )
    conn.commit()
    conn.close()
    async with open_host(app, data_dir) as host:
        q = Remote(host, "queue/grouped")
        assert [x.body for x in await q.lease(max=10, visibility=30)] == [b"g1", b"h1", b"x"]
        with contextlib.closing(sqlite3.connect(path)) as conn:
            check_chains(conn)
            assert conn.execute("PRAGMA index_info(actorkeep_queue_group)").fetchall() == []
        assert await q.send(b"g4", group="g") == 7
        assert await q.ack(1, 1) and await q.ack(2, 1)
        assert [x.body for x in await q.lease(max=10, visibility=30)] == [b"g2", b"h2"]
        assert (await q.stats()).groups == 2


# -- limits -------------------------------------------------------------------------------------


async def test_max_in_flight_caps_pull_leases(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        await q.configure(Config(max_in_flight=3))
        await q.send_batch([b"%d" % i for i in range(10)])
        first = await q.lease(max=10, visibility=30)
        assert len(first) == 3 and await q.lease(max=10, visibility=30) == []
        assert await q.ack(first[0].id, 1)
        assert len(await q.lease(max=10, visibility=30)) == 1
        await trio.sleep(31)  # the leases ran out: no longer in flight
        assert len(await q.lease(max=10, visibility=30)) == 3


async def test_rate_is_a_token_bucket_for_pull_leases(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        await q.configure(Config(rate=2.0, burst=4))
        await q.send_batch([b"x"] * 40)
        assert len(await q.lease(max=10, visibility=300)) == 4  # the burst
        assert await q.lease(max=10, visibility=300) == []
        await trio.sleep(1.25)
        assert len(await q.lease(max=10, visibility=300)) == 2  # 2.5 tokens: 2 whole
        await trio.sleep(0.25)
        assert len(await q.lease(max=10, visibility=300)) == 1  # the half plus a half
        await host.restart()  # the bucket is stored: a restart gives no new burst
        q = Remote(host)
        assert await q.lease(max=10, visibility=300) == []
        await trio.sleep(100)
        assert len(await q.lease(max=10, visibility=300)) == 4  # full again, never more


async def test_push_delivery_keeps_to_the_rate(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        q = Remote(host, "queue/push")
        await q.configure(Config(consumer="worker/w", batch_size=10, rate=5.0, burst=5))
        t0 = now(host)
        await q.send_batch([b"x"] * 50)
        await trio.sleep(20)
        times = sorted(t - t0 for *_, t in deliveries.seen)
        assert len(times) == 50
        # over any span of t seconds, at most burst + rate * t deliveries
        for i, start in enumerate(times):
            for j in range(i, len(times)):
                assert j - i + 1 <= 5 + 5.0 * (times[j] - start) + 1e-9
        assert times[-1] >= (50 - 5) / 5.0  # and it did not just stop short
        assert times[-1] < (50 - 5) / 5.0 + 1


async def test_push_delivery_keeps_to_max_in_flight(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async def slow(actor: ak.Actor, msg: Lease) -> None:
        await trio.sleep(1)

    deliveries.behaviour["worker/w"] = slow
    async with open_host(app, data_dir) as host:
        q = Remote(host, "queue/push")
        await q.configure(Config(consumer="worker/w", batch_size=10, max_in_flight=2))
        await q.send_batch([b"x"] * 6)
        for _ in range(6):
            await trio.sleep(0.5)
            conn = sqlite3.connect(queue_file(data_dir, "queue/push"))
            (leased,) = conn.execute(
                "SELECT COUNT(*) FROM actorkeep_queue WHERE leased = 1 AND visible_at > ?",
                (now(host),),
            ).fetchone()
            conn.close()
            assert leased <= 2
            await trio.sleep(1.5)
        await trio.sleep(30)
        assert len(deliveries.seen) == 6


def test_limits_are_checked() -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"max_in_flight": 0}, "max_in_flight"),
        ({"rate": 0}, "rate must be"),
        ({"rate": -1.0}, "rate must be"),
        ({"rate": float("inf")}, "rate must be"),
        ({"burst": 3}, "burst goes with rate"),
        ({"rate": 1.0, "burst": 0}, "burst"),
    ]
    for kw, message in cases:
        with pytest.raises(ValueError, match=message):
            Config(**kw)
    assert Config(rate=0.5).bucket == 1 and Config(rate=20.0).bucket == 20


class MemoryQueue:
    """A queue's tables in an in-memory database, with the ``exec`` the queue's helpers call
    (they take it for the actor's ``Sql``); ``statements`` records what ran."""

    in_transaction = True  # as inside an event's transaction: sends open none of their own

    def __init__(self) -> None:
        from queues.schema import INDEXES, SCHEMA

        self.conn = sqlite3.connect(":memory:")
        for statement in SCHEMA + INDEXES:
            self.conn.execute(statement)
        self.statements: list[tuple[str, tuple[Any, ...]]] = []

    def exec(self, sql: str, params: tuple[Any, ...] = ()) -> sqlite3.Cursor:
        self.statements.append((sql, params))
        return self.conn.execute(sql, params)

    def plan(self, sql: str, params: tuple[Any, ...]) -> str:
        return " ".join(r[3] for r in self.conn.execute("EXPLAIN QUERY PLAN " + sql, params))


def chained(q: MemoryQueue, groups: list[str | None]) -> None:
    """Messages 1, 2, ... in ``groups``, each after the one before it in its group, as sends
    leave them."""
    last: dict[str, int] = {}
    rows = []
    for id_, group in enumerate(groups, start=1):
        prev = None if group is None else last.get(group)
        rows.append((id_, group, int(prev is not None), prev))
        if group is not None:
            last[group] = id_
    q.conn.executemany(
        "INSERT INTO actorkeep_queue (id, body, enqueued_at, visible_at, grp, blocked, prev) "
        "VALUES (?, x'00', 0, 0, ?, ?, ?)",
        rows,
    )
    q.conn.executemany("INSERT INTO actorkeep_queue_groups VALUES (?, ?)", list(last.items()))


def test_the_queue_s_hot_statements_use_their_indexes() -> None:
    """A lease walks the lease index (no sort of every visible message), and the message after
    one that left its group is found by the index of ``prev`` (no scan of every waiting
    message): the plans, on a queue of 10,000 messages in 1,000 groups."""
    from queues.groups import unlink
    from queues.order import LEASE_SQL

    q = MemoryQueue()
    chained(q, [f"g{i % 1000}" for i in range(10_000)])
    plan = q.plan(LEASE_SQL, (0, 5.0, 5.0, 5, 100))
    assert "INDEX actorkeep_queue_heads (priority=? AND visible_at<?)" in plan, plan
    assert "TEMP B-TREE" not in plan, plan
    # heads (what acks remove), then a message inside its group (what expiry may remove)
    for ids in ("1, 2", "2003"):
        gone = q.conn.execute(
            f"DELETE FROM actorkeep_queue WHERE id IN ({ids}) RETURNING id, grp, prev"
        )
        unlink(q, 1.0, gone.fetchall())  # type: ignore[arg-type]
    updates = [(s, p) for s, p in q.statements if s.startswith("UPDATE actorkeep_queue ")]
    assert len(updates) == 2 and "FROM (VALUES" in updates[1][0], updates
    for statement, params in updates:
        plan = q.plan(statement, params)
        assert "INDEX actorkeep_queue_next (prev=?)" in plan, plan
        assert "SCAN actorkeep_queue" not in plan, plan
    check_chains(q.conn)


def vm_steps(q: MemoryQueue, run: Callable[[], object]) -> int:
    """SQLite virtual machine instructions ``run`` took (counted by hundreds)."""
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 100
        return 0

    q.conn.set_progress_handler(count, 100)
    try:
        run()
    finally:
        q.conn.set_progress_handler(None, 0)
    return steps


def test_a_hot_group_costs_its_sends_and_acks_no_more_than_a_small_one() -> None:
    """A group's next head and a send's place in its group are one index seek each, whatever
    the group holds: 50,000 waiting messages in one group cost what 2 do."""
    from queues.groups import link, unlink

    q = MemoryQueue()
    chained(q, [*["hot"] * 50_000, "small", "small"])
    sql = cast(Any, q)  # the helpers take it for the actor's Sql
    costs = {}
    for group, head in (("hot", 1), ("small", 50_001)):
        gone = q.conn.execute(
            "DELETE FROM actorkeep_queue WHERE id = ? RETURNING id, grp, prev", (head,)
        ).fetchall()
        promoted = vm_steps(q, functools.partial(unlink, sql, 1.0, gone))
        placed = vm_steps(q, functools.partial(link, sql, [group], 60_000))
        costs[group] = promoted + placed
    assert costs["hot"] <= costs["small"] + 200, costs  # a full scan: about 500,000
    heads = q.conn.execute("SELECT grp, id FROM actorkeep_queue WHERE blocked = 0").fetchall()
    assert heads == [("hot", 2), ("small", 50_002)]
    assert link(sql, ["hot", "small", "hot"], 60_000) == (
        [50_000, 50_002, 60_000],
        {"hot": 60_002, "small": 60_001},
    )


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from(["a", "b", "c", None]), min_size=1, max_size=40).flatmap(
        lambda groups: st.tuples(
            st.just(groups),
            st.sets(st.integers(1, len(groups))),
            st.randoms(use_true_random=False),
        )
    )
)
def test_messages_leaving_together_keep_each_group_a_chain(
    case: tuple[list[str | None], set[int], Any],
) -> None:
    """Any set of messages leaving in one statement (an expiry sweep takes runs of a group,
    its head and its tail at once): each group stays a chain of its live messages, and a
    message that became its group's head is leasable from then, not before."""
    from queues.groups import unlink

    groups, leaving, rng = case
    q = MemoryQueue()
    chained(q, groups)
    blocked_before = dict(q.conn.execute("SELECT id, blocked FROM actorkeep_queue").fetchall())
    gone = q.conn.execute(
        f"DELETE FROM actorkeep_queue WHERE id IN ({','.join('?' * len(leaving))}) "
        "RETURNING id, grp, prev",
        sorted(leaving),
    ).fetchall()
    rng.shuffle(gone)
    unlink(q, 5.0, gone)  # type: ignore[arg-type]
    check_chains(q.conn)
    for id_, blocked, visible_at in q.conn.execute(
        "SELECT id, blocked, visible_at FROM actorkeep_queue"
    ):
        promoted = blocked_before[id_] and not blocked
        assert visible_at == (5.0 if promoted else 0.0), id_


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([-(2**31), -7, 0, 1, 5, 2**31 - 1]) | st.integers(-200, 200),
            st.floats(0, 1e6),
            st.booleans(),
        ),
        max_size=150,
    )
)
def test_push_s_next_due_time_is_the_earliest_leasable_message(
    rows: list[tuple[int, float, bool]],
) -> None:
    """``earliest_head`` seeks once per priority in the lease index (and scans it past 64
    priorities): the same answer as a scan of every leasable message."""
    from queues.order import earliest_head

    q = MemoryQueue()
    q.conn.executemany(
        "INSERT INTO actorkeep_queue (body, enqueued_at, visible_at, priority, blocked) "
        "VALUES (x'00', 0, ?, ?, ?)",
        [(v, p, int(b)) for p, v, b in rows],
    )
    expected = min((v for _, v, b in rows if not b), default=None)
    assert earliest_head(q) == expected  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.sampled_from([-(2**31), -7, 0, 1, 5, 2**31 - 1]) | st.integers(-200, 200),
            st.sampled_from([0.0, 5.0, 10.0, 20.0]) | st.floats(0, 30),
            st.booleans(),
        ),
        max_size=150,
    ),
    now=st.sampled_from([0.0, 5.0, 10.0, 25.0]),
    n=st.integers(0, 40),
)
def test_a_lease_takes_the_visible_messages_in_lease_order(
    rows: list[tuple[int, float, bool]], now: float, n: int
) -> None:
    """``leasable`` seeks priority by priority (and reads the index in order past 64 of
    them): the first ``n`` of every visible message that may be leased, sorted by priority
    (highest first), then ``visible_at``, then id."""
    from queues.order import leasable

    q = MemoryQueue()
    q.conn.executemany(
        "INSERT INTO actorkeep_queue (id, body, enqueued_at, visible_at, priority, blocked) "
        "VALUES (?, x'00', 0, ?, ?, ?)",
        [(i, v, p, int(b)) for i, (p, v, b) in enumerate(rows, start=1)],
    )
    visible = [(-p, v, i) for i, (p, v, b) in enumerate(rows, start=1) if not b and v <= now]
    expected = [i for _, _, i in sorted(visible)[:n]]
    assert [r[0] for r in leasable(q, now, n, 5)] == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("waiting", ["delayed", "leased"])
def test_a_lease_costs_what_it_takes_not_what_waits(waiting: str) -> None:
    """A lease seeks the visible messages of each priority present: 20,000 delayed messages
    (or leases running) behind the one visible message cost it what 20 do. (Read in its
    order, the lease index passed all of them before it could tell that no more were
    visible.)"""
    from queues.order import leasable

    def queue(behind: int) -> MemoryQueue:
        q = MemoryQueue()
        q.conn.executemany(
            "INSERT INTO actorkeep_queue (body, enqueued_at, visible_at, priority, leased, "
            "attempts) VALUES (x'00', 0, ?, ?, ?, ?)",
            [(1.0, 0, 0, 0)]
            + [(100.0 + i, i % 2, int(waiting == "leased"), 1) for i in range(behind)],
        )
        return q

    def cost(behind: int) -> int:
        q = queue(behind)
        found: list[Any] = []
        steps = vm_steps(q, lambda: found.extend(leasable(q, 50.0, 100, 5)))  # type: ignore[arg-type]
        assert [r[0] for r in found] == [1]
        return steps

    few, many = cost(20), cost(20_000)
    assert many <= few + 200, (few, many)


def test_a_lease_past_its_seeks_reads_the_rest_of_the_index_in_order() -> None:
    """Past ``SEEKS`` priorities a lease reads the rest in lease order: 200 priorities, a
    visible and a delayed message each, and a lease of 150 takes the 150 highest's visible
    ones."""
    from queues.order import SEEKS, leasable

    q = MemoryQueue()
    q.conn.executemany(
        "INSERT INTO actorkeep_queue (id, body, enqueued_at, visible_at, priority) "
        "VALUES (?, x'00', 0, ?, ?)",
        [(2 * p + d, 1.0 + 99.0 * d, p) for p in range(200) for d in (0, 1)],
    )
    assert SEEKS < 150
    assert [r[0] for r in leasable(q, 50.0, 150, 5)] == [2 * p for p in range(199, 49, -1)]  # type: ignore[arg-type]


def test_the_sweep_reads_the_messages_out_of_attempts_not_every_lease() -> None:
    """The dead-letter sweep every lease runs seeks each count of attempts from the queue's
    ``max_attempts`` up, and reads the visible messages of that count: 20,000 leases in
    flight below the last attempt (or waiting out a backoff) cost it what 20 do, and it finds
    exactly the messages out of attempts."""
    from queues.queue import OUT_OF_ATTEMPTS, attempt_counts

    def queue(behind: int) -> MemoryQueue:
        q = MemoryQueue()
        q.conn.executemany(
            "INSERT INTO actorkeep_queue (id, body, enqueued_at, visible_at, attempts, leased) "
            "VALUES (?, x'00', 0, ?, ?, ?)",
            [(1, 1.0, 5, 1), (2, 1.0, 7, 0), (3, 60.0, 5, 1), (4, 1.0, 4, 0)]
            + [(10 + i, 100.0 + i, 1 + i % 4, i % 2) for i in range(behind)],
        )
        return q

    def cost(behind: int) -> int:
        q = queue(behind)
        found: list[int] = []

        def sweep() -> None:
            for attempts in attempt_counts(q, 5):  # type: ignore[arg-type]
                found.extend(
                    id_
                    for (id_,) in q.exec(
                        f"SELECT id FROM actorkeep_queue WHERE {OUT_OF_ATTEMPTS}", (attempts, 50.0)
                    )
                )

        steps = vm_steps(q, sweep)
        assert sorted(found) == [1, 2]
        return steps

    few, many = cost(20), cost(20_000)
    assert many <= few + 200, (few, many)
    plan = MemoryQueue().plan(f"DELETE FROM actorkeep_queue WHERE {OUT_OF_ATTEMPTS}", (5, 1.0))
    assert "INDEX actorkeep_queue_leased_before (attempts=? AND visible_at<?)" in plan, plan


async def test_a_sweep_dead_letters_a_batch_at_a_time_and_the_alarm_runs_the_next_at_once(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Messages expiring together go to the dead letters ``SWEEP_BATCH`` an event, so that the
    queue answers between; the alarm sweeps again at once until none is left."""
    from queues.queue import SWEEP_BATCH

    CountingQueue.swept.clear()
    n = 2 * SWEEP_BATCH + 100
    async with open_host(app, data_dir) as host:
        q = Remote(host, "counted/q")
        for size in (SWEEP_BATCH, SWEEP_BATCH, 100):
            await q.send_batch([b"x"] * size, expires=10)
        live = await q.send(b"live")
        await trio.sleep(11)
        assert CountingQueue.swept == [SWEEP_BATCH, SWEEP_BATCH, 100]
        assert [x.id for x in await q.lease(max=10, visibility=5)] == [live]
    dead = table_rows(data_dir, "actorkeep_queue_dead", "counted/q")
    assert len(dead) == n and {row[5] for row in dead} == {"expired"}


async def test_a_limited_push_queue_sweeps_a_batch_an_event_without_waiting_for_its_limits(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Leases running out on their last attempt are swept ``SWEEP_BATCH`` an event (one sweep
    per alarm event, the lease's), the next event at once, though the rate holds push back for
    1,000 seconds."""
    from queues.queue import SWEEP_BATCH

    CountingQueue.swept.clear()
    n = 2 * SWEEP_BATCH + 100
    async with open_host(app, data_dir) as host:
        q = Remote(host, "counted/p")
        await q.configure(Config(max_attempts=1))
        await q.send_batch([b"x"] * 1000)
        await q.send_batch([b"x"] * (n - 1000))
        assert len(await q.lease(max=1000, visibility=5)) == 1000
        assert len(await q.lease(max=1000, visibility=5)) == n - 1000
        await q.configure(Config(consumer="worker/w", max_attempts=1, rate=0.001, burst=1))
        live = await q.send(b"live")
        await trio.sleep(1)
        assert [x[1] for x in deliveries.seen] == [live]  # the one token, spent
        await trio.sleep(9)
        assert CountingQueue.swept == [SWEEP_BATCH, SWEEP_BATCH, 100]
    dead = table_rows(data_dir, "actorkeep_queue_dead", "counted/p")
    assert len(dead) == n and {row[5] for row in dead} == {"max attempts exceeded"}


@pytest.mark.parametrize("priorities", [1, 70])
def test_a_lease_never_takes_what_a_capped_sweep_left(priorities: int) -> None:
    """Past its expiry or out of attempts (the queue's or its own), a visible message is never
    leased, swept or not; ``priorities``: 70 present, the lease reads past its seeks."""
    from queues.order import leasable

    q = MemoryQueue()
    q.conn.executemany(
        "INSERT INTO actorkeep_queue (id, body, enqueued_at, visible_at, priority, attempts, "
        "expires_at, max_attempts) VALUES (?, x'00', 0, ?, ?, ?, ?, ?)",
        [
            (1, 0.0, 0, 0, 5.0, None),  # expired
            (2, 0.0, 0, 5, None, None),  # out of the queue's 5 attempts
            (3, 0.0, 0, 2, None, 2),  # out of its own 2
            (4, 1.0, 0, 4, 20.0, None),
            (5, 2.0, 0, 1, None, 3),
        ]
        # not visible, above: each priority a seek of its own
        + [(10 + p, 99.0, p, 0, None, None) for p in range(1, priorities)],
    )
    assert [r[0] for r in leasable(q, 10.0, 10, 5)] == [4, 5]  # type: ignore[arg-type]


class RecordingSweeper:
    """``sending.Sweeper`` for a ``MemoryQueue`` of ``max_attempts`` 3: records what it buries
    and deletes it."""

    max_attempts = 3

    def __init__(self, q: MemoryQueue) -> None:
        self.q = q
        self.buried: list[tuple[str, int]] = []

    def _gone(self, why: str, id_: int) -> None:
        self.buried.append((why, id_))
        self.q.conn.execute("DELETE FROM actorkeep_queue WHERE id = ?", (id_,))

    def expired(self, id_: int) -> None:
        self._gone("expired", id_)

    def out_of_attempts(self, id_: int) -> None:
        self._gone("out of attempts", id_)


def test_a_key_held_by_a_message_the_sweep_has_not_reached_is_free() -> None:
    """A keyed send that matches a message past its expiry, or whose last lease ran out,
    dead-letters it and queues a new message (a capped sweep may leave such messages for
    its next event); a message leased on its last attempt, or with attempts left, holds
    its key."""
    from queues.sending import SendOptions, insert

    q = MemoryQueue()
    q.conn.executemany(
        "INSERT INTO actorkeep_queue (id, body, enqueued_at, visible_at, key, attempts, "
        "leased, expires_at, max_attempts) VALUES (?, x'00', 0, ?, ?, ?, ?, ?, ?)",
        [
            (1, 5.0, "a", 3, 1, None, None),  # its last lease ran out
            (2, 20.0, "b", 3, 1, None, None),  # leased on its last attempt
            (3, 5.0, "c", 2, 1, None, 2),  # its last of its own 2 ran out
            (4, 5.0, "d", 2, 1, None, None),  # a lease ran out, attempts left
            (5, 0.0, "e", 0, 0, 8.0, None),  # past its expiry
        ],
    )
    sweeper = RecordingSweeper(q)
    keys: list[str | None] = ["a", "b", "c", "d", "e"]
    sent = insert(q, 10.0, [b"x"] * 5, 0.0, 0, SendOptions(keys=keys), sweeper)  # type: ignore[arg-type]
    assert sent.ids[1] == 2 and sent.ids[3] == 4
    assert min(sent.ids[i] for i in (0, 2, 4)) > 5 and sent.new == 3
    assert sorted(sweeper.buried) == [
        ("expired", 5),
        ("out of attempts", 1),
        ("out of attempts", 3),
    ]


class CountingGate:
    """``sql.DurablePoint``: counts the gated writes that committed."""

    def __init__(self) -> None:
        self.writes = 0

    def write(self) -> None:
        self.writes += 1

    async def sync(self) -> None:
        raise AssertionError("a send does not wait for its write")


def test_a_keyed_send_on_its_own_is_one_statement_and_a_duplicate_changes_nothing() -> None:
    """Outside a transaction, keyed sends whose keys are new are one gated INSERT, as plain
    sends are (no transaction around it to begin and commit); a batch with a live key then
    goes the general way, in one transaction, and answers the live message's id."""
    from queues.schema import INDEXES, SCHEMA
    from queues.sending import SendOptions, insert

    conn = sqlite3.connect(":memory:", isolation_level=None)
    for statement in SCHEMA + INDEXES:
        conn.execute(statement)
    ran: list[str] = []
    conn.set_trace_callback(ran.append)
    gate = CountingGate()
    sql = ak.Sql(conn, gate)

    first = insert(sql, 0.0, [b"a", b"b"], 0.0, 0, SendOptions(keys=["k1", "k2"]))
    assert first.new == 2 and gate.writes == 1
    assert [s.split()[0] for s in ran] == ["SELECT", "INSERT"]  # is any key remembered; send

    ran.clear()
    again = insert(sql, 1.0, [b"c", b"d"], 0.0, 0, SendOptions(keys=["k3", "k1"]))
    assert again.ids[1] == first.ids[0] and again.new == 1 and gate.writes == 2
    assert "BEGIN IMMEDIATE" in ran and ran[-1] == "COMMIT"
    inserts = [s for s in ran if s.startswith("INSERT INTO actorkeep_queue ")]
    assert len(inserts) == 2  # the try that failed, then the new message alone
    assert conn.execute("SELECT key, body FROM actorkeep_queue ORDER BY id").fetchall() == [
        ("k1", b"a"),
        ("k2", b"b"),
        ("k3", b"c"),
    ]
