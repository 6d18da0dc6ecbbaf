"""Queues, bad input: refused client-side with ValueError before any call, 400 on the wire,
and nothing written either way. The frame decoder is fuzzed with hypothesis."""

from __future__ import annotations

import contextlib
import functools
import math
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from actorkeep import codec, wire
from actorkeep.queue import Ack, Retry, RetryLater
from actorkeep.testing import open_host
from actorkeep.wire import queue, queue_checks
from tests.queue_support import Remote, app, queue_file, raw, table_rows

BAD_SECONDS = [-1, -0.001, math.nan, math.inf, -math.inf, "1", None, True, 2e9]

Call = Callable[[Any], Awaitable[Any]]


def seconds_calls(d: object) -> list[tuple[str, Call]]:
    """Calls that each pass the bad number of seconds ``d``."""
    calls: list[tuple[str, Call]] = [
        (f"send delay={d!r}", lambda q: q.send(b"x", delay=d)),
        (f"send_delayed {d!r}", lambda q: q.send_delayed(b"x", d)),
        (f"lease visibility={d!r}", lambda q: q.lease(1, d)),
        (f"extend {d!r}", lambda q: q.extend(1, 1, d)),
    ]
    if d is not None:
        calls.append((f"retry delay={d!r}", lambda q: q.retry(1, 1, delay=d)))
    return calls


def client_calls() -> list[tuple[str, Call]]:
    """(label, call) pairs that each must raise ValueError before any call."""
    calls: list[tuple[str, Call]] = []
    for d in BAD_SECONDS:
        calls += seconds_calls(d)
    calls += [
        ("lease visibility=0", lambda q: q.lease(1, 0)),
        ("lease max=0", lambda q: q.lease(0, 1)),
        ("lease max=1001", lambda q: q.lease(1001, 1)),
        ("lease max=1.5", lambda q: q.lease(1.5, 1)),
        ("batch 1001", lambda q: q.send_batch([b"x"] * 1001)),
        ("batch empty", lambda q: q.send_batch([])),
        ("batch of str", lambda q: q.send_batch("abc")),
        ("batch bytes", lambda q: q.send_batch(b"abc")),
        ("body str", lambda q: q.send("text")),
        ("body int", lambda q: q.send(5)),
        ("body None", lambda q: q.send(None)),
        ("body too large", lambda q: q.send(b"x" * (queue_checks.MAX_BODY + 1))),
        ("priority float", lambda q: q.send(b"x", priority=1.0)),
        ("priority bool", lambda q: q.send(b"x", priority=True)),
        ("priority huge", lambda q: q.send(b"x", priority=2**40)),
        ("ack id 0", lambda q: q.ack(0, 1)),
        ("ack attempt 0", lambda q: q.ack(1, 0)),
        ("ack id str", lambda q: q.ack("1", 1)),
        ("retry error int", lambda q: q.retry(1, 1, error=5)),
        ("retry error long", lambda q: q.retry(1, 1, error="e" * 5000)),
        ("retry error surrogate", lambda q: q.retry(1, 1, error="\ud800")),
        ("settle not outcomes", lambda q: q.settle([(1, 1)])),
        ("settle 1001", lambda q: q.settle([Ack(1, 1)] * 1001)),
        ("cancel -1", lambda q: q.cancel(-1)),
        ("get None", lambda q: q.get(None)),
        ("dead_letters limit 0", lambda q: q.dead_letters(limit=0)),
        ("dead_letters after -1", lambda q: q.dead_letters(after=-1)),
        ("redrive empty", lambda q: q.redrive(ids=[])),
        ("redrive bad id", lambda q: q.redrive(ids=[0])),
        ("configure dict", lambda q: q.configure({"batch_size": 1})),
    ]
    return calls


CLIENT_CALLS = client_calls()


@pytest.mark.parametrize(("label", "call"), CLIENT_CALLS, ids=[c[0] for c in CLIENT_CALLS])
async def test_client_refuses_before_any_call(
    label: str, call: Call, data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        with pytest.raises(ValueError):
            await call(Remote(host))
        assert not queue_file(data_dir).exists()  # no call reached the queue


def test_outcome_values_check_themselves() -> None:
    for make in (
        lambda: Ack(0, 1),
        lambda: Retry(1, 1, delay=-1),
        lambda: Retry(1, 1, delay=math.nan),
        lambda: RetryLater(-5),
        lambda: RetryLater(math.inf),
    ):
        with pytest.raises(ValueError):
            make()


WIRE_GARBAGE: list[tuple[str, bytes]] = [
    ("send", b""),
    ("send", b"\xc1"),
    ("send", b"\x92\x01"),  # truncated array
    ("send", codec.pack([b"x"])),
    ("send", codec.pack({"bodies": b"x"})),
    ("send", codec.pack({"bodies": ["x"]})),
    ("send", codec.pack({"bodies": [b"x"], "delay": -1.0})),
    ("send", codec.pack({"bodies": [b"x"], "delay": math.nan})),
    ("send", codec.pack({"bodies": [b"x"], "delay": math.inf})),
    ("send", codec.pack({"bodies": [b"x"], "priority": 1.5})),
    ("send", codec.pack({"bodies": [b"x"], "extra": 1})),
    ("send", codec.pack({"bodies": [b"x"] * 1001})),
    ("send", codec.pack({"bodies": [b"ok"] * 999 + [None]})),
    ("send", codec.pack({1: 2})),
    ("lease", codec.pack({"max": 0, "visibility": 1.0})),
    ("lease", codec.pack({"max": 1, "visibility": 0.0})),
    ("lease", codec.pack({"max": 1, "visibility": -1.0})),
    ("lease", codec.pack({"max": 1})),
    ("lease", codec.pack({"max": True, "visibility": 1.0})),
    ("settle", codec.pack({"outcomes": []})),
    ("settle", codec.pack({"outcomes": [{"id": 1, "attempt": 1, "op": "nack"}]})),
    ("settle", codec.pack({"outcomes": [{"id": 1, "attempt": 1, "op": "ack", "delay": 1.0}]})),
    ("settle", codec.pack({"outcomes": [{"id": 1, "op": "ack"}]})),
    ("settle", codec.pack({"outcomes": [{"id": 1, "attempt": 1, "op": "retry", "error": 3}]})),
    ("extend", codec.pack({"id": 1, "attempt": 1, "visibility": math.nan})),
    ("cancel", codec.pack({"id": -5})),
    ("get", codec.pack({"id": 2**64 - 1})),
    ("stats", codec.pack({"x": 1})),
    ("dead_letters", codec.pack({"limit": 5000})),
    ("redrive", codec.pack({"ids": "all"})),
    ("configure", codec.pack({"config": {"batch_size": 0}})),
    ("configure", codec.pack({"config": {"consumer": 5}})),
    ("configure", codec.pack({"config": {"unknown": 5}})),
    ("configure", codec.pack({"config": {"consumer": "queue/q"}})),
    ("configure", codec.pack({"config": []})),
]


async def test_garbage_frames_get_400_and_write_nothing(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        i = await q.send(b"keep")
        before = (
            table_rows(data_dir, "actorkeep_queue"),
            table_rows(data_dir, "actorkeep_queue_config"),
        )
        for op, body in WIRE_GARBAGE:
            resp = await raw(host, op, body)
            assert resp.status == 400, (op, body, resp.status, resp.body)
            err = resp.json()
            assert err["error"] == "BadRequest" and err["message"], (op, body)
        after = (
            table_rows(data_dir, "actorkeep_queue"),
            table_rows(data_dir, "actorkeep_queue_config"),
        )
        assert after == before
        assert (await raw(host, "nope", codec.pack({}))).status == 404
        assert (await host.call_as("app/x", "queue/q", "GET", "/")).status == 404
        assert [x.id for x in await q.lease(1, 1)] == [i]


# -- fuzzing -----------------------------------------------------------------------------------

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=20)
)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.text(max_size=10) | st.integers(-(2**63), 2**63 - 1), inner, max_size=4
        )
    ),
    max_leaves=12,
)
_keys = st.sampled_from(
    ["bodies", "delay", "priority", "max", "visibility", "outcomes", "id", "attempt", "op",
     "error", "limit", "after", "ids", "config", "queue", "messages", "batch_size", "consumer"]
)  # fmt: skip
_frames = st.dictionaries(_keys, _values, max_size=5)


def _only_value_errors(fn: Callable[[], object]) -> None:
    with contextlib.suppress(ValueError):
        fn()


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200))
def test_decoders_survive_random_bytes(data: bytes) -> None:
    _only_value_errors(lambda: wire.decode(data, "frame"))
    for op in queue.QUEUE.ops.values():
        _only_value_errors(functools.partial(op.decode, data, "queue/q"))
        _only_value_errors(functools.partial(op.reply, data))


@settings(max_examples=400, deadline=None)
@given(_frames, _values)
def test_decoders_survive_random_frames(frame: dict[str, Any], value: Any) -> None:
    body = codec.pack(frame)
    for op in queue.QUEUE.ops.values():
        _only_value_errors(functools.partial(op.decode, body, "queue/q"))
        _only_value_errors(functools.partial(op.reply, body))
    _only_value_errors(lambda: queue.outcome_from_wire(frame))
    _only_value_errors(lambda: queue.outcome_from_wire(value))
    _only_value_errors(lambda: queue.lease_from_wire(value))
    _only_value_errors(lambda: queue.Config.from_wire(frame))
    _only_value_errors(lambda: queue.Config.from_wire(value))
    _only_value_errors(lambda: queue_checks.check_bodies(value))


OPS = ["send", "lease", "settle", "extend", "cancel", "get", "stats", "dead_letters", "redrive",
       "configure", "config"]  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(OPS), _frames | _values.map(lambda v: {"bodies": v}))
def test_the_queue_answers_random_frames_with_a_status(op: str, frame: dict[str, Any]) -> None:
    """Whatever the frame, the queue answers 200 or 400 (never 500) and stays usable."""
    try:
        body = codec.pack(frame)
    except (ValueError, TypeError, OverflowError):
        return

    async def main() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            async with open_host(app, tmp) as host:
                resp = await raw(host, op, body, "queue/fuzz")
                assert resp.status in (200, 400), (op, frame, resp.status, resp.body)
                assert (await raw(host, "stats", codec.pack({}), "queue/fuzz")).status == 200

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_spans_too_short_to_move_the_clock_are_refused() -> None:
    from actorkeep.wire.queue_checks import MIN_SPAN, check_positive_seconds

    assert check_positive_seconds(MIN_SPAN, "visibility") == MIN_SPAN
    for tiny in (1e-320, 1e-9, 0.0009):
        with pytest.raises(ValueError, match="at least"):
            check_positive_seconds(tiny, "visibility")
