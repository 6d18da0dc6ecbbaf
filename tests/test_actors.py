"""Actors: handlers, encodings, one event at a time, instances, failures, overload
(docs/reference.md §2)."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

import msgpack
import pytest
import structlog
import trio
import trio.lowlevel
import trio.testing

import actorkeep as ak
from actorkeep.testing import open_host

from .conftest import sqlite_files

app = ak.App()
log: list[tuple[str, Any]] = []


@app.actor("echo")
class Echo(ak.Actor):
    async def setup(self) -> None:
        self.setups = getattr(self, "setups", 0) + 1
        self.sql.exec("CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY, v TEXT)")
        log.append(("setup", self.address))

    @ak.rpc
    async def info(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "class": self.class_name,
            "name": self.name,
            "now": self.now(),
        }

    @ak.rpc
    async def draw(self) -> float:
        return self.rng.random()

    @ak.rpc
    async def add(self, a: int, b: int = 0) -> int:
        return a + b

    @ak.rpc
    async def blob(self, data: bytes) -> bytes:
        return data[::-1]

    @ak.route("GET", "/req/{x}")
    async def req(self, req: ak.Request, x: str) -> ak.Response:
        return ak.Response.json(
            {
                "x": x,
                "method": req.method,
                "path": req.path,
                "query": req.query,
                "ua": req.headers.get("User-Agent"),
                "caller": req.caller,
                "reserved": sorted(h for h in req.headers if h.startswith("x-actorkeep-")),
            }
        )

    @ak.route("PUT", "/kv/{k}")
    async def put(self, req: ak.Request, k: str) -> ak.Response:
        self.sql.exec("INSERT OR REPLACE INTO t VALUES (?, ?)", (k, req.body.decode()))
        return ak.Response(204, {"x-done": "yes"})

    @ak.route("GET", "/kv/{k}")
    async def get(self, req: ak.Request, k: str) -> ak.Response:
        row = self.sql.exec("SELECT v FROM t WHERE k = ?", (k,)).fetchone()
        if row is None:
            return ak.Response(404)
        return ak.Response(200, {"content-type": "text/plain"}, row[0].encode())

    @ak.rpc
    async def step(self, tag: str, pause: float = 0.0) -> int:
        log.append(("start", tag))
        if pause:
            await trio.sleep(pause)
        log.append(("end", tag))
        return len(log)

    @ak.rpc
    async def fail_in_transaction(self) -> None:
        self.cached = "lost"
        with self.sql.transaction():
            self.sql.exec("INSERT OR REPLACE INTO t VALUES ('tx', 'written')")
            raise RuntimeError("boom")

    @ak.rpc
    async def fail_with_open_transaction(self) -> None:
        self.sql.exec("BEGIN")
        self.sql.exec("INSERT OR REPLACE INTO t VALUES ('open', 'written')")
        raise KeyError("no such thing")

    @ak.rpc
    async def remember(self, value: str) -> None:
        self.cached = value

    @ak.rpc
    async def recall(self) -> str | None:
        return getattr(self, "cached", None)

    @ak.rpc
    async def setup_count(self) -> int:
        return int(self.setups)

    @ak.rpc
    async def not_encodable(self) -> object:
        return {1, 2}

    @ak.route("GET", "/wrong")
    async def wrong(self, req: ak.Request) -> ak.Response:
        return "not a response"  # type: ignore[return-value]


@app.actor("broken")
class Broken(ak.Actor):
    async def setup(self) -> None:
        raise ValueError("setup failed")

    @ak.rpc
    async def hello(self) -> str:
        return "hi"


async def rpc(host: ak.testing.TestHost, address: str, method: str, /, **args: Any) -> Any:
    resp = await host.request("POST", f"/{address}/_rpc/{method}", json=args)
    assert resp.status == 200, resp.body
    return resp.json()


async def test_rpc_json_and_msgpack(data_dir: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with open_host(app, data_dir) as host:
        resp = await host.request("POST", "/echo/a/_rpc/add", json={"a": 2, "b": 3})
        assert (resp.status, resp.json()) == (200, 5)
        assert resp.headers["Content-Type"] == "application/json"
        resp = await host.request(
            "POST",
            "/echo/a/_rpc/blob",
            body=msgpack.packb({"data": b"\x00\x01\xff"}),
            headers={"content-type": "application/msgpack"},
        )
        assert resp.status == 200
        assert resp.headers["content-type"] == "application/msgpack"
        assert msgpack.unpackb(resp.body) == b"\xff\x01\x00"
        # No body and no content type: JSON, no arguments.
        resp = await host.request("POST", "/echo/a/_rpc/info")
        info = resp.json()
        assert info["address"] == "echo/a" and info["class"] == "echo" and info["name"] == "a"
        assert info["now"] == pytest.approx(host.host.clock.now())


async def test_bad_rpc_bodies_are_400_and_create_nothing(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        cases: list[tuple[bytes, dict[str, str]]] = [
            (b"{not json", {"content-type": "application/json"}),
            (b"[1, 2]", {"content-type": "application/json"}),
            (b"\xc1", {"content-type": "application/msgpack"}),
            (msgpack.packb([1]), {"content-type": "application/msgpack"}),
            (msgpack.packb({1: 2}), {"content-type": "application/msgpack"}),
            (b'{"a": 1}', {"content-type": "text/plain"}),
            (b'{"b": 1}', {"content-type": "application/json"}),  # missing a
            (b'{"a": 1, "zz": 2}', {"content-type": "application/json"}),  # unknown zz
        ]
        for body, headers in cases:
            resp = await host.request("POST", "/echo/fresh/_rpc/add", body=body, headers=headers)
            assert resp.status == 400, (body, resp.body)
            assert resp.json()["error"] == "BadRequest"
        assert sqlite_files(data_dir) == []


async def test_routes_params_query_headers(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        resp = await host.request(
            "GET", "/echo/a/req/hello%20there?q=1&q=2&empty=", headers={"user-agent": "t/1"}
        )
        assert resp.status == 200
        assert resp.json() == {
            "x": "hello there",
            "method": "GET",
            "path": "/req/hello%20there",
            "query": {"q": "1", "empty": ""},
            "ua": "t/1",
            "caller": None,
            "reserved": [],
        }
        resp = await host.request("PUT", "/echo/a/kv/k1", body=b"v1")
        assert (resp.status, resp.headers["X-Done"]) == (204, "yes")
        resp = await host.request("GET", "/echo/a/kv/k1")
        assert (resp.status, resp.body) == (200, b"v1")
        assert (await host.request("GET", "/echo/a/kv/zz")).status == 404
        assert (await host.request("POST", "/echo/a/kv/k1")).status == 404  # no such route
        assert (await host.request("GET", "/echo/a/nothing")).status == 404


async def test_response_json_both_ways() -> None:
    resp = ak.Response.json({"a": [1, 2]}, status=201)
    assert resp.status == 201
    assert resp.headers["content-type"] == "application/json"
    assert resp.json() == {"a": [1, 2]}
    assert json.loads(resp.body) == {"a": [1, 2]}


async def test_events_of_one_actor_run_one_at_a_time_in_order(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    log.clear()
    async with open_host(app, data_dir) as host:
        await rpc(host, "echo/a", "info")  # create the instance first
        log.clear()
        async with trio.open_nursery() as nursery:
            for i in range(5):
                # The first one sleeps: while it awaits, nothing else of echo/a may start.
                nursery.start_soon(
                    partial(rpc, host, "echo/a", "step", tag=str(i), pause=1.0 if i == 0 else 0)
                )
                await trio.testing.wait_all_tasks_blocked()
        assert log == [(kind, str(i)) for i in range(5) for kind in ("start", "end")]


async def test_different_actors_interleave(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    log.clear()
    async with open_host(app, data_dir) as host:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(rpc, host, "echo/slow", "step", tag="slow", pause=5.0))
            await trio.testing.wait_all_tasks_blocked()
            t0 = trio.current_time()
            await rpc(host, "echo/fast", "step", tag="fast")
            assert trio.current_time() == t0  # did not wait for echo/slow
        steps = [e for e in log if e[0] in ("start", "end")]
        assert steps == [("start", "slow"), ("start", "fast"), ("end", "fast"), ("end", "slow")]


async def test_failed_event_rolls_back_discards_and_keeps_serving(
    data_dir: Path, autojump_clock: trio.testing.MockClock, capsys: pytest.CaptureFixture[str]
) -> None:
    async with open_host(app, data_dir) as host:
        await rpc(host, "echo/a", "remember", value="kept?")
        assert await rpc(host, "echo/a", "setup_count") == 1
        resp = await host.request("POST", "/echo/a/_rpc/fail_in_transaction")
        assert resp.status == 500
        assert resp.json() == {"error": "RuntimeError", "message": "boom"}
        # The instance was discarded: attributes are gone and setup() ran again.
        assert await rpc(host, "echo/a", "recall") is None
        assert await rpc(host, "echo/a", "setup_count") == 1
        # A transaction left open by a failing handler is rolled back too.
        resp = await host.request("POST", "/echo/a/_rpc/fail_with_open_transaction")
        assert resp.status == 500 and resp.json()["error"] == "KeyError"
        for key in ("tx", "open"):
            assert (await host.request("GET", f"/echo/a/kv/{key}")).status == 404
        # Other failures: a route returning the wrong type, a result msgpack/JSON can't encode.
        assert (await host.request("GET", "/echo/a/wrong")).json()["error"] == "TypeError"
        assert (await host.request("POST", "/echo/a/_rpc/not_encodable")).status == 500
        assert await rpc(host, "echo/a", "add", a=1) == 1
    err = capsys.readouterr()
    logged = err.out + err.err
    assert "event failed" in logged and "echo/a" in logged and "RuntimeError: boom" in logged


async def test_failing_setup_fails_the_event_only(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        for _ in range(2):
            resp = await host.request("POST", "/broken/b/_rpc/hello")
            assert resp.status == 500
            assert resp.json() == {"error": "ValueError", "message": "setup failed"}
        assert await rpc(host, "echo/a", "add", a=2) == 2


async def test_overload_answers_503_with_retry_after(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir, max_pending=3) as host:
        statuses: list[int] = []
        retry_after: list[str] = []

        async def one(i: int) -> None:
            resp = await host.request(
                "POST", "/echo/hot/_rpc/step", json={"tag": str(i), "pause": 1.0}
            )
            statuses.append(resp.status)
            if resp.status == 503:
                retry_after.append(resp.headers["retry-after"])
                assert resp.json()["error"] == "Overloaded"

        with structlog.testing.capture_logs() as logs:
            async with trio.open_nursery() as nursery:
                for i in range(10):
                    nursery.start_soon(one, i)
                    await trio.testing.wait_all_tasks_blocked()
            # One running and three waiting are accepted; the other six are refused at once.
            assert sorted(statuses) == [200] * 4 + [503] * 6
            assert retry_after == ["1"] * 6
            # A burst of refusals leaves one line, and the next burst, 10 s on, one more
            await trio.sleep(10)
            async with trio.open_nursery() as nursery:
                for i in range(6):
                    nursery.start_soon(one, i)
                    await trio.testing.wait_all_tasks_blocked()
        lines = [e for e in logs if e["event"] == "refusing events: an actor's inbox is full"]
        assert [(e["address"], e["refused"]) for e in lines] == [("echo/hot", 1), ("echo/hot", 6)]
        assert host.host.stats.inbox_full == 6 + 2
        # It recovers.
        assert await rpc(host, "echo/hot", "add", a=1) == 1


async def test_idle_instances_are_evicted(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir, idle_timeout=30.0) as host:
        await rpc(host, "echo/a", "remember", value="x")
        await rpc(host, "echo/b", "remember", value="y")
        assert host.host.active_count == 2
        await trio.sleep(29)
        await rpc(host, "echo/b", "add", a=1)  # keeps b alive
        await trio.sleep(2)
        assert host.host.active_count == 1
        assert await rpc(host, "echo/a", "recall") is None  # a new instance
        assert await rpc(host, "echo/b", "recall") == "y"
        await trio.sleep(31)
        assert host.host.active_count == 0


async def test_lru_cap_on_active_instances(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir, max_active=3) as host:
        for name in "abcd":
            await rpc(host, f"echo/{name}", "remember", value=name)
        assert host.host.active_count == 3
        assert await rpc(host, "echo/a", "recall") is None  # a was least recently used
        assert await rpc(host, "echo/d", "recall") == "d"


async def test_outside_headers_cannot_forge_a_caller(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        resp = await host.request(
            "GET",
            "/echo/a/req/1",
            headers={"X-Actorkeep-Caller": "admin/root", "x-actorkeep-chain": "x"},
        )
        assert resp.json()["caller"] is None
        assert resp.json()["reserved"] == []  # no x-actorkeep-* header reaches the actor


async def test_health(data_dir: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with open_host(app, data_dir) as host:
        resp = await host.request("GET", "/_actorkeep/health")
        assert resp.status == 200 and resp.json()["status"] == "ok"


async def test_closing_host_answers_running_and_waiting_events(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        statuses: list[int] = []

        async def slow(tag: str) -> None:
            resp = await host.request(
                "POST", "/echo/a/_rpc/step", json={"tag": tag, "pause": 100.0}
            )
            statuses.append(resp.status)
            assert resp.json()["error"] == "HostClosed"

        with trio.fail_after(50):  # without the fix the callers would wait forever
            async with trio.open_nursery() as nursery:
                nursery.start_soon(slow, "running")
                await trio.testing.wait_all_tasks_blocked()
                nursery.start_soon(slow, "waiting")
                await trio.testing.wait_all_tasks_blocked()
                await host.restart()
        assert statuses == [503, 503]
        assert trio.current_time() < 100


async def test_rng_is_the_hosts_injected_one(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    import random

    draws = []
    for _ in range(2):
        async with open_host(app, data_dir, rng=random.Random(7)) as host:
            draws.append([await rpc(host, "echo/a", "draw") for _ in range(3)])
    seeded = random.Random(7)
    expected = [seeded.random() for _ in range(3)]
    assert draws == [expected, expected]


async def test_inline_calls_wait_their_turn_behind_a_running_event(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A handler that never suspends may run in the caller's task, but only when its actor
    is idle: behind a running event it queues like any other (FIFO, one at a time)."""
    async with open_host(app, data_dir) as host:
        await rpc(host, "echo/a", "add", a=0)
        log.clear()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(rpc, host, "echo/a", "step", tag="slow", pause=3.0))
            await trio.testing.wait_all_tasks_blocked()
            t0 = trio.current_time()
            assert await rpc(host, "echo/a", "add", a=1, b=2) == 3  # inline-capable
            assert trio.current_time() - t0 == 3.0  # it waited for the running event
            log.append(("add", "done"))
        assert log == [("start", "slow"), ("end", "slow"), ("add", "done")]


def test_never_suspends() -> None:
    from actorkeep.routing import never_suspends

    async def plain(x: int) -> int:
        return x + 1

    async def awaits() -> None:
        await trio.lowlevel.checkpoint()

    async def loops() -> None:
        async for _ in aiter_nothing():
            pass

    async def ctx(cm: Any) -> None:
        async with cm:
            pass

    async def aiter_nothing() -> Any:
        if False:
            yield

    def sync(x: int) -> int:
        return x

    assert never_suspends(plain)
    assert never_suspends(Echo.add) and never_suspends(Echo.info)
    assert not never_suspends(Echo.step)
    for fn in (awaits, loops, ctx, aiter_nothing, sync, len):
        assert not never_suspends(fn), fn
