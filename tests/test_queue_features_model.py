"""Keys and groups against a model: random lists of keyed, grouped, replacing and remembering
sends, leases, acks, retries, fails and cancels, with every answer, every lease and the
queue's stored rows compared with the model after each step."""

from __future__ import annotations

import contextlib
import sqlite3
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from actorkeep.queue import Config
from actorkeep.testing import open_host
from tests.queue_support import Remote, app, check_chains, now, queue_file

VISIBILITY = 1000.0  # leases never run out here: the model has no lease ends
REMEMBER = 5.0


@dataclass
class Msg:
    key: str | None
    group: str | None
    body: bytes
    visible_at: float
    blocked: bool
    attempts: int = 0
    leased: bool = False


@dataclass
class Model:
    """The spec of docs/queues.md for keys and groups, message by message."""

    live: dict[int, Msg] = field(default_factory=dict)
    dead: set[int] = field(default_factory=set)
    remembered: dict[str, tuple[int, float]] = field(default_factory=dict)

    def send(self, t: float, i_new: int, body: bytes, delay: float, key: str | None,
             group: str | None, replace: bool, remember: bool) -> int | None:  # fmt: skip
        """The id the send answers if it queues nothing, else None (the caller adds it)."""
        if key is not None:
            for i, m in self.live.items():
                if m.key == key:
                    if replace and not m.leased:
                        m.body = body
                        m.visible_at = max(m.visible_at, t + delay)
                    return i
            hit = self.remembered.get(key)
            if hit is not None and hit[1] > t:
                return hit[0]
        blocked = group is not None and any(m.group == group for m in self.live.values())
        self.live[i_new] = Msg(key, group, body, t + delay, blocked)
        return None

    def lease(self, t: float, n: int) -> list[tuple[int, int]]:
        ready = sorted(
            (m.visible_at, i) for i, m in self.live.items() if not m.blocked and m.visible_at <= t
        )
        out = []
        for _, i in ready[:n]:
            m = self.live[i]
            m.attempts += 1
            m.leased = True
            m.visible_at = t + VISIBILITY
            out.append((i, m.attempts))
        return out

    def current(self, i: int, attempt: int) -> Msg | None:
        m = self.live.get(i)
        return m if m is not None and m.leased and m.attempts == attempt else None

    def gone(self, t: float, i: int) -> Msg:
        m = self.live.pop(i)
        if m.group is not None:
            rest = [j for j, o in self.live.items() if o.group == m.group]
            if rest and self.live[min(rest)].blocked:
                head = self.live[min(rest)]
                head.blocked = False
                head.visible_at = max(head.visible_at, t)
        return m

    def ack(self, t: float, i: int, attempt: int, remember: dict[int, bool]) -> bool:
        if self.current(i, attempt) is None:
            return False
        m = self.gone(t, i)
        if m.key is not None and remember.get(i):
            self.remembered[m.key] = (i, t + REMEMBER)
        return True

    def retry(self, t: float, i: int, attempt: int) -> bool:
        m = self.current(i, attempt)
        if m is None:
            return False
        m.leased, m.visible_at = False, t
        return True

    def fail(self, t: float, i: int, attempt: int) -> bool:
        if self.current(i, attempt) is None:
            return False
        self.gone(t, i)
        self.dead.add(i)
        return True

    def cancel(self, t: float, i: int) -> bool:
        if i not in self.live:
            return False
        self.gone(t, i)
        return True


_key = st.sampled_from([None, None, "a", "b", "c"])
_group = st.sampled_from([None, None, "g", "h"])
_op = st.one_of(
    st.tuples(
        st.just("send"),
        st.tuples(_key, _group, st.booleans(), st.booleans(), st.sampled_from([0.0, 0.0, 2.0])),
    ),
    st.tuples(st.just("lease"), st.integers(1, 4)),
    st.tuples(st.just("lease"), st.integers(1, 4)),
    st.tuples(st.sampled_from(["ack", "ack", "retry", "fail", "cancel"]), st.integers(0, 40)),
    st.tuples(st.just("sleep"), st.sampled_from([0.5, 1.0, 3.0, 6.0])),
)


def stored(path: Path) -> dict[int, tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(
            "SELECT id, key, grp, body, visible_at, blocked, attempts, leased FROM actorkeep_queue"
        )
        return {r[0]: r[1:] for r in rows}
    finally:
        conn.close()


@settings(max_examples=100, deadline=None)
@given(st.lists(_op, min_size=15, max_size=50))
def test_keys_and_groups_match_the_model(ops: list[tuple[str, Any]]) -> None:
    async def main(tmp: Path) -> None:
        async with open_host(app, tmp) as host:
            q = Remote(host)
            await q.configure(Config(max_attempts=1000, visibility=VISIBILITY))
            model = Model()
            leases: list[tuple[int, int]] = []
            sent: list[int] = []
            remember: dict[int, bool] = {}
            for step, (kind, arg) in enumerate(ops):
                t = now(host)
                if kind == "send":
                    key, group, replace, keep, delay = arg
                    body = f"{step}".encode()
                    got = await q.send(
                        body,
                        delay=delay,
                        key=key,
                        group=group,
                        on_duplicate="replace" if replace else "keep",
                        remember=REMEMBER if keep else None,
                    )
                    answered = model.send(t, got, body, delay, key, group, replace, keep)
                    assert got == (got if answered is None else answered), step
                    if answered is None:
                        assert got not in sent  # a new message: a new id
                        sent.append(got)
                        remember[got] = keep
                elif kind == "lease":
                    got = [(x.id, x.attempt) for x in await q.lease(max=arg, visibility=VISIBILITY)]
                    assert got == model.lease(t, arg), step
                    leases += got
                elif kind == "sleep":
                    await trio.sleep(arg)
                elif kind == "cancel" and sent:
                    i = sent[arg % len(sent)]
                    assert await q.cancel(i) == model.cancel(t, i), step
                elif leases and kind != "cancel":
                    i, attempt = leases[arg % len(leases)]
                    if kind == "ack":
                        assert await q.ack(i, attempt) == model.ack(t, i, attempt, remember)
                    elif kind == "retry":
                        assert await q.retry(i, attempt, delay=0.0) == model.retry(t, i, attempt)
                    else:
                        assert await q.fail(i, attempt, "no") == model.fail(t, i, attempt)
                rows = stored(queue_file(tmp))
                assert set(rows) == set(model.live), step
                for i, (key, group, body, visible_at, blocked, attempts, leased) in rows.items():
                    m = model.live[i]
                    assert (key, group, body, bool(blocked), attempts, bool(leased)) == (
                        m.key, m.group, m.body, m.blocked, m.attempts, m.leased
                    ), (step, i)  # fmt: skip
                    assert abs(visible_at - m.visible_at) < 1e-6, (step, i)
                with contextlib.closing(sqlite3.connect(queue_file(tmp))) as conn:
                    check_chains(conn)
            stats = await q.stats()
            assert stats.groups == len({m.group for m in model.live.values()} - {None})

    async def wrapped() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            await main(Path(tmp))

    trio.run(wrapped, clock=trio.testing.MockClock(autojump_threshold=0))
