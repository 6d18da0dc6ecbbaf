"""A ready class's protocol operation between two actors of one host (``self.actors.call_op``,
decision 0028): its frame and reply go as values, not msgpack, under the rules of a call to the
operation's route: refusals, copies, the output gate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
import trio.testing

import actorkeep as ak
import shards
from actorkeep import codec
from actorkeep.http import ValueReply
from actorkeep.testing import open_host
from actorkeep.wire import kv as wire
from tests.codecutil import counted_msgpack

app = ak.App()
app.mount(shards.KVShard, "kv", allow=["user"])
kv = ak.kv.Client("kv", shards=1)
seen: list[tuple[str, float]] = []  # what the shard got, and when


class Recording(shards.KVShard):
    """A shard that notes the time of every put it runs."""

    @wire.PUT_NOW.handler
    def put_now(self, frame: dict[str, Any]) -> Any:
        seen.append((frame["key"].decode(), self.now()))
        done = self.write(frame)
        return done if isinstance(done, ak.Response) else {"version": done[0], "expires_at": None}


app.mount(Recording, "rec")


@app.actor("user")
class User(ak.Actor):
    async def setup(self) -> None:
        self.sql.exec("CREATE TABLE IF NOT EXISTS t (x INTEGER)")

    @ak.rpc
    async def round(self, n: int) -> dict[str, int]:
        """``n`` local puts and gets; how many msgpack packs and unpacks they cost."""
        with counted_msgpack() as counts:
            for i in range(n):
                await kv.put(f"k{i}", b"v%d" % i, local=True)
                entry = await kv.get_fresh(f"k{i}")
                assert entry is not None and entry.value == b"v%d" % i
        return counts

    @ak.rpc
    async def op(self, address: str, values: dict[str, Any]) -> list[Any]:
        """``call_op`` of PUT_NOW with ``values``: [status, reply or error body]."""
        try:
            resp = await self.actors.call_op(address, wire.PUT_NOW, values)
        except ak.RemoteError as exc:
            return [exc.status, exc.error, str(exc)]
        if type(resp) is ValueReply:
            return [200, wire.PUT_NOW.result(resp)]
        return [resp.status, resp.json()]

    @ak.rpc
    async def aliasing(self) -> bool:
        """A reply the caller changes leaves the shard's own value alone, and a frame the
        caller changes after the call leaves what the shard stored alone."""
        value = bytearray(b"first")
        frame = {"key": b"alias", "value": bytes(value), "expect": None, "ttl": None}
        resp = await self.actors.call_op("kv/shard-0", wire.PUT_NOW, {**frame, "local": True})
        got = wire.PUT_NOW.result(resp)
        got["version"] = -1  # the caller's copy
        frame["value"] = b"changed"
        entry = await kv.get_fresh("alias")
        return entry is not None and entry.value == b"first" and entry.version > 0

    @ak.rpc
    async def gated_then_put(self) -> None:
        self.sql.exec("INSERT INTO t VALUES (1)", durable=True)
        await ak.kv.Client("rec", shards=1).put("after", b"x", local=True)


@app.actor("stranger")
class Stranger(ak.Actor):
    @ak.rpc
    async def op(self) -> list[Any]:
        try:
            await self.actors.call_op("kv/shard-0", wire.GET, {"key": b"k"})
        except ak.Forbidden as exc:
            return [exc.status, str(exc)]
        return []


async def call(host: ak.testing.TestHost, address: str, method: str, /, **args: Any) -> Any:
    """``address``'s ``@rpc`` ``method`` with ``args``, msgpack both ways (bytes pass)."""
    resp = await host.request(
        "POST", f"/{address}/_rpc/{method}", body=codec.pack(args),
        headers={"content-type": codec.MSGPACK},
    )  # fmt: skip
    assert resp.status == 200, resp.body
    return codec.decode_result(resp.body, "msgpack")


async def test_within_a_host_an_operation_costs_no_msgpack(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        await call(host, "user/u", "round", n=1)  # the shard exists
        assert await call(host, "user/u", "round", n=20) == {"pack": 0, "unpack": 0}


async def test_an_operation_is_refused_as_its_route_would_be(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    good = {"key": b"a", "value": b"1", "expect": None, "ttl": None, "local": True}
    async with open_host(app, data_dir) as host:
        status, reply = await call(host, "user/u", "op", address="kv/shard-0", values=good)
        assert status == 200 and reply["version"] >= 1
        # A bad frame: 400 with the route's own message, before the shard is woken.
        bad = {**good, "key": 5}
        over_http = await host.call_as(
            "user/u", "kv/shard-0", "POST", wire.PUT_NOW.path, codec.pack(bad),
            {"content-type": codec.MSGPACK},
        )  # fmt: skip
        got = await call(host, "user/u", "op", address="kv/shard-0", values=bad)
        assert got[:2] == [400, "BadRequest"] and over_http.status == 400
        assert over_http.json()["message"] in got[2]
        unknown = {**good, "zz": 1}
        assert (await call(host, "user/u", "op", address="kv/shard-0", values=unknown))[0] == 400
        # No such class, no such operation on this class: 404.
        assert (await call(host, "user/u", "op", address="nope/x", values=good))[0] == 404
        assert (await call(host, "user/u", "op", address="user/v", values=good))[0] == 404
        # A conflict is the handler's own 409 response, passed on as it is.
        cas = {**good, "expect": 999}
        status, body = await call(host, "user/u", "op", address="kv/shard-0", values=cas)
        assert status == 409 and body["error"] == "Conflict"
        # The class's access rule (allow=["user"]) holds.
        assert (await call(host, "stranger/s", "op"))[0] == 403
        assert await call(host, "user/u", "aliasing") is True


async def test_an_operation_after_a_gated_write_leaves_once_it_is_durable(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from sim.storage import SimStorage

    seen.clear()
    disk = SimStorage(fsync_delay=lambda: 1.0)  # every fsync takes a second
    async with open_host(app, storage=disk.view()) as host:
        await call(host, "user/u", "round", n=1)
        await trio.sleep(5)  # registrations synced
        start = host.host.clock.now()
        await call(host, "user/u", "gated_then_put")
        assert [k for k, _ in seen] == ["after"]
        assert seen[0][1] >= start + 1.0  # the put reached the shard after the user's sync


def test_every_protocol_operation_is_reachable_directly() -> None:
    """Each operation the ready classes handle is marked for ``call_op`` (the queue's own
    DELIVER goes to consumers, which handle it as a route of theirs)."""
    import queues
    from actorkeep.routing import RouteTable
    from actorkeep.wire import queue as queue_wire

    for cls, protocol in ((shards.KVShard, wire.KV), (queues.Queue, queue_wire.QUEUE)):
        direct = RouteTable(cls).direct
        expected = {op.path for op in protocol.ops.values() if op is not queue_wire.DELIVER}
        assert set(direct) == expected, cls
