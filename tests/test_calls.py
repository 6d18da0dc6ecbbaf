"""Calls between actors: caller header, refs, errors, re-entry, timeouts (docs/reference.md §5)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import actorkeep as ak
from actorkeep.testing import open_host
from tests.codecutil import counted_msgpack

app = ak.App()
effects: list[str] = []


@app.actor("svc")
class Service(ak.Actor):
    @ak.rpc
    async def whoami(self) -> dict[str, Any]:
        return {"me": self.address}

    @ak.route("GET", "/caller")
    async def caller(self, req: ak.Request) -> ak.Response:
        return ak.Response.json(
            {
                "caller": req.caller,
                "header": req.headers.get("x-actorkeep-caller"),
                "custom": req.headers.get("x-custom"),
                "other": req.headers.get("x-actorkeep-evil"),
            }
        )

    @ak.rpc
    async def fail(self) -> None:
        raise ZeroDivisionError("nope")

    @ak.rpc
    async def slow(self, seconds: float) -> str:
        await trio.sleep(seconds)
        effects.append(f"slow done {self.address}")
        return "done"

    @ak.rpc
    async def mutate(self, items: list[int]) -> list[int]:
        items.append(99)
        return items

    @ak.rpc
    async def whose_event(self) -> str:
        return ak.current_actor().address

    @ak.rpc
    async def kept(self, add: int) -> dict[str, Any]:
        """A value the callee keeps and changes after it answered; awaits (the worker path)."""
        await trio.lowlevel.checkpoint()
        self.box: dict[str, Any] = getattr(self, "box", {"items": [[0]]})
        self.box["items"][0].append(add)
        return self.box

    @ak.rpc
    async def odd(self, kind: str) -> Any:
        """Results only msgpack's round trip copies as it would arrive over the wire."""
        await trio.lowlevel.checkpoint()
        return {
            "tuple": (1, (2, "x")),
            "text": "caf\u00e9 \u2603",
            "deep": [[[[[[[1, {"k": (3,)}]]]]]]],
            "big": 1 << 64,
            "set": {1, 2},
            "surrogate": "\udc80",
        }[kind]


@app.actor("client")
class Client(ak.Actor):
    @ak.rpc
    async def via_call(self, target: str, path: str) -> dict[str, Any]:
        resp = await self.actors.call(
            target,
            "GET",
            path,
            headers={"x-custom": "1", "X-Actorkeep-Caller": "forged/x", "x-actorkeep-evil": "y"},
        )
        return {"status": resp.status, "body": resp.json()}

    @ak.rpc
    async def via_ref(self, target: str, method: str, **args: Any) -> Any:
        return await getattr(self.actors.ref(target), method)(**args)

    @ak.rpc
    async def error_of(self, target: str, method: str, **args: Any) -> list[Any]:
        try:
            await getattr(self.actors.ref(target), method)(**args)
        except ak.RemoteError as exc:
            return [
                type(exc).__name__,
                exc.status,
                exc.error,
                exc.message,
                isinstance(exc, ValueError),
            ]
        return ["no error"]

    @ak.rpc
    async def call_back(self, target: str) -> Any:
        """Ask ``target`` to call us back: the call back re-enters this actor."""
        return await self.actors.ref(target).relay(target=self.address)

    @ak.rpc
    async def relay(self, target: str) -> Any:
        return await self.actors.ref(target).whoami()

    @ak.rpc
    async def call_self(self) -> list[Any]:
        t0 = trio.current_time()
        try:
            await self.actors.call(self.address, "POST", "/_rpc/whoami")
        except ak.ReentryError as exc:
            return [exc.status, trio.current_time() - t0, "call chain" in str(exc)]
        return ["no error"]

    @ak.rpc
    async def timeout_of(self, target: str, seconds: float, timeout: float) -> list[Any]:
        t0 = trio.current_time()
        try:
            await self.actors.ref(target, timeout=timeout).slow(seconds=seconds)
        except ak.CallTimeout:
            return ["timeout", trio.current_time() - t0]
        return ["answered", trio.current_time() - t0]

    @ak.rpc
    async def bad_address(self) -> list[str]:
        out = []
        for address in ["svc", "svc/.x", "Svc/a", "svc/a b"]:
            try:
                await self.actors.call(address, "GET", "/")
            except ValueError:
                out.append("ValueError")
        return out

    @ak.rpc
    async def not_found(self) -> list[int]:
        a = await self.actors.call("nosuch/a", "GET", "/")
        b = await self.actors.call("svc/a", "GET", "/nowhere")
        return [a.status, b.status]

    @ak.rpc
    async def isolation(self) -> list[Any]:
        mine = [1, 2]
        theirs = await self.actors.ref("svc/a").mutate(items=mine)
        return [mine, theirs]

    @ak.rpc
    async def results(self) -> list[Any]:
        svc = self.actors.ref("svc/r")
        first = await svc.kept(add=1)
        first["items"][0].append("mine")  # the caller's copy: the callee's stays as it was
        second = await svc.kept(add=2)
        odd = [await svc.odd(kind=k) for k in ("tuple", "text", "deep")]
        errors = []
        for kind in ("big", "set", "surrogate"):
            try:
                await svc.odd(kind=kind)
            except ak.RemoteError as exc:
                errors.append([exc.status, exc.error])
        return [first, second, odd, errors]

    @ak.rpc
    async def msgpack_of_calls(self, n: int) -> dict[str, int]:
        """``n`` calls of an inline and of an awaiting method of an actor of this host; the
        msgpack packs and unpacks they cost."""
        svc = self.actors.ref("svc/m")
        with counted_msgpack() as counts:
            for i in range(n):
                assert await svc.whoami() == {"me": "svc/m"}
                assert (await svc.kept(add=i))["items"][0][-1] == i
        return counts

    @ak.rpc
    async def context_inside(self) -> list[str]:
        return [ak.current_actor().address, await self.actors.ref("svc/a").whose_event()]


async def rpc(host: ak.testing.TestHost, address: str, method: str, /, **args: Any) -> Any:
    resp = await host.request("POST", f"/{address}/_rpc/{method}", json=args)
    assert resp.status == 200, resp.body
    return resp.json()


async def test_caller_header_is_set_by_the_host(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        out = await rpc(host, "client/c1", "via_call", target="svc/a", path="/caller")
        assert out == {
            "status": 200,
            "body": {"caller": "client/c1", "header": "client/c1", "custom": "1", "other": None},
        }
        resp = await host.call_as("tester/t", "svc/a", "GET", "/caller")
        assert resp.json()["caller"] == "tester/t"


async def test_ref_calls_and_remote_errors(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        assert await rpc(host, "client/c", "via_ref", target="svc/a", method="whoami") == {
            "me": "svc/a"
        }
        assert await rpc(host, "client/c", "error_of", target="svc/a", method="fail") == [
            "RemoteError",
            500,
            "ZeroDivisionError",
            "nope",
            False,
        ]
        assert await rpc(host, "client/c", "error_of", target="svc/a", method="nosuch") == [
            "RemoteError",
            404,
            "NotFound",
            "svc has no route POST /_rpc/nosuch",
            False,
        ]
        err = await rpc(host, "client/c", "error_of", target="svc/a", method="slow", wrong=1)
        assert err[:3] == ["BadRequest", 400, "BadRequest"] and err[4] is True
        assert await rpc(host, "client/c", "bad_address") == ["ValueError"] * 4
        assert await rpc(host, "client/c", "not_found") == [404, 404]
        # Values are copied across the call: the callee cannot change the caller's objects.
        assert await rpc(host, "client/c", "isolation") == [[1, 2], [1, 2, 99]]


async def test_a_result_is_the_callers_own_copy_as_over_the_wire(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Within a host a result is handed over as a copy, not encoded and decoded: the caller
    and the callee never share an object, and what arrives (or fails) is what msgpack's round
    trip would give."""
    async with open_host(app, data_dir) as host:
        first, second, odd, errors = await rpc(host, "client/c", "results")
    assert first == {"items": [[0, 1, "mine"]]}
    assert second == {"items": [[0, 1, 2]]}  # the caller's change never reached the callee
    assert odd == [[1, [2, "x"]], "caf\u00e9 \u2603", [[[[[[[1, {"k": [3]}]]]]]]]]
    assert errors == [[500, "OverflowError"], [500, "TypeError"], [500, "UnicodeEncodeError"]]


async def test_a_call_within_a_host_costs_no_msgpack(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        assert await rpc(host, "client/c", "msgpack_of_calls", n=1)  # svc/m exists
        assert await rpc(host, "client/c", "msgpack_of_calls", n=10) == {"pack": 0, "unpack": 0}


async def test_reentry_is_refused_at_once(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        assert await rpc(host, "client/c", "call_self") == [508, 0, True]
        # client/a -> client/b -> client/a: refused, b's event fails, a sees a RemoteError.
        resp = await host.request("POST", "/client/a/_rpc/call_back", json={"target": "client/b"})
        assert resp.status == 500
        assert resp.json()["error"] == "RemoteError"  # a's own failure, caused by b's
        assert "508 ReentryError: client/a is already in the call chain" in resp.json()["message"]
        assert trio.current_time() < 1  # at once, not after a timeout
        # call_as behaves like self.actors.call: a re-entry raises.
        with pytest.raises(ak.ReentryError) as info:
            await host.call_as("client/x", "client/x", "POST", "/_rpc/whoami")
        assert info.value.status == 508


async def test_timeout_leaves_the_callee_running(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    effects.clear()
    async with open_host(app, data_dir) as host:
        out = await rpc(host, "client/c", "timeout_of", target="svc/s", seconds=10, timeout=2)
        assert out == ["timeout", 2]
        assert effects == []
        await trio.sleep(9)
        assert effects == ["slow done svc/s"]  # the callee's event kept running
        out = await rpc(host, "client/c", "timeout_of", target="svc/s", seconds=1, timeout=2)
        assert out == ["answered", 1]


async def test_call_as_timeout(data_dir: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with open_host(app, data_dir) as host:
        with pytest.raises(ak.CallTimeout):
            await host.call_as(
                "tester/t", "svc/s", "POST", "/_rpc/slow", b'{"seconds": 5}', timeout=1
            )


async def test_current_actor_context_variable(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        assert await rpc(host, "client/c", "context_inside") == ["client/c", "svc/a"]
    with pytest.raises(RuntimeError, match="no actor event"):
        ak.current_actor()


async def test_many_timeouts_at_once(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """One watcher serves every waiting caller, whatever mix of timeout values they use."""
    effects.clear()
    async with open_host(app, data_dir) as host:
        results: dict[tuple[float, float], list[Any]] = {}

        async def one(seconds: float, timeout: float, name: str) -> None:
            results[(seconds, timeout)] = await rpc(
                host,
                f"client/{name}",
                "timeout_of",
                target=f"svc/{name}",
                seconds=seconds,
                timeout=timeout,
            )

        async with trio.open_nursery() as nursery:
            for i, (seconds, timeout) in enumerate(
                [(5, 1), (5, 3), (1, 3), (10, 7), (2, 7), (8, 1), (0.5, 0.25)]
            ):
                nursery.start_soon(one, seconds, timeout, f"n{i}")
        for (seconds, timeout), outcome_ in results.items():
            if seconds > timeout:
                assert outcome_ == ["timeout", timeout]
            else:
                assert outcome_ == ["answered", seconds]
        await trio.sleep(10)
        assert len(effects) == 7  # every callee finished its event anyway


async def test_a_loop_of_inline_calls_does_not_starve_others(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    from actorkeep.runtime.dispatch import INLINE_YIELD_EVERY

    ticks = 0

    class Looper(ak.Actor):
        @ak.rpc
        async def loop(self, n: int) -> int:
            ref = self.actors.ref("svc/a")
            for _ in range(n):
                await ref.whoami()  # never suspends: runs inline in this task
            return n

    loop_app = ak.App()
    loop_app.mount(Service, "svc")
    loop_app.mount(Looper, "looper")
    async with open_host(loop_app, data_dir) as host:
        await host.request("POST", "/svc/a/_rpc/whoami")

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await trio.lowlevel.checkpoint()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ticker)
            await trio.lowlevel.checkpoint()
            ticks = 0
            await host.request("POST", "/looper/l/_rpc/loop", json={"n": 640})
            # 640 inline calls yield about 640 / INLINE_YIELD_EVERY times; with no yield the
            # ticker would run only around the request itself (twice).
            assert INLINE_YIELD_EVERY <= 64
            assert ticks >= 10
            nursery.cancel_scope.cancel()


async def test_timeout_values_are_checked_and_forgotten(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        for bad in [-1, float("nan"), "5", True]:
            with pytest.raises(ValueError, match="timeout"):
                await host.call_as("tester/t", "svc/a", "POST", "/_rpc/whoami", timeout=bad)  # type: ignore[arg-type]
        for i in range(50):  # many distinct timeout values, as a caller with a deadline uses
            await host.call_as(
                "tester/t", "svc/s", "POST", "/_rpc/slow", b'{"seconds": 0.1}', timeout=10 + i / 7
            )
        assert len(host.host.dispatcher.timeouts) == 0  # no timeout value left behind


@app.actor("echo")
class Echo(ak.Actor):
    @ak.rpc
    async def back(self, value: Any) -> Any:
        return value

    @ak.rpc
    async def nan(self) -> float:
        return float("nan")


@pytest.mark.parametrize("body", [b'{"value": NaN}', b'{"value": -Infinity}', b'{"value": 1e999}'])
async def test_json_without_numbers_json_lacks_is_refused(data_dir: Path, body: bytes) -> None:
    async with open_host(app, data_dir) as host:
        resp = await host.request(
            "POST", "/echo/e/_rpc/back", body=body, headers={"content-type": "application/json"}
        )
        assert resp.status == 400 and resp.json()["error"] == "BadRequest"


async def test_a_json_reply_never_carries_nan(data_dir: Path) -> None:
    async with open_host(app, data_dir) as host:
        resp = await host.request("POST", "/echo/e/_rpc/nan", json={})
        assert resp.status == 500  # the handler returned what JSON cannot say
        ak.codec.decode_result(resp.body, "json")  # and the error reply itself is strict JSON
        packed = await host.request(
            "POST", "/echo/e/_rpc/nan", headers={"content-type": "application/msgpack"}
        )
        assert packed.status == 200  # msgpack has NaN


@app.actor("jsonroute")
class JsonRoute(ak.Actor):
    @ak.route("POST", "/echo")
    async def echo(self, req: ak.Request) -> ak.Response:
        return ak.Response.json(req.json())

    @ak.route("GET", "/nan")
    async def nan(self, req: ak.Request) -> ak.Response:
        return ak.Response.json({"x": float("nan")})


async def test_routes_speak_strict_json_too(data_dir: Path) -> None:
    async with open_host(app, data_dir) as host:
        ok = await host.request("POST", "/jsonroute/r/echo", body=b'{"x": 1.5}')
        assert (ok.status, ok.json()) == (200, {"x": 1.5})
        for path, body in [("/jsonroute/r/echo", b'{"x": NaN}'), ("/jsonroute/r/nan", b"")]:
            resp = await host.request("POST" if body else "GET", path, body=body)
            assert resp.status == 500  # the handler met JSON it must not read or write
            ak.codec.decode_result(resp.body, "json")  # the error reply is strict JSON
