"""Queues, pull side: send, lease, ack/retry/settle, extend, backoff, dead letters, redrive,
cancel, get, stats, configure, access (docs/reference.md §8, docs/queues.md)."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import actorkeep as ak
from actorkeep.queue import Ack, Config, Retry
from actorkeep.testing import open_host
from queues import Queue
from queues.queue import backoff
from tests.queue_support import Remote, alarm_of, app, deliveries, now, queue_file, table_rows
from tests.sqlutil import rows_read


@pytest.fixture(autouse=True)
def _reset() -> None:
    deliveries.clear()


async def test_send_lease_ack(data_dir: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        t0 = now(host)
        a = await q.send(b"a")
        b = await q.send(b"b")
        assert b > a >= 1
        leases = await q.lease(max=10, visibility=30)
        assert [(x.id, x.attempt, x.body) for x in leases] == [(a, 1, b"a"), (b, 1, b"b")]
        assert leases[0].enqueued_at == pytest.approx(t0)
        assert await q.lease(max=10, visibility=30) == []  # hidden while leased
        assert await q.ack(a, 1) is True
        assert await q.ack(a, 1) is False  # already gone
        assert await q.get(a) is None
        job = await q.get(b)
        assert job.state == "leased" and job.attempts == 1
        assert job.visible_at == pytest.approx(now(host) + 30)


async def test_ids_are_never_reused(data_dir: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        first = await q.send_batch([b"1", b"2", b"3"])
        for lease in await q.lease(max=10, visibility=5):
            assert await q.ack(lease.id, lease.attempt)
        assert (await q.stats()).ready == 0  # the table is empty
        await host.restart()
        q = Remote(host)
        again = await q.send(b"4")
        assert again > max(first)


async def test_send_batch_order_and_limits(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        bodies = [f"m{i}".encode() for i in range(1000)]
        ids = await q.send_batch(bodies)
        assert ids == list(range(ids[0], ids[0] + 1000))
        leases = await q.lease(max=1000, visibility=10)
        assert [x.body for x in leases] == bodies
        assert [x.id for x in leases] == ids
        with pytest.raises(ValueError, match=r"1\.\.1000"):
            await q.send_batch([b"x"] * 1001)
        with pytest.raises(ValueError, match=r"1\.\.1000"):
            await q.send_batch([])
        with pytest.raises(ValueError, match="must be bytes"):
            await q.send_batch([b"ok"] * 500 + ["text"])
        assert (await q.stats()).leased == 1000  # nothing more was written


async def test_delayed_message(data_dir: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        i = await q.send_delayed(b"later", 60)
        assert (await q.get(i)).state == "delayed"
        assert await q.lease(max=1, visibility=1) == []
        await trio.sleep(59.9)
        assert await q.lease(max=1, visibility=1) == []
        await trio.sleep(0.1)
        assert (await q.get(i)).state == "ready"
        assert [x.id for x in await q.lease(max=1, visibility=1)] == [i]


async def test_lease_order_priority_then_visibility_then_id(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        low = await q.send(b"low", priority=-1)
        late = await q.send(b"late", delay=5)
        a = await q.send(b"a")
        b = await q.send(b"b")
        high = await q.send(b"high", delay=2, priority=7)
        await trio.sleep(10)
        # a and b became visible at send time; late at +5 (later than a, b): order by visible_at
        order = [x.id for x in await q.lease(max=10, visibility=5)]
        assert order == [high, a, b, late, low]


async def test_redelivery_and_stale_leases(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        i = await q.send(b"x")
        await q.lease(max=1, visibility=10)
        await trio.sleep(10)
        assert (await q.get(i)).state == "ready"  # the lease ran out
        [second] = await q.lease(max=1, visibility=10)
        assert (second.id, second.attempt) == (i, 2)
        # the old lease is stale: nothing it does changes anything
        assert await q.ack(i, 1) is False
        assert await q.retry(i, 1, delay=0) is False
        assert await q.extend(i, 1, 100) is False
        job = await q.get(i)
        assert (job.state, job.attempts) == ("leased", 2)
        assert job.visible_at == pytest.approx(now(host) + 10)
        assert await q.ack(i, 3) is False  # a lease that never was
        # a lease that ran out but was not leased again is still the current one
        await trio.sleep(11)
        assert await q.ack(i, 2) is True
        assert await q.get(i) is None


async def test_extend_is_a_heartbeat(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        i = await q.send(b"x")
        await q.lease(max=1, visibility=10)
        for _ in range(5):
            await trio.sleep(8)
            assert await q.extend(i, 1, 10) is True
        assert await q.lease(max=1, visibility=10) == []  # 40 s later, still leased
        assert (await q.get(i)).visible_at == pytest.approx(now(host) + 10)
        assert await q.extend(i, 1, 1) is True  # it may also shorten the lease
        await trio.sleep(1)
        assert [x.attempt for x in await q.lease(max=1, visibility=10)] == [2]


async def test_retry_with_delay_and_error(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        i = await q.send(b"x")
        await q.lease(max=1, visibility=10)
        assert await q.retry(i, 1, delay=42, error="smtp said no") is True
        job = await q.get(i)
        assert (job.state, job.last_error, job.attempts) == ("delayed", "smtp said no", 1)
        assert job.visible_at == pytest.approx(now(host) + 42)
        await trio.sleep(41.9)
        assert await q.lease(max=1, visibility=10) == []
        await trio.sleep(0.1)
        [lease] = await q.lease(max=1, visibility=10)
        assert lease.attempt == 2
        assert await q.retry(i, 2, delay=0) is True  # no error given: the last one stays
        assert (await q.get(i)).last_error == "smtp said no"


def test_backoff_formula() -> None:
    assert backoff(1, 1.0, 300.0, 0.0) == 0.5
    assert backoff(1, 1.0, 300.0, 0.999) == pytest.approx(0.9995)
    assert backoff(3, 1.0, 300.0, 0.0) == 2.0
    assert backoff(10, 1.0, 300.0, 0.0) == 150.0  # 512 capped at 300
    assert backoff(10**6, 1.0, 300.0, 0.5) == 225.0
    for n in range(1, 40):
        d = min(300.0, 2.0 ** (n - 1))
        assert d / 2 <= backoff(n, 1.0, 300.0, random.random()) <= d


async def test_backoff_doubles_with_jitter_up_to_the_cap(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir, rng=random.Random(7)) as host:
        q = Remote(host)
        await q.configure(Config(max_attempts=100))
        i = await q.send(b"x")
        delays: list[float] = []
        for attempt in range(1, 16):
            [lease] = await q.lease(max=1, visibility=1)
            assert lease.attempt == attempt
            t = now(host)
            assert await q.retry(i, attempt) is True
            delays.append((await q.get(i)).visible_at - t)
            await trio.sleep(delays[-1])
        for n, d in enumerate(delays, start=1):
            cap = min(300.0, 2.0 ** (n - 1))
            assert cap / 2 <= d <= cap, (n, d)
        assert len({round(d, 6) for d in delays[9:]}) > 1  # jittered, not fixed
        assert max(delays) <= 300.0


async def test_settle_mixes_acks_and_retries(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        a, b, c = await q.send_batch([b"a", b"b", b"c"])
        await q.lease(max=3, visibility=10)
        results = await q.settle([Ack(a, 1), Retry(b, 1, delay=5, error="e"), Ack(c, 2), Ack(a, 1)])
        assert results == [True, True, False, False]
        assert await q.get(a) is None
        assert (await q.get(b)).state == "delayed"
        assert (await q.get(c)).state == "leased"
        assert await q.settle([]) == []


async def test_a_settle_of_acks_alone_applies_each_as_one_at_a_time_would(
    data_dir: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Acks of distinct messages are applied in two statements (``Queue._ack_all``): only
    what is leased at the acked attempt goes, keys are remembered, groups move on; an ack
    given twice in one settle takes the one-by-one path (the second finds nothing)."""
    batched: list[int] = []
    ack_all = Queue._ack_all

    def counted(self: Queue, now: float, acks: list[Any]) -> list[bool]:
        batched.append(len(acks))
        return ack_all(self, now, acks)

    monkeypatch.setattr(Queue, "_ack_all", counted)
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        plain, stale, keyed = await q.send_batch([b"p", b"s", b"k"], keys=[None, None, "k-1"])
        keyed_remembered = await q.send(b"r", key="k-2", remember=60)
        first, second = await q.send_batch([b"g1", b"g2"], groups=["g", "g"])
        await q.lease(max=10, visibility=10)
        await trio.sleep(10)  # every lease runs out, and each is taken again at attempt 2
        [again] = [x for x in await q.lease(max=10, visibility=10) if x.id == stale]
        assert again.attempt == 2
        gone = second + 100
        outcomes = [Ack(keyed, 2), Ack(gone, 1), Ack(stale, 1), Ack(plain, 2), Ack(first, 2),
                    Ack(keyed_remembered, 2)]  # fmt: skip
        assert await q.settle(outcomes) == [True, False, False, True, True, True]
        assert (await q.get(stale)).state == "leased"  # its attempt 2 is still out
        assert [await q.get(i) for i in (plain, keyed, first, keyed_remembered)] == [None] * 4
        assert await q.send(b"again", key="k-2") == keyed_remembered  # remembered
        assert await q.send(b"again", key="k-1") > second  # forgotten: a new message
        [head] = [x for x in await q.lease(max=10, visibility=10) if x.id == second]
        assert head.attempt == 1  # the group's next, free once its first was acked
        assert await q.settle([Ack(stale, 2), Ack(stale, 2)]) == [True, False]
        assert await q.get(stale) is None
    assert batched == [6]  # the first settle took the batched path, the repeated ack did not


async def test_max_attempts_moves_to_dead_letters(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        await q.configure(Config(max_attempts=2))
        failing = await q.send(b"failing")
        lapsing = await q.send(b"lapsing")
        await q.lease(max=2, visibility=10)
        assert await q.retry(failing, 1, delay=0, error="boom 1")
        await trio.sleep(10)  # lapsing's first lease runs out
        assert [x.attempt for x in await q.lease(max=2, visibility=10)] == [2, 2]
        # retrying the last attempt dead-letters at once, with the error
        assert await q.retry(failing, 2, delay=60, error="boom 2") is True
        job = await q.get(failing)
        assert (job.state, job.last_error, job.attempts) == ("dead", "boom 2", 2)
        # a lease that runs out on its last attempt is dead-lettered too, reason by default
        await trio.sleep(10)
        job = await q.get(lapsing)
        assert (job.state, job.last_error) == ("dead", "max attempts exceeded")
        assert await q.ack(lapsing, 2) is False  # too late: it is dead
        dead = await q.dead_letters()
        assert [(d.id, d.body, d.attempts, d.reason) for d in dead] == [
            (failing, b"failing", 2, "boom 2"),
            (lapsing, b"lapsing", 2, "max attempts exceeded"),
        ]
        st = await q.stats()
        assert (st.ready, st.delayed, st.leased, st.dead) == (0, 0, 0, 2)


async def test_lapsed_last_attempt_is_dead_lettered_by_the_alarm(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """No limbo: nobody calls the queue, yet the message reaches the dead letters."""
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        await q.configure(Config(max_attempts=1))
        i = await q.send(b"x")
        await q.lease(max=1, visibility=10)
        assert alarm_of(host) == pytest.approx(now(host) + 10)
        await trio.sleep(11)
        assert table_rows(data_dir, "actorkeep_queue") == []
        [dead] = table_rows(data_dir, "actorkeep_queue_dead")
        assert dead[0] == i and dead[5] == "max attempts exceeded"
        assert alarm_of(host) is None  # a quiet pull queue has no alarm


async def test_dead_letter_retention(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        await q.configure(Config(max_attempts=1, dead_retention=100))
        a = await q.send(b"a")
        await q.lease(max=1, visibility=10)
        await q.retry(a, 1)
        await trio.sleep(50)
        b = await q.send(b"b")
        await q.lease(max=1, visibility=10)
        await q.retry(b, 1)
        assert [d.id for d in await q.dead_letters()] == [a, b]
        await trio.sleep(50.5)  # a is 100.5 s dead: the alarm deletes it without any call
        assert [r[0] for r in table_rows(data_dir, "actorkeep_queue_dead")] == [b]
        await trio.sleep(50)
        assert table_rows(data_dir, "actorkeep_queue_dead") == []
        assert alarm_of(host) is None
        await q.configure(Config(max_attempts=1, dead_retention=None))
        c = await q.send(b"c")
        await q.lease(max=1, visibility=10)
        await q.retry(c, 1)
        await trio.sleep(10**6)
        assert [d.id for d in await q.dead_letters()] == [c]  # kept forever


async def test_dead_letters_pages_and_redrive(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        await q.configure(Config(max_attempts=1))
        ids = await q.send_batch([f"{i}".encode() for i in range(5)], priority=3)
        for lease in await q.lease(max=5, visibility=10):
            await q.retry(lease.id, lease.attempt, error=f"e{lease.id}")
        page = await q.dead_letters(limit=2)
        assert [d.id for d in page] == ids[:2]
        page = await q.dead_letters(limit=2, after=page[-1].id)
        assert [d.id for d in page] == ids[2:4]
        assert [d.id for d in await q.dead_letters(limit=2, after=ids[4])] == []
        assert await q.redrive(ids=[ids[0], ids[1], 10**9]) == 2
        assert await q.redrive() == 3
        assert await q.dead_letters() == []
        leases = await q.lease(max=10, visibility=10)
        # new messages: new ids, no attempts, same bodies and enqueue times, same priority
        assert [x.body for x in leases] == [f"{i}".encode() for i in range(5)]
        assert all(x.id > ids[-1] and x.attempt == 1 for x in leases)
        assert (await q.get(leases[0].id)).priority == 3


async def test_cancel_in_every_live_state(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        ready = await q.send(b"r")
        delayed = await q.send(b"d", delay=100)
        leased = await q.send(b"l", priority=5)
        await q.lease(max=1, visibility=10)
        for i in (ready, delayed, leased):
            assert await q.cancel(i) is True
            assert await q.get(i) is None
        assert await q.cancel(ready) is False
        assert await q.ack(leased, 1) is False
        st = await q.stats()
        assert (st.ready, st.delayed, st.leased) == (0, 0, 0)


async def test_stats(data_dir: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        st = await q.stats()
        assert st == ak.queue.Stats(0, 0, 0, 0, None)
        await q.send_batch([b"1", b"2", b"3"])
        await trio.sleep(5)
        await q.send(b"4", delay=60)
        await q.lease(max=1, visibility=30)
        st = await q.stats()
        assert (st.ready, st.delayed, st.leased, st.dead) == (2, 1, 1, 0)
        assert st.oldest_ready_age == pytest.approx(5)


async def test_configure_is_stored_durably(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    cfg = Config(
        consumer="worker/w",
        batch_size=3,
        visibility=12.5,
        max_attempts=9,
        backoff_base=0.5,
        backoff_max=60,
        dead_retention=3600,
    )
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        assert await q.config() == Config()
        await q.configure(cfg)
        assert await q.config() == cfg
        await host.restart()
        assert await Remote(host).config() == cfg
        assert await Remote(host, "queue/other").config() == Config()
        with pytest.raises(ValueError, match="its own consumer"):
            await q.configure(Config(consumer="queue/q"))
        assert await Remote(host).config() == cfg


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": 1001}, "batch_size"),
        ({"visibility": 0}, "visibility"),
        ({"visibility": math.nan}, "visibility"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": True}, "max_attempts"),
        ({"backoff_base": -1}, "backoff_base"),
        ({"backoff_base": 10, "backoff_max": 5}, "backoff_max"),
        ({"dead_retention": -1}, "dead_retention"),
        ({"dead_retention": math.inf}, "dead_retention"),
        ({"consumer": "no-slash"}, "address"),
    ],
)
def test_bad_config_is_refused(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Config(**kwargs)  # type: ignore[arg-type]


async def test_outside_requests_are_refused_before_the_actor_exists(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        resp = await host.request("POST", "/queue/q/actorkeep-queue/v1/stats", body=b"\x80")
        assert resp.status == 403
        assert not queue_file(data_dir).exists()
        # allow= narrows the callers to the listed classes
        resp = await host.call_as("other/x", "guarded/g", "POST", "/actorkeep-queue/v1/stats")
        assert resp.status == 403
        assert not queue_file(data_dir, "guarded/g").exists()
        assert (await Remote(host, "guarded/g").stats()).ready == 0
        # a class listed in allow still cannot reach it from outside
        resp = await host.request("POST", "/guarded/g/actorkeep-queue/v1/stats", body=b"\x80")
        assert resp.status == 403


async def test_client_needs_an_actor_event() -> None:
    with pytest.raises(RuntimeError, match="no actor event"):
        await ak.queue.Client("queue/q").stats()
    with pytest.raises(ValueError):
        ak.queue.Client("not an address")


async def test_a_redrive_moves_the_dead_letters_a_page_at_a_time(
    data_dir: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """250 dead letters, in two groups and in none: a redrive of all of them reads 100 at a
    time (never every body at once), and each group's messages come back in their order."""
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        await q.configure(Config(max_attempts=1))
        groups = [("a", "b", None)[i % 3] for i in range(250)]
        await q.send_batch([f"{i}".encode() for i in range(250)], groups=groups)
        while leases := await q.lease(max=100, visibility=10):
            await q.settle([Retry(x.id, x.attempt, 0.0, "no") for x in leases])
        assert len(await q.dead_letters(limit=1000)) == 250
        read = rows_read(
            monkeypatch, "SELECT id, body, enqueued_at, priority, grp FROM actorkeep_queue_dead"
        )
        assert await q.redrive() == 250
        assert read == [100, 100, 50, 0], read
        got: list[int] = []
        while leases := await q.lease(max=100, visibility=10):
            got += [int(x.body) for x in leases]
            await q.settle([Ack(x.id, x.attempt) for x in leases])
        assert sorted(got) == list(range(250))
        for group in ("a", "b"):
            mine = [i for i in got if groups[i] == group]
            assert mine == sorted(mine), group
