"""Queues against a model: lease ordering, and random operation lists checked for exact
results and for accounting (every acknowledged send ends acked, dead or still present;
attempts never go down; stale acks change nothing)."""

from __future__ import annotations

import random
import sqlite3
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from actorkeep.queue import Config
from actorkeep.testing import open_host
from queues.queue import backoff
from tests.queue_support import Remote, app, now, queue_file

MAX_ATTEMPTS = 3
SEED = 1234


def run(main: Callable[[Path], Awaitable[None]]) -> None:
    async def wrapped() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            await main(Path(tmp))

    trio.run(wrapped, clock=trio.testing.MockClock(autojump_threshold=0))


# -- lease ordering --------------------------------------------------------------------------

_sends = st.lists(
    st.tuples(
        st.integers(-2, 2),  # priority
        st.sampled_from([0.0, 0.0, 1.0, 2.5, 10.0]),  # delay
        st.sampled_from([0.0, 0.0, 0.5, 3.0]),  # time passing before this send
    ),
    min_size=5,
    max_size=25,
)


@settings(max_examples=40, deadline=None)
@given(_sends, st.integers(1, 7))
def test_lease_order_matches_the_model(sends: list[tuple[int, float, float]], chunk: int) -> None:
    async def main(tmp: Path) -> None:
        async with open_host(app, tmp) as host:
            q = Remote(host)
            expected: list[tuple[int, float, int]] = []  # (priority, visible_at, id)
            for priority, delay, pause in sends:
                await trio.sleep(pause)
                t = now(host)
                i = await q.send(b"m", delay=delay, priority=priority)
                expected.append((priority, t + delay, i))
            await trio.sleep(11)
            order = sorted(expected, key=lambda e: (-e[0], e[1], e[2]))
            got: list[int] = []
            while True:
                leases = await q.lease(max=chunk, visibility=100)
                if not leases:
                    break
                got += [x.id for x in leases]
            assert got == [e[2] for e in order]

    run(main)


# -- random operation lists ----------------------------------------------------------------


@dataclass
class Msg:
    priority: int
    visible_at: float
    attempts: int = 0
    leased: bool = False
    last_error: str | None = None


@dataclass
class Model:
    """The queue as the spec describes it."""

    rng: random.Random
    live: dict[int, Msg] = field(default_factory=dict)
    dead: dict[int, str] = field(default_factory=dict)
    acked: set[int] = field(default_factory=set)
    cancelled: set[int] = field(default_factory=set)
    sent: set[int] = field(default_factory=set)

    def sweep(self, t: float) -> None:
        for i, m in sorted(self.live.items()):
            if m.attempts >= MAX_ATTEMPTS and m.visible_at <= t:
                self.dead[i] = m.last_error or "max attempts exceeded"
                del self.live[i]

    def lease(self, t: float, n: int, visibility: float) -> list[tuple[int, int]]:
        self.sweep(t)
        ready = sorted(
            (i for i, m in self.live.items() if m.visible_at <= t),
            key=lambda i: (-self.live[i].priority, self.live[i].visible_at, i),
        )[:n]
        out = []
        for i in ready:
            m = self.live[i]
            m.attempts += 1
            m.leased = True
            m.visible_at = t + visibility
            out.append((i, m.attempts))
        return out

    def current(self, i: int, attempt: int) -> Msg | None:
        m = self.live.get(i)
        return m if m is not None and m.leased and m.attempts == attempt else None

    def ack(self, i: int, attempt: int) -> bool:
        if self.current(i, attempt) is None:
            return False
        del self.live[i]
        self.acked.add(i)
        return True

    def retry(self, t: float, i: int, attempt: int, delay: float | None, error: str) -> bool:
        m = self.current(i, attempt)
        if m is None:
            return False
        m.last_error = error
        if m.attempts >= MAX_ATTEMPTS:
            self.dead[i] = error
            del self.live[i]
            return True
        if delay is None:
            delay = backoff(m.attempts, 1.0, 300.0, self.rng.random())
        m.leased = False
        m.visible_at = t + delay
        return True

    def extend(self, t: float, i: int, attempt: int, visibility: float) -> bool:
        m = self.current(i, attempt)
        if m is None:
            return False
        m.visible_at = t + visibility
        return True

    def cancel(self, i: int) -> bool:
        if self.live.pop(i, None) is None:
            return False
        self.cancelled.add(i)
        return True

    def stats(self, t: float) -> tuple[int, int, int, int]:
        self.sweep(t)
        ready = sum(m.visible_at <= t for m in self.live.values())
        delayed = sum(m.visible_at > t and not m.leased for m in self.live.values())
        leased = sum(m.visible_at > t and m.leased for m in self.live.values())
        return ready, delayed, leased, len(self.dead)


_lease_op = st.tuples(st.just("lease"), st.integers(1, 4), st.sampled_from([1.0, 1.0, 5.0, 20.0]))
_sleep_op = st.tuples(st.just("sleep"), st.just(0), st.sampled_from([0.5, 1.0, 1.0, 3.0, 25.0]))
_op = st.one_of(
    st.tuples(st.just("send"), st.integers(-1, 1), st.sampled_from([0.0, 0.0, 2.0, 7.0])),
    st.tuples(st.just("batch"), st.integers(1, 5), st.sampled_from([0.0, 3.0])),
    _lease_op,
    _lease_op,
    st.tuples(st.just("ack"), st.integers(0, 50), st.just(0.0)),
    st.tuples(st.just("ack"), st.integers(0, 50), st.just(0.0)),
    st.tuples(st.just("retry"), st.integers(0, 50), st.sampled_from([None, 0.0, 4.0])),
    st.tuples(st.just("extend"), st.integers(0, 50), st.sampled_from([1.0, 10.0])),
    st.tuples(st.just("cancel"), st.integers(0, 50), st.just(0.0)),
    _sleep_op,
    _sleep_op,
)


def read_table(path: Path) -> tuple[dict[int, tuple[int, float, int, int]], set[int]]:
    conn = sqlite3.connect(path)
    try:
        live = {
            r[0]: (r[1], r[2], r[3], r[4])
            for r in conn.execute(
                "SELECT id, attempts, visible_at, leased, priority FROM actorkeep_queue"
            )
        }
        dead = {r[0] for r in conn.execute("SELECT id FROM actorkeep_queue_dead")}
    finally:
        conn.close()
    return live, dead


@settings(max_examples=150, deadline=None)
@given(st.lists(_op, min_size=20, max_size=60))
def test_random_operations_match_the_model(ops: list[tuple[str, int, Any]]) -> None:
    async def main(tmp: Path) -> None:
        async with open_host(app, tmp, rng=random.Random(SEED)) as host:
            q = Remote(host)
            await q.configure(Config(max_attempts=MAX_ATTEMPTS))
            model = Model(random.Random(SEED))
            leases: list[tuple[int, int]] = []  # every lease ever handed out, stale ones too
            highest_attempts: dict[int, int] = {}
            for step, (kind, a, b) in enumerate(ops):
                t = now(host)
                before = read_table(queue_file(tmp))
                if kind == "send":
                    i = await q.send(f"{step}".encode(), delay=b, priority=a)
                    model.live[i] = Msg(a, t + b)
                    model.sent.add(i)
                elif kind == "batch":
                    ids = await q.send_batch([b"x"] * a, delay=b)
                    assert ids == sorted(ids) and len(set(ids)) == a
                    for i in ids:
                        model.live[i] = Msg(0, t + b)
                        model.sent.add(i)
                elif kind == "lease":
                    got = [(x.id, x.attempt) for x in await q.lease(max=a, visibility=b)]
                    assert got == model.lease(t, a, b)
                    leases += got
                elif kind == "sleep":
                    await trio.sleep(b)
                    t = now(host)
                    st_ = await q.stats()
                    assert (st_.ready, st_.delayed, st_.leased, st_.dead) == model.stats(t)
                elif not leases:
                    continue
                else:
                    i, attempt = leases[a % len(leases)]
                    if kind == "ack":
                        ok = await q.ack(i, attempt)
                        assert ok == model.ack(i, attempt)
                    elif kind == "retry":
                        ok = await q.retry(i, attempt, delay=b, error=f"e{step}")
                        assert ok == model.retry(t, i, attempt, b, f"e{step}")
                    elif kind == "extend":
                        ok = await q.extend(i, attempt, b)
                        assert ok == model.extend(t, i, attempt, b)
                    else:
                        ok = await q.cancel(i)
                        assert ok == model.cancel(i)
                    if not ok:  # a stale lease changes nothing
                        assert read_table(queue_file(tmp)) == before
                live, dead = read_table(queue_file(tmp))
                # exact state: the queue may have dead-lettered earlier than the model (its
                # alarm), so compare after the model sweeps as of now
                model.sweep(now(host))
                assert set(live) == set(model.live), (kind, step)
                assert dead == set(model.dead)
                for i, (attempts, visible_at, leased, priority) in live.items():
                    m = model.live[i]
                    assert (attempts, visible_at, bool(leased), priority) == (
                        m.attempts,
                        m.visible_at,
                        m.leased,
                        m.priority,
                    )
                    assert attempts >= highest_attempts.get(i, 0)  # never goes down
                    highest_attempts[i] = attempts
                # accounting: every acknowledged send is acked, cancelled, dead or present
                assert model.sent == set(live) | dead | model.acked | model.cancelled
                assert not (set(live) & dead)
            final = await q.stats()
            assert (final.ready, final.delayed, final.leased, final.dead) == model.stats(now(host))

    run(main)
