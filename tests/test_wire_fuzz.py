"""Fuzzing the KV and queue wire frames sent by an internal caller (docs/reference.md §7, §8, §13).

Each example opens a host with a KV shard and a queue that already hold data, sends one frame
(operation, method, caller, headers and body: two thirds plausible frames near the limits, one
third anything) straight to the protocol with ``host.call_as``, and checks: no 5xx; a refused
frame (4xx) changes no row of any database and creates no file (also for an address that had
none: ``test_a_refused_frame_to_a_new_address_creates_no_file``); the host keeps answering.
Forged ``x-actorkeep-*`` headers never change the caller the receiver sees.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import actorkeep as ak
import queues
import shards
from actorkeep import codec
from actorkeep.queue import PREFIX as QUEUE_PREFIX
from actorkeep.testing import TestHost, open_host
from actorkeep.wire.kv import KV

from .test_front_fuzz import contents, file_list

app = ak.App()
app.mount(shards.KVShard, "kv", access="internal", allow=["app"])
app.mount(queues.Queue, "queue", access="internal", allow=["app"])


@app.actor("echo")
class Echo(ak.Actor):
    @ak.route("POST", "/echo")
    async def echo(self, req: ak.Request) -> ak.Response:
        reserved = {k: v for k, v in req.headers.items() if k.startswith("x-actorkeep-")}
        return ak.Response.json({"caller": req.caller, "reserved": reserved})


MSGPACK = {"content-type": codec.MSGPACK}
ALLOWED = "app/x"
STATUSES = (200, 400, 403, 404, 409)

# -- strategies -----------------------------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(),
    st.binary(max_size=8),
    st.text(max_size=8),
    st.sampled_from([0, 1, 2, 3, -1, 1000, 1001, 1e9, 2e9, math.nan, b"a", "a", b"k" * 2049]),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=8) | st.integers(-3, 3), inner, max_size=3)
    ),
    max_leaves=8,
)
methods = st.sampled_from(["POST"] * 8 + ["GET", "PUT"])
callers = st.sampled_from([ALLOWED] * 8 + ["intruder/y"])
forged = st.dictionaries(
    st.sampled_from(
        ["x-actorkeep-caller", "X-Actorkeep-Caller", "x-actorkeep-chain", "content-type"]
    ),
    st.sampled_from(["app/x", "kv/shard-0", "queue/q", codec.MSGPACK, "text/plain", ""]),
    max_size=2,
)


def frames(fields: list[str]) -> st.SearchStrategy[bytes]:
    """Anything: maps of the protocol's field names (and others) to any value, other msgpack,
    and bytes that are not msgpack at all."""
    keys = st.sampled_from([*fields, "zz", ""])
    return st.one_of(
        st.dictionaries(keys, values, max_size=5).map(codec.pack),
        values.map(codec.pack),
        st.binary(max_size=40),
        st.sampled_from([b"", b"\xc1", b"\x92\x01", b"\x81\xa1k"]),
    )


def frame(
    required: dict[str, st.SearchStrategy[Any]], **optional: st.SearchStrategy[Any]
) -> st.SearchStrategy[bytes]:
    """A plausible frame: the required fields and any subset of the optional ones, with values
    near the limits (so that most operations run and some are refused)."""
    return st.fixed_dictionaries(required, optional=optional).map(codec.pack)


def requests(
    plausible: dict[str, st.SearchStrategy[bytes]], ops: list[str], fields: list[str]
) -> st.SearchStrategy[tuple[str, bytes]]:
    """(operation, body): two thirds plausible frames for their operation, one third anything."""
    good = st.one_of([st.tuples(st.just(op), body) for op, body in plausible.items()])
    wild_ops = st.sampled_from(ops) | st.text(alphabet="abz-_/", max_size=6)
    return st.one_of(good, good, st.tuples(wild_ops, frames(fields)))


keys = st.sampled_from([b"a", b"b", b"c", b"new", "a", b"", b"k" * 2048, b"k" * 2049, 5])
kv_versions = st.sampled_from([None, 0, 1, 2, 3, 4, 1000, 1001, 2**40, -1, True])
ttls = st.sampled_from([None, 0, 0.0001, 0.5, 60, 1e9, 1e12, math.nan])
kv_put = frame(
    {"key": keys, "value": st.binary(max_size=6) | st.just("text")},
    expect=kv_versions,
    ttl=ttls,
    local=st.booleans() | st.just(1),
)
KV_REQUESTS = requests(
    {
        "get": frame({"key": keys}),
        "put": kv_put,
        "put_now": kv_put,
        "delete": frame({"key": keys}, expect=kv_versions),
        "list": frame(
            {},
            prefix=keys,
            after=keys | st.none(),
            limit=st.sampled_from([0, 1, 2, 1000, 1001]),
        ),
    },
    ["get", "put", "put_now", "delete", "list", "nope", "", "put/x", "GET"],
    ["key", "value", "expect", "ttl", "local", "prefix", "after", "limit"],
)
KV_PREFIX = KV.prefix

ids = st.integers(-1, 6)
attempts = st.integers(0, 3)
seconds = st.sampled_from([0, 0.0005, 0.5, 30.0, 1e9, 2e9, -1.0, math.inf])
config = st.fixed_dictionaries(
    {},
    optional={
        "consumer": st.sampled_from([None, "echo/e", "queue/q", "bad"]),
        "batch_size": st.sampled_from([0, 1, 10]),
        "visibility": seconds,
        "max_attempts": st.sampled_from([0, 1, 5]),
        "backoff_base": seconds,
        "backoff_max": seconds,
        "dead_retention": st.sampled_from([None, 0, 60.0]),
        "zz": st.just(1),
    },
)
outcome = st.fixed_dictionaries(
    {"id": ids, "attempt": attempts, "op": st.sampled_from(["ack", "retry", "nack"])},
    optional={"delay": seconds, "error": st.text(max_size=5)},
)
QUEUE_REQUESTS = requests(
    {
        "send": frame(
            {"bodies": st.lists(st.binary(max_size=6), max_size=3) | st.sampled_from([b"x", [1]])},
            delay=seconds,
            priority=st.sampled_from([0, 1, -1, 2**31, 1.5]),
        ),
        "lease": frame({"max": st.sampled_from([0, 1, 2, 1001]), "visibility": seconds}),
        "settle": frame({"outcomes": st.lists(outcome, max_size=3)}),
        "extend": frame({"id": ids, "attempt": attempts, "visibility": seconds}),
        "cancel": frame({"id": ids}),
        "get": frame({"id": ids}),
        "stats": frame({}),
        "config": frame({}),
        "dead_letters": frame({}, limit=st.sampled_from([0, 1, 1001]), after=ids | st.none()),
        "redrive": frame({}, ids=st.sampled_from([None, [], [1], [1, 2], [0]])),
        "configure": frame({"config": config}),
    },
    ["send", "lease", "settle", "deliver", "nope", "", "send/x"],
    ["bodies", "delay", "priority", "max", "visibility", "outcomes", "id", "attempt", "op",
     "error", "limit", "after", "ids", "config", "consumer", "batch_size"],
)  # fmt: skip


# -- the property ---------------------------------------------------------------------------


async def _call(host: TestHost, address: str, path: str, frame: dict[str, Any]) -> Any:
    resp = await host.call_as(ALLOWED, address, "POST", path, codec.pack(frame), MSGPACK)
    assert resp.status == 200, (address, path, frame, resp.status, resp.body)
    return codec.unpack(resp.body)


async def kv_baseline(host: TestHost) -> None:
    steps: list[tuple[str, dict[str, Any]]] = [
        ("put", {"key": b"a", "value": b"1"}),
        ("put", {"key": b"b", "value": b"2", "local": True}),
        ("put", {"key": b"c", "value": b"3", "local": True}),
        ("delete", {"key": b"c"}),
    ]
    for op, frame_ in steps:
        await _call(host, "kv/shard-0", KV_PREFIX + op, frame_)


async def kv_alive(host: TestHost) -> None:
    probe = {"key": b"zz-probe", "value": b"p", "local": True}
    put = await _call(host, "kv/shard-0", KV_PREFIX + "put", probe)
    got = await _call(host, "kv/shard-0", KV_PREFIX + "get", {"key": b"zz-probe"})
    assert got["entry"][:2] == [b"p", put["version"]]


async def queue_baseline(host: TestHost) -> None:
    await _call(host, "queue/q", f"{QUEUE_PREFIX}/send", {"bodies": [b"m1", b"m2", b"m3"]})
    await _call(host, "queue/q", f"{QUEUE_PREFIX}/lease", {"max": 1, "visibility": 60.0})


async def queue_alive(host: TestHost) -> None:
    # Delayed, so that a push consumer the frame configured cannot take it before we look.
    send = {"bodies": [b"probe"], "delay": 3600.0}
    (probe,) = (await _call(host, "queue/q", f"{QUEUE_PREFIX}/send", send))["ids"]
    job = (await _call(host, "queue/q", f"{QUEUE_PREFIX}/get", {"id": probe}))["job"]
    assert (job["state"], job["body"]) == ("delayed", b"probe")


Step = Callable[[TestHost], Awaitable[None]]


def check_one_frame(
    baseline: Step,
    alive: Step,
    caller: str,
    address: str,
    method: str,
    path: str,
    body: bytes,
    headers: dict[str, str],
) -> None:
    """Send one frame to a host whose ``baseline`` put data in; check the properties."""

    async def main() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            data = Path(tmp)
            async with open_host(app, data) as host:
                await baseline(host)
                await trio.sleep(1)  # the baseline's new actors are registered (registry.py)
                files, rows = file_list(data), contents(data)
                resp = await host.call_as(caller, address, method, path, body, headers)
                event(f"{address} answered {resp.status}")
                assert resp.status in STATUSES, (resp.status, resp.body)
                if resp.status != 200:
                    assert {"error", "message"} <= set(resp.json()), resp.body
                if 400 <= resp.status < 500:  # refused, or a conflict (409)
                    after = contents(data)
                    if resp.status == 409:  # a conflict is an answer: the actor had to look,
                        # so it may be new, and registered as such (registry.py)
                        for snapshot in (rows, after):
                            snapshot.get("host/host.sqlite", {}).pop("actors", None)
                    assert {f: after.get(f) for f in rows} == rows  # no row changed
                    if resp.status != 409:
                        assert file_list(data) == files  # no file created
                await alive(host)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(
    caller=callers,
    address=st.sampled_from(["kv/shard-0", "kv/shard-0", "kv/shard-1"]),
    method=methods,
    request=KV_REQUESTS,
    headers=forged,
)
def test_kv_frames(
    caller: str, address: str, method: str, request: tuple[str, bytes], headers: dict[str, str]
) -> None:
    op, body = request
    check_one_frame(
        kv_baseline,
        kv_alive,
        caller,
        address,
        method,
        KV_PREFIX + op,
        body,
        headers,
    )


@SETTINGS
@given(
    caller=callers,
    address=st.sampled_from(["queue/q", "queue/q", "queue/fresh"]),
    method=methods,
    request=QUEUE_REQUESTS,
    headers=forged,
)
def test_queue_frames(
    caller: str, address: str, method: str, request: tuple[str, bytes], headers: dict[str, str]
) -> None:
    op, body = request
    check_one_frame(
        queue_baseline,
        queue_alive,
        caller,
        address,
        method,
        f"{QUEUE_PREFIX}/{op}",
        body,
        headers,
    )


@settings(max_examples=50, deadline=None)
@given(caller=st.sampled_from(["app/x", "intruder/y", "kv/shard-0"]), headers=forged)
def test_forged_headers_never_change_the_caller(caller: str, headers: dict[str, str]) -> None:
    async def main() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            async with open_host(app, tmp) as host:
                resp = await host.call_as(caller, "echo/e", "POST", "/echo", b"", headers)
                assert resp.json() == {
                    "caller": caller,
                    "reserved": {"x-actorkeep-caller": caller},
                }

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


@pytest.mark.parametrize(
    ("address", "path"),
    [("queue/fresh", f"{QUEUE_PREFIX}/send"), ("kv/shard-1", f"{KV_PREFIX}put")],
)
async def test_a_refused_frame_to_a_new_address_creates_no_file(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, address: str, path: str
) -> None:
    async with open_host(app, tmp_path) as host:
        resp = await host.call_as(ALLOWED, address, "POST", path, b"\xc1", MSGPACK)
        assert resp.status == 400
        assert not (tmp_path / "actors").exists(), file_list(tmp_path)
