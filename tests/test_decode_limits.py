"""What a body may decode to, and the host's budget of bytes held for outside requests."""

from __future__ import annotations

import json
from pathlib import Path

import msgpack
import pytest
import structlog
import trio
import trio.testing

import actorkeep as ak
from actorkeep import codec

MAP_BOMB = b"\xdd" + (1_000_000).to_bytes(4, "big") + b"\x80" * 1_000_000  # 1e6 empty maps
NESTED_BOMB = msgpack.packb([[{}] * 200] * 1000)  # 201,001 values in 200 KiB


def test_msgpack_values_are_counted_and_capped_while_decoding() -> None:
    value, count = codec.unpack_counted(codec.pack({"a": [1, 2]}))
    assert value == {"a": [1, 2]} and count == 5  # map, "a", list, 1, 2
    with pytest.raises(ValueError, match="131072"):  # one container past the limit
        codec.unpack_counted(MAP_BOMB)
    with pytest.raises(ValueError, match="more than 131072 values"):  # many small ones
        codec.unpack_counted(NESTED_BOMB)
    big_list = b"\xdd" + (200_000).to_bytes(4, "big") + b"\xc0" * 200_000
    with pytest.raises(ValueError):  # one container past the limit: refused before it is built
        codec.unpack_counted(big_list)
    # What the limit allows: a 1 MiB body of 100,000 short strings.
    ok = codec.pack(["x" * 8] * 100_000)
    assert len(codec.unpack_counted(ok)[0]) == 100_000


def test_msgpack_arguments_still_decode_inside_a_message_to_another_host() -> None:
    def args(depth: int) -> bytes:  # a map holding ``depth`` levels of lists
        return b"\x81\xa1a" + b"\x91" * depth + b"\x01"

    deepest = 1000
    while True:
        try:
            codec.decode_args(args(deepest + 1), "msgpack")
        except ValueError as exc:
            assert str(exc) == "msgpack body nested too deeply"
            break
        deepest += 1
    # Counted as before: the map, "a", three lists and 1.
    assert codec.decode_args_counted(args(3), "msgpack")[1] == codec.unpack_counted(args(3))[1] == 6
    # What the host accepts still decodes where a call to another host carries it: inside
    # its message, [id, "rpc", caller, chain, address, method, args, timeout].
    message = b"\x98\x01\xa3rpc\xa1c\x90\xa1d\xa1m" + args(deepest) + b"\xc0"
    assert codec.unpack(message)[6]["a"] is not None
    assert codec.unpack(b"\x92" + message + message)[1][1] == "rpc"  # a batch of two, whole


def test_json_depth_and_values_are_capped() -> None:
    with pytest.raises(ValueError, match="nested too deeply"):
        codec.json_loads("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match="more than"):
        codec.json_loads("[" + "{}," * 200_000 + "{}]")
    # Commas inside strings make the quick count too high; the exact count lets them through.
    value, count = codec.json_loads_counted(json.dumps(["," * 300_000, {"a": 1}]))
    assert count == 5 and value[1] == {"a": 1}
    assert codec.json_loads_counted(b'{"a": [1, 2]}')[1] <= 6


async def test_a_deep_json_body_is_a_400_from_a_handler_that_checks_it(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    app = ak.App()

    @app.actor("j")
    class J(ak.Actor):
        @ak.route("POST", "/")
        async def post(self, req: ak.Request) -> ak.Response:
            try:
                req.json()
            except ValueError as exc:
                return ak.Response.json({"error": "BadRequest", "message": str(exc)}, 400)
            return ak.Response(204)

        @ak.rpc
        async def x(self, **kwargs: object) -> int:
            return len(kwargs)

    async with ak.testing.open_host(app, data_dir) as host:
        deep = b"[" * 100_000 + b"]" * 100_000
        resp = await host.request("POST", "/j/a/", body=deep)
        assert resp.status == 400 and "nested too deeply" in resp.json()["message"]
        # An @rpc body is checked before the actor: 400, and no file for it.
        bomb = b"\x81\xa1k" + NESTED_BOMB  # {"k": [[{}, ...], ...]}
        resp = await host.request(
            "POST", "/j/b/_rpc/x", body=bomb, headers={"content-type": codec.MSGPACK}
        )
        assert resp.status == 400 and "more than 131072 values" in resp.json()["message"]
        deep_args = b'{"k": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        resp = await host.request("POST", "/j/b/_rpc/x", body=deep_args)
        assert resp.status == 400 and "nested too deeply" in resp.json()["message"]
    assert not list((data_dir / "actors" / "j").rglob("b.sqlite"))


app = ak.App()


@app.actor("slow")
class Slow(ak.Actor):
    @ak.rpc
    async def hold(self, data: list[str]) -> int:
        await trio.sleep(10)
        return len(data)

    @ak.route("POST", "/raw")
    async def raw(self, req: ak.Request) -> ak.Response:
        await trio.sleep(10)
        return ak.Response(200, {}, str(len(req.body)).encode())


async def test_outside_requests_past_the_in_flight_budget_get_503(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    budget = 2 << 20
    async with ak.testing.open_host(
        app, data_dir, max_inflight_bytes=budget, max_body=1 << 20
    ) as host:
        body = codec.pack({"data": ["x" * 8] * 10_000})  # ~100 KiB, 10,003 values: ~740 KiB
        statuses: list[int] = []

        async def call(i: int) -> None:
            resp = await host.request(
                "POST", f"/slow/s{i}/_rpc/hold", body=body, headers={"content-type": codec.MSGPACK}
            )
            statuses.append(resp.status)
            if resp.status == 503:
                assert resp.json()["error"] == "Overloaded"
                assert resp.headers["retry-after"] == "1"

        with structlog.testing.capture_logs() as logs:
            async with trio.open_nursery() as nursery:
                for i in range(6):
                    nursery.start_soon(call, i)
                await trio.sleep(1)
                # Two fit: 2 x (100 KiB + 10,003 x 64 bytes) <= 2 MiB < 3 x.
                assert host.host.inflight.in_use > budget // 2
                assert sorted(statuses) == [503] * 4
        assert sorted(statuses) == [200, 200, 503, 503, 503, 503]
        # The burst of refusals is one log line (the first; the next would come 10 s on).
        lines = [e for e in logs if e["event"].startswith("refusing requests: the bytes")]
        assert [(e["refused"], e["limit"]) for e in lines] == [(1, budget)]
        assert host.host.inflight.in_use == 0
        # Calls between actors are not counted: the budget is for what comes from outside.
        resp = await host.call_as("slow/other", "slow/c", "POST", "/raw", b"x" * (1 << 20))
        assert resp.status == 200 and host.host.inflight.in_use == 0


@app.actor("route")
class RouteSink(ak.Actor):
    @ak.route("POST", "/hold")
    async def hold(self, req: ak.Request) -> ak.Response:
        data = req.json()  # what the budget counted for it is held while this runs
        await trio.sleep(10)
        return ak.Response.json(len(data))

    @ak.route("GET", "/text")
    async def text(self, req: ak.Request) -> ak.Response:
        return ak.Response(200, {}, "not bytes")  # type: ignore[arg-type]


async def test_a_route_body_is_charged_for_what_it_could_decode_to(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    budget = 4 << 20
    async with ak.testing.open_host(app, data_dir, max_inflight_bytes=budget) as host:
        body = json.dumps([{}] * 10_000).encode()  # 40 KiB, 10,001 values
        statuses: list[int] = []

        async def call(i: int) -> None:
            resp = await host.request("POST", f"/route/r{i}/hold", body=body)
            statuses.append(resp.status)

        async with trio.open_nursery() as nursery:
            for i in range(6):
                nursery.start_soon(call, i)
        # Each is charged its body and 64 bytes for each value it could hold: the JSON bound
        # counts every "[", "{", "," and ":" (20,001 here), 1.3 MiB: three fit in 4 MiB.
        per = len(body) + codec.decode_cost(body, "application/json")
        assert per == len(body) + 20_001 * 64 and budget // per == 3
        assert sorted(statuses) == [200, 200, 200, 503, 503, 503]
        # A body of another type is not decoded by the host, nor charged for it.
        resp = await host.request(
            "POST", "/route/x/hold", body=body, headers={"content-type": "text/plain"}
        )
        assert resp.status == 200


async def test_a_request_no_budget_could_hold_is_413_not_a_retry(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with ak.testing.open_host(
        app, data_dir, max_inflight_bytes=1 << 20, max_body=1 << 20
    ) as host:
        body = codec.pack({"data": ["x" * 8] * 100_000})  # about 7 MiB once decoded
        resp = await host.request(
            "POST", "/slow/s/_rpc/hold", body=body, headers={"content-type": codec.MSGPACK}
        )
        assert resp.status == 413 and "more memory" in resp.json()["message"]


async def test_a_body_that_is_not_bytes_is_a_failed_event(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with ak.testing.open_host(app, data_dir) as host:
        resp = await host.request("GET", "/route/a/text")
        assert resp.status == 500 and "not str" in resp.json()["message"]
