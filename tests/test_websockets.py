"""WebSockets over real loopback sockets: ``serve_http`` in the test's trio run, and
trio-websocket (wsproto's client) or raw bytes as the client (docs/websockets.md).

Times are real (the server waits on the network), kept to fractions of a second.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio_websocket
from trio_websocket import ConnectionClosed, open_websocket_url

import actorkeep as ak
from actorkeep.front import HttpServer, ServerLimits, serve_http
from actorkeep.runtime.sockets import SocketLimits

app = ak.App()


def _user(address: str, req: ak.Request) -> str | ak.Response:
    """Before the room exists: who asks to join (403 without a name)."""
    user = req.query.get("user", "")
    return user if user else ak.Response.json({"error": "who are you?"}, 403)


@app.actor("room")
class Room(ak.Actor):
    websocket_auto_reply = ("ping", "pong")

    async def setup(self) -> None:
        self.sql.exec("CREATE TABLE IF NOT EXISTS log (id INTEGER PRIMARY KEY, line TEXT)")
        self.count_metric("setups")

    @ak.websocket("/ws", parse=_user)
    async def join(self, req: ak.Request) -> ak.WebSocket | ak.Response:
        user = req.parsed
        if user == "nobody":  # refused by the actor itself, once it runs
            return ak.Response.json({"error": "not you"}, 403)
        ws = req.accept_websocket(tags=["all", f"user:{user}"], attachment={"user": user})
        ws.send(f"welcome {user}")
        return ws

    async def websocket_message(self, ws: ak.WebSocket, message: str | bytes) -> None:
        user = ws.attachment["user"]
        if isinstance(message, bytes):
            ws.send(message[::-1])
            return
        if message == "bye":
            ws.close(4000, "as you wish")
            return
        if message.startswith("slow "):
            await trio.sleep(float(message[5:]))
            ws.send("slept")
            return
        if message.startswith("flood "):
            count, size = map(int, message.split()[1:])
            for _ in range(count):
                ws.send("x" * size)
            return
        self.sql.exec("INSERT INTO log (line) VALUES (?)", (f"{user}: {message}",), durable=True)
        for other in self.websockets("all"):
            other.send(f"{user}: {message}")

    @ak.rpc
    async def slow_send(self, seconds: float, text: str) -> None:
        await trio.sleep(seconds)
        for ws in self.websockets():
            ws.send(text)

    async def websocket_close(self, ws: ak.WebSocket, code: int, reason: str) -> None:
        user = ws.attachment["user"]
        self.sql.exec("INSERT INTO log (line) VALUES (?)", (f"{user} left ({code})",))
        for other in self.websockets():
            other.send(f"{user} left ({code})")

    @ak.route("GET", "/log")
    async def log(self, req: ak.Request) -> ak.Response:
        rows = self.sql.exec("SELECT line FROM log ORDER BY id").fetchall()
        return ak.Response.json([r[0] for r in rows])


@app.actor("private", access="internal")
class Private(ak.Actor):
    @ak.websocket("/ws")
    async def join(self, req: ak.Request) -> ak.WebSocket:
        return req.accept_websocket()

    async def websocket_message(self, ws: ak.WebSocket, message: str | bytes) -> None:
        pass


LIMITS = ServerLimits(graceful_timeout=2.0)


@contextlib.asynccontextmanager
async def serving(
    data_dir: Path, limits: ServerLimits = LIMITS, **host_options: Any
) -> AsyncIterator[tuple[HttpServer, ak.Host, str]]:
    host = ak.Host(app, ak.FileStorage(data_dir), **host_options)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        server = await nursery.start(
            functools.partial(serve_http, host, listeners, limits, until=stop.wait)
        )
        yield server, host, f"ws://127.0.0.1:{port}"
        stop.set()


async def until(check: Any, seconds: float = 5.0) -> None:
    """Until ``check()`` holds (what the host does on other connections: nothing to wait on)."""
    with trio.fail_after(seconds):
        while not check():  # noqa: ASYNC110
            await trio.sleep(0.01)


async def raw_upgrade(url: str, path: str, headers: dict[str, str] | None = None) -> bytes:
    """The server's reply to a hand-written upgrade request (up to the connection's end)."""
    port = int(url.rsplit(":", 1)[1])
    key = base64.b64encode(os.urandom(16)).decode()
    lines = {
        "host": "x",
        "upgrade": "websocket",
        "connection": "Upgrade",
        "sec-websocket-key": key,
        "sec-websocket-version": "13",
        **(headers or {}),
    }
    head = f"GET {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in lines.items() if v)
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(head.encode() + b"\r\n")
        data = b""
        with trio.fail_after(5):
            while chunk := await stream.receive_some(65536):
                data += chunk
                if b"\r\n\r\n" in data and not data.startswith(b"HTTP/1.1 101"):
                    head_end = data.index(b"\r\n\r\n")
                    length = [
                        int(line.split(b":")[1])
                        for line in data[:head_end].split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ]
                    if length and len(data) >= head_end + 4 + length[0]:
                        break
    return data


async def test_messages_are_events_in_order_and_reach_every_socket(tmp_path: Path) -> None:
    async with serving(tmp_path) as (_, host, url):
        async with (
            open_websocket_url(f"{url}/room/a/ws?user=ann") as ann,
            open_websocket_url(f"{url}/room/a/ws?user=bob") as bob,
        ):
            assert await ann.get_message() == "welcome ann"
            assert await bob.get_message() == "welcome bob"
            for i in range(20):
                await ann.send_message(f"m{i}")
            for i in range(20):
                assert await ann.get_message() == f"ann: m{i}"
                assert await bob.get_message() == f"ann: m{i}"
            await bob.send_message(b"\x01\x02\x03")
            assert await bob.get_message() == b"\x03\x02\x01"
        await until(lambda: not host.sockets.count_of("room/a"))
        log = await host.deliver("room", "a", ak.Request("GET", "/log"), (), None)
        lines = log.json()
        assert lines[:20] == [f"ann: m{i}" for i in range(20)]
        assert sorted(lines[20:]) == ["ann left (1000)", "bob left (1000)"]


async def test_hibernation_keeps_sockets_tags_and_attachments(tmp_path: Path) -> None:
    async with (
        serving(tmp_path, idle_timeout=0.2) as (_, host, url),
        open_websocket_url(f"{url}/room/h/ws?user=ann") as ann,
        open_websocket_url(f"{url}/room/h/ws?user=bob") as bob,
    ):
        await ann.get_message()
        await bob.get_message()
        await until(lambda: "room/h" not in host.activations)
        assert host.sockets.count_of("room/h") == 2  # asleep, its sockets open
        # The auto reply answers without waking the actor.
        await ann.send_message("ping")
        assert await ann.get_message() == "pong"
        assert "room/h" not in host.activations
        await bob.send_message("awake?")  # a new instance: setup runs again
        assert await ann.get_message() == "bob: awake?"
        assert await bob.get_message() == "bob: awake?"
        assert host.stats.counted[("room", "setups", "")] == 2


async def test_actor_close_and_client_close_codes(tmp_path: Path) -> None:
    async with serving(tmp_path) as (_, host, url):
        async with open_websocket_url(f"{url}/room/c/ws?user=ann") as ann:
            await ann.get_message()
            await ann.send_message("bye")
            with pytest.raises(ConnectionClosed) as closed:
                await ann.get_message()
            reason = closed.value.reason
            assert reason is not None and (reason.code, reason.reason) == (4000, "as you wish")
        async with open_websocket_url(f"{url}/room/c/ws?user=bob") as bob:
            await bob.get_message()
            await bob.aclose(code=4001, reason="later")
        with trio.fail_after(5):
            while True:
                log = await host.deliver("room", "c", ak.Request("GET", "/log"), (), None)
                if "bob left (4001)" in log.json():
                    break
                await trio.sleep(0.02)
        assert "ann left (4000)" not in log.json()  # its own close brings no event


async def test_refused_upgrades_get_statuses_and_create_nothing(tmp_path: Path) -> None:
    async with serving(tmp_path) as (_, host, url):
        assert b" 403 " in (await raw_upgrade(url, "/room/r/ws"))[:20]  # parse refused
        assert b" 403 " in (await raw_upgrade(url, "/room/n/ws?user=nobody"))[:20]  # the actor
        assert b" 403 " in (await raw_upgrade(url, "/private/p/ws"))[:20]  # internal class
        assert b" 404 " in (await raw_upgrade(url, "/nope/p/ws"))[:20]
        assert b" 404 " in (await raw_upgrade(url, "/room/r/log?user=a"))[:20]  # not a ws route
        assert b" 400 " in (await raw_upgrade(url, "/room/..%2F/ws?user=a"))[:20]
        reply = await raw_upgrade(url, "/room/v/ws?user=a", {"sec-websocket-version": "8"})
        assert b" 426 " in reply[:20] and b"sec-websocket-version: 13" in reply
        assert (
            b" 400 "
            in (await raw_upgrade(url, "/room/v/ws?user=a", {"sec-websocket-key": ""}))[:20]
        )
        # The caller header from outside is dropped: an outside client cannot pose as an actor.
        forged = await raw_upgrade(url, "/private/p/ws", {"x-actorkeep-caller": "room/x"})
        assert b" 403 " in forged[:20]
        with pytest.raises(trio_websocket.HandshakeError):
            async with open_websocket_url(f"{url}/room/r/ws"):
                pass
    names = {p.name for p in tmp_path.rglob("*") if p.is_file()}
    assert not any("private" in n or n.startswith(("r.", "v.")) for n in names), names
    assert host.sockets.count_of("room/n") == 0
    assert not (tmp_path / "actors" / "private").exists()


async def test_limits_close_big_messages_and_slow_readers(tmp_path: Path) -> None:
    limits = SocketLimits(max_message=1000, send_buffer=64 * 1024, max_per_actor=2)
    async with serving(tmp_path, socket_limits=limits) as (_, host, url):
        async with open_websocket_url(f"{url}/room/l/ws?user=ann") as ann:
            await ann.get_message()
            await ann.send_message("y" * 1001)
            with pytest.raises(ConnectionClosed) as closed:
                await ann.get_message()
            assert closed.value.reason is not None and closed.value.reason.code == 1009
        async with (
            open_websocket_url(f"{url}/room/l/ws?user=a") as a,
            open_websocket_url(f"{url}/room/l/ws?user=b") as b,
        ):
            await a.get_message()
            await b.get_message()
            third = await raw_upgrade(url, "/room/l/ws?user=c")
            assert b" 503 " in third[:20]
            # A client that reads nothing while its actor sends is cut off; the actor is not.
            with contextlib.suppress(ConnectionClosed):
                for _ in range(100):
                    await a.send_message("flood 100 900")
            await until(lambda: host.sockets.slow_closed)
            assert host.sockets.slow_closed == 1 and a.closed is not None
            assert a.closed.code == 1008
            assert await b.get_message() == "a left (1008)"  # the actor heard of it
            await b.send_message("still here")
            assert await b.get_message() == "b: still here"


async def test_a_graceful_stop_closes_with_1001_after_the_event_in_flight(tmp_path: Path) -> None:
    host = ak.Host(app, ak.FileStorage(tmp_path))
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    url = f"ws://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(functools.partial(serve_http, host, listeners, LIMITS, until=stop.wait))
        await trio.sleep(0.05)
        async with (
            open_websocket_url(f"{url}/room/s/ws?user=a") as a,
            open_websocket_url(f"{url}/room/s/ws?user=b") as b,
        ):
            await a.get_message()
            await b.get_message()
            await a.send_message("slow 0.3")
            await trio.sleep(0.1)
            stop.set()  # while a's event runs
            assert await a.get_message() == "slept"  # the event in flight ends first
            for sock in (a, b):
                with pytest.raises(ConnectionClosed) as closed:
                    await sock.get_message()
                assert closed.value.reason is not None and closed.value.reason.code == 1001


async def test_malformed_frames_close_that_socket_only(tmp_path: Path) -> None:
    async with (
        serving(tmp_path) as (_, _, url),
        open_websocket_url(f"{url}/room/m/ws?user=good") as good,
    ):
        await good.get_message()
        port = int(url.rsplit(":", 1)[1])
        for frame in (
            b"\x81\x05hello",  # not masked: clients must mask
            b"\xf1\x80\x00\x00\x00\x00",  # reserved bits set
            b"\x81\xff" + b"\xff" * 8 + b"\x00" * 4,  # a length no frame may have
        ):
            key = base64.b64encode(os.urandom(16))
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                await stream.send_all(
                    b"GET /room/m/ws?user=bad HTTP/1.1\r\nhost: x\r\nupgrade: websocket\r\n"
                    b"connection: Upgrade\r\nsec-websocket-version: 13\r\n"
                    b"sec-websocket-key: " + key + b"\r\n\r\n" + frame
                )
                data = b""
                with trio.fail_after(5):
                    while chunk := await stream.receive_some(65536):
                        data += chunk
            assert data.startswith(b"HTTP/1.1 101 ")
            frames = data[data.index(b"\r\n\r\n") + 4 :]
            close = frames[2 + frames[1] :]  # after the welcome, the close frame
            assert close[0] == 0x88 and int.from_bytes(close[2:4], "big") == 1002, close
        await good.send_message("still fine")
        seen = [await good.get_message() for _ in range(4)]
        assert seen == ["bad left (1002)"] * 3 + ["good: still fine"]
