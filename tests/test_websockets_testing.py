"""WebSockets through ``ak.testing`` (in-process sockets, no network): hibernation under a
MockClock, the output gate, restarts, failed syncs, and what bad input gets."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

import actorkeep as ak
from actorkeep.runtime.router import LocalRouter, Target
from actorkeep.runtime.sockets import WATCH_EVERY, SocketLimits
from actorkeep.testing import TestSocket, UpgradeRefused, WebSocketClosed, open_host
from actorkeep.ws import check_tags, encode_attachment
from tests.test_gate import Disk, disk  # noqa: F401 (the fixture)

app = ak.App()


@app.actor("room")
class Room(ak.Actor):
    websocket_auto_reply = ("ping", "pong")

    async def setup(self) -> None:
        self.sql.exec("CREATE TABLE IF NOT EXISTS log (id INTEGER PRIMARY KEY, line TEXT)")

    @ak.websocket("/ws")
    async def join(self, req: ak.Request) -> ak.WebSocket | ak.Response:
        kind = req.query.get("kind", "")
        if kind == "wrong":
            return "not a socket"  # type: ignore[return-value]
        if kind == "refuse":
            req.accept_websocket()
            return ak.Response.json({"error": "changed my mind"}, 409)
        ws = req.accept_websocket(
            tags=[req.query.get("tag", "all")], attachment={"user": req.query.get("user", "")}
        )
        ws.send("hello")
        return ws

    async def websocket_message(self, ws: ak.WebSocket, message: str | bytes) -> None:
        assert isinstance(message, str)
        if message.startswith("say "):
            self.sql.exec("INSERT INTO log (line) VALUES (?)", (message[4:],), durable=True)
            for other in self.websockets():
                other.send(message[4:])
        elif message.startswith("tag "):
            ws.send(",".join(w.attachment["user"] for w in self.websockets(message[4:])))
        elif message == "attach big":
            ws.attachment = "x" * 5000
        elif message == "attach":
            ws.attachment = {"user": "renamed"}
            ws.send("ok")
        elif message == "bad send":
            ws.send(123)  # type: ignore[arg-type]
        elif message == "bad close":
            ws.close(1001)
        elif message == "who":
            ws.send(ws.attachment["user"])

    async def websocket_close(self, ws: ak.WebSocket, code: int, reason: str) -> None:
        self.sql.exec("INSERT INTO log (line) VALUES (?)", (f"closed {code} {reason}",))

    @ak.route("GET", "/log")
    async def log(self, req: ak.Request) -> ak.Response:
        return ak.Response.json([r[0] for r in self.sql.exec("SELECT line FROM log ORDER BY id")])

    @ak.route("GET", "/accept-here")
    async def accept_here(self, req: ak.Request) -> ak.Response:
        req.accept_websocket()
        return ak.Response(200)


async def log_of(th: ak.testing.TestHost, name: str) -> list[str]:
    reply = await th.request("GET", f"/room/{name}/log")
    assert reply.status == 200, reply.body
    return list(reply.json())


async def test_hibernation_under_a_mock_clock(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as th:
        async with (
            th.websocket("/room/a/ws?user=ann") as ann,
            th.websocket("/room/a/ws?user=bob") as bob,
        ):
            assert await ann.receive() == "hello" and await bob.receive() == "hello"
            await trio.sleep(th.host.idle_timeout * 2)  # evicted: no event for a while
            assert "room/a" not in th.host.activations
            await ann.send("ping")  # no wake-up
            assert await ann.receive() == "pong" and "room/a" not in th.host.activations
            await bob.send("who")  # the attachment outlived the instance
            assert await bob.receive() == "bob"
            await bob.send("say hi")
            assert await ann.receive() == "hi" and await bob.receive() == "hi"
        assert await log_of(th, "a") == ["hi", "closed 1000 ", "closed 1000 "]


async def test_tags_select_sockets_and_attachments_change(data_dir: Path) -> None:
    async with (
        open_host(app, data_dir) as th,
        th.websocket("/room/t/ws?user=a&tag=red") as a,
        th.websocket("/room/t/ws?user=b&tag=blue") as b,
        th.websocket("/room/t/ws?user=c&tag=red") as c,
    ):
        for s in (a, b, c):
            await s.receive()
        await b.send("tag red")
        assert await b.receive() == "a,c"
        await c.send("attach")
        assert await c.receive() == "ok"
        await b.send("tag red")
        assert await b.receive() == "a,renamed"


async def settle(sock: TestSocket) -> None:
    """Let the room's first syncs end (its registration), so the next one is ours."""
    await sock.send("who")
    await sock.receive()
    await trio.sleep(0.3)


async def test_sends_after_a_gated_write_wait_until_it_is_durable(
    data_dir: Path,
    disk: Disk,  # noqa: F811
) -> None:
    async with open_host(app, data_dir) as th, th.websocket("/room/g/ws?user=a") as a:
        assert await a.receive() == "hello"
        await settle(a)
        disk.hold_next = "g.sqlite"
        await a.send("say one")  # the handler has run: its send is held by the gate
        await trio.to_thread.run_sync(disk.holding.wait, 5)
        await trio.sleep(0.1)
        assert not a.received
        disk.released.set()
        with trio.fail_after(5):
            assert await a.receive() == "one"


async def test_a_failed_sync_closes_the_actor_s_sockets_with_1011(
    data_dir: Path,
    disk: Disk,  # noqa: F811
) -> None:
    async with open_host(app, data_dir) as th, th.websocket("/room/f/ws?user=a") as a:
        assert await a.receive() == "hello"
        await settle(a)
        disk.fail_next = "f.sqlite"
        await a.send("say lost")
        with trio.fail_after(5), pytest.raises(WebSocketClosed) as closed:
            await a.receive()  # "lost" never leaves: it may not be durable
        assert closed.value.code == 1011
        assert th.host.sockets.count_of("room/f") == 0


async def test_a_restart_closes_sockets_with_1001_and_clients_reconnect(data_dir: Path) -> None:
    async with open_host(app, data_dir) as th:
        async with th.websocket("/room/r/ws?user=a") as a:
            assert await a.receive() == "hello"
            await a.send("say kept")
            assert await a.receive() == "kept"
            await th.restart()
            with pytest.raises(WebSocketClosed) as closed:
                await a.receive()
            assert closed.value.code == 1001
        async with th.websocket("/room/r/ws?user=a") as again:
            assert await again.receive() == "hello"
        assert (await log_of(th, "r"))[0] == "kept"


async def test_bad_input_gets_clear_errors(data_dir: Path) -> None:
    async with open_host(app, data_dir, debug=False) as th:
        with pytest.raises(UpgradeRefused) as refused:
            async with th.websocket("/room/b/ws?kind=wrong"):
                pass
        assert refused.value.response.status == 500
        with pytest.raises(UpgradeRefused) as refused:
            async with th.websocket("/room/b/ws?kind=refuse"):
                pass
        assert refused.value.response.status == 409
        assert th.host.sockets.count_of("room/b") == 0  # accepted, then refused: forgotten
        reply = await th.request("GET", "/room/b/accept-here")
        assert reply.status == 500  # RuntimeError: not an upgrade
        reply = await th.request("GET", "/room/b/ws")
        assert reply.status == 426 and reply.headers["upgrade"] == "websocket"
        with pytest.raises(UpgradeRefused) as refused:
            async with th.websocket("/room/b/log"):
                pass
        assert refused.value.response.status == 404
        async with th.websocket("/room/b/ws?user=a") as a:
            await a.receive()
            for bad in ("attach big", "bad send", "bad close"):
                await a.send(bad)  # the handler raised: logged, the socket stays
            await a.send("who")
            assert await a.receive() == "a"  # the attachment did not change
        with pytest.raises(ValueError, match="tags"):
            check_tags("red")  # one str, not a collection of them
        with pytest.raises(ValueError, match="msgpack"):
            encode_attachment(object())


async def test_limits_of_the_host_and_of_an_actor(data_dir: Path) -> None:
    limits = SocketLimits(max_sockets=3, max_per_actor=2, max_message=100, send_buffer=1000)
    async with (
        open_host(app, data_dir, socket_limits=limits) as th,
        th.websocket("/room/l/ws") as one,
        th.websocket("/room/l/ws") as two,
    ):
        with pytest.raises(UpgradeRefused) as refused:
            async with th.websocket("/room/l/ws"):
                pass
        assert refused.value.response.status == 503
        async with th.websocket("/room/m/ws"):
            with pytest.raises(UpgradeRefused) as refused:
                async with th.websocket("/room/n/ws"):
                    pass
            assert refused.value.response.status == 503
        await one.receive()
        await one.send("x" * 101)
        assert one.close_code == 1009
        assert two.ws is not None  # what an actor sends has the same bound
        with pytest.raises(ValueError, match="at most 100 bytes"):
            two.ws.send("y" * 101)


async def test_rm_refuses_an_actor_with_open_sockets(data_dir: Path) -> None:
    async with open_host(app, data_dir) as th:
        async with th.websocket("/room/d/ws") as a:
            await a.receive()
            with pytest.raises(ak.RemoteError) as busy:
                await th.host.remove("room/d")
            assert busy.value.status == 409 and "WebSockets" in busy.value.message
        await trio.sleep(0.5)  # its close event's write is synced
        await th.host.remove("room/d")


def test_classes_that_cannot_serve_sockets_are_refused_at_import() -> None:
    other = ak.App()
    with pytest.raises(TypeError, match="no websocket_message"):

        @other.actor("a")
        class NoHandler(ak.Actor):
            @ak.websocket("/ws")
            async def join(self, req: ak.Request) -> ak.WebSocket:
                return req.accept_websocket()

    with pytest.raises(TypeError, match="websocket_auto_reply"):

        @other.actor("b")
        class BadReply(ak.Actor):
            websocket_auto_reply = ("ping",)  # type: ignore[assignment]

    with pytest.raises(TypeError, match="async def"):

        @other.actor("c")
        class SyncHandler(ak.Actor):
            def websocket_message(self, ws: ak.WebSocket, message: str) -> None:
                pass


class MovableRouter(LocalRouter):
    """Serves every address until ``moved`` (as a cluster host whose lease ran out)."""

    moved = False

    def serves(self, address: str) -> bool:
        return not self.moved


async def test_sockets_of_an_actor_served_elsewhere_now_close_with_1012(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    routers: list[MovableRouter] = []

    def router(host: Target) -> MovableRouter:
        routers.append(MovableRouter(host))
        return routers[-1]

    async with (
        open_host(app, data_dir, router=router) as th,
        th.websocket("/room/m/ws?user=a") as a,
        th.websocket("/room/m/ws?user=b") as b,
    ):
        assert await a.receive() == "hello" and await b.receive() == "hello"
        routers[-1].moved = True
        await trio.sleep(WATCH_EVERY + 0.1)  # the host looks once a second
        for sock in (a, b):
            with pytest.raises(WebSocketClosed) as closed:
                await sock.receive()
            assert closed.value.code == 1012
        assert th.host.sockets.count_of("room/m") == 0
