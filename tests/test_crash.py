"""The crash suite (``bench/crash.py``): its checks, and a short run against a real host.

The checks are fed fabricated states first, a consistent one and then one broken in each way
they exist to catch, so that a check that cannot fail shows up here. The slow test runs the
suite's short form: 3 kill -9 cycles of ``actorkeep serve`` with the jobs example under load.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from actorkeep.kv import shard_for
from bench.crash import SHARDS, Ledger, Snapshot, check_all, run

PUT = b"settings/a"
COUNTER = b"counter-0"


def event(tag: str, fails: bool = False) -> bytes:
    return json.dumps({"type": "crash", "tag": tag, **({"fail": True} if fails else {})}).encode()


def shard(key: bytes) -> int:
    return shard_for(key, SHARDS)


def consistent() -> tuple[Ledger, Snapshot]:
    """A state the checks must accept: puts superseded by an unanswered one that applied, a
    counter one past its acknowledged increments (an unanswered one), a redelivered message,
    a dead job that always fails, a message still queued."""
    ledger = Ledger()
    ledger.put_tried[PUT] = {b"v1", b"v2", b"v3"}
    ledger.put_acked[PUT] = {b"v1": 1, b"v2": 2}
    ledger.bump_acked[COUNTER] = [(1, 4), (2, 5)]
    ledger.bump_unanswered[COUNTER] = 1
    ledger.send_tried = {"t1": False, "t2": True, "t3": False, "t4": False}
    ledger.send_acked = {1: "t1", 2: "t2", 3: "t3"}
    snap = Snapshot(
        kv={PUT: (b"v3", 3, shard(PUT)), COUNTER: (b"3", 6, shard(COUNTER))},
        seq=dict.fromkeys(range(SHARDS), 1000),
        queued={3: event("t3")},
        dead={2: event("t2", fails=True)},
        delivered={1: [(1, event("t1")), (2, event("t1"))]},
    )
    return ledger, snap


def test_a_consistent_state_passes() -> None:
    ledger, snap = consistent()
    assert check_all(ledger, snap, settled=False) == []
    # Checked again (versions and counter floors are remembered): still consistent.
    assert check_all(ledger, snap, settled=False) == []
    del snap.queued[3]
    snap.delivered[3] = [(1, event("t3"))]
    assert check_all(ledger, snap, settled=True) == []


Break = Callable[[Ledger, Snapshot], object]


def _set(table: dict[bytes, tuple[bytes, int, int]], key: bytes, value: bytes, ver: int) -> None:
    table[key] = (value, ver, shard(key))


def _unanswered_failing_job_delivered(ledger: Ledger, snap: Snapshot) -> None:
    ledger.send_tried["t5"] = True
    snap.delivered[5] = [(1, event("t5", fails=True))]


BROKEN: list[tuple[str, Break, str]] = [
    ("put lost", lambda led, s: s.kv.pop(PUT), "lost; acknowledged at version 2"),
    ("put rolled back", lambda led, s: _set(s.kv, PUT, b"v1", 1), "older than the acknowledged"),
    ("put's version holds another value", lambda led, s: _set(s.kv, PUT, b"v3", 2), "acknowl"),
    ("put value nobody sent", lambda led, s: _set(s.kv, PUT, b"zz", 7), "which no client sent"),
    (
        "version reused by another key",
        lambda led, s: s.kv.__setitem__(b"settings/b", (b"x", 2, shard(PUT))),
        "version reused",
    ),
    (
        "version above the durable reservation",
        lambda led, s: s.seq.__setitem__(shard(PUT), 2),
        "above the durable reservation",
    ),
    ("counter lost an increment", lambda led, s: _set(s.kv, COUNTER, b"1", 4), "was acked"),
    (
        "counter value acknowledged twice",
        lambda led, s: led.bump_acked[COUNTER].append((2, 7)),
        "acknowledged to two increments",
    ),
    (
        "counter versions out of order",
        lambda led, s: led.bump_acked.__setitem__(COUNTER, [(1, 5), (2, 4)]),
        "not above",
    ),
    ("counter gained increments", lambda led, s: _set(s.kv, COUNTER, b"9", 12), "only 3"),
    ("send lost", lambda led, s: s.delivered.pop(1), "message 1: acknowledged send lost"),
    (
        "delivered and dead",
        lambda led, s: s.dead.__setitem__(1, event("t1")),
        "both delivered and dead-lettered",
    ),
    (
        "failing job delivered",
        lambda led, s: s.delivered.__setitem__(2, [(1, event("t2", fails=True))]),
        "always fails was recorded as delivered",
    ),
    ("one send, two messages", lambda led, s: s.queued.__setitem__(4, event("t3")), "sent once"),
    ("phantom message", lambda led, s: s.queued.__setitem__(5, event("nobody")), "no client"),
    (
        "id names another message",
        lambda led, s: s.delivered.__setitem__(1, [(1, event("t4"))]),
        "acknowledged as 't1'",
    ),
    (
        "one id, two bodies",
        lambda led, s: s.delivered.__setitem__(3, [(1, event("t4"))]),
        "holds 't4' (delivered) and 't3'",
    ),
    (
        "failing job sent without an answer, then delivered",
        _unanswered_failing_job_delivered,
        "message 5: a job that always fails was recorded as delivered",
    ),
]


@pytest.mark.parametrize(("label", "brk", "expected"), BROKEN, ids=[b[0] for b in BROKEN])
def test_each_inconsistency_is_reported(label: str, brk: Break, expected: str) -> None:
    ledger, snap = consistent()
    brk(ledger, snap)
    problems = check_all(ledger, snap, settled=False)
    assert any(expected in p for p in problems), problems


def test_a_counter_that_goes_back_between_checks_is_reported() -> None:
    ledger, snap = consistent()
    assert check_all(ledger, snap, settled=False) == []  # remembers 3
    _set(snap.kv, COUNTER, b"2", 5)  # the acknowledged state, but below what was seen on disk
    assert check_all(ledger, snap, settled=False) == [f"{COUNTER!r}: went back from 3 to 2"]


def test_a_version_reused_after_the_row_was_overwritten_is_reported() -> None:
    ledger, snap = consistent()
    assert check_all(ledger, snap, settled=False) == []  # remembers version 3 of PUT's shard
    _set(snap.kv, PUT, b"v2", 2)
    snap.kv[b"settings/other"] = (b"new", 3, shard(PUT))  # version 3 again, another value
    problems = check_all(ledger, snap, settled=False)
    assert any("version reused" in p and "version 3" in p for p in problems), problems


def test_a_message_left_queued_after_the_drain_is_reported() -> None:
    ledger, snap = consistent()
    assert check_all(ledger, snap, settled=True) == [
        "message 3: still queued after the queue drained"
    ]


@pytest.mark.slow
def test_kill_9_cycles_lose_nothing(tmp_path: Path) -> None:
    seed = random.randrange(2**32)
    print(f"crash suite seed {seed}: python bench/crash.py --cycles 3 --seed {seed}")
    report = run(tmp_path / "data", cycles=3, seed=seed)
    print(report.summary())
    assert report.cycles == 3 and len(report.drain_s) == 3
    assert report.puts > 0 and report.bumps > 0 and report.sends > 0
    assert report.delivered > 0 and report.dead > 0  # both endings of a job were seen
