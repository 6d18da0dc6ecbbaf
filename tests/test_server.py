"""The HTTP/1.1 server of ``actorkeep serve`` (actorkeep/front/server.py) on real loopback sockets.

Each test runs ``serve_http`` in its own trio run with short limits, and talks to it with raw
trio sockets, so every byte on the wire is the test's choice. Times are real (a MockClock would
jump while the server waits for the client's bytes), kept to fractions of a second.
"""

from __future__ import annotations

import contextlib
import functools
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import h11
import pytest
import structlog
import trio
import trio.testing

import actorkeep as ak
from actorkeep.front import HttpServer, ServerLimits, serve_http
from actorkeep.front.connections import Connections
from actorkeep.runtime.budget import ByteBudget

app = ak.App()


@app.actor("counter")
class Counter(ak.Actor):
    async def setup(self) -> None:
        self.sql.exec("CREATE TABLE IF NOT EXISTS c (id INTEGER PRIMARY KEY, n INTEGER)")

    @ak.rpc
    async def incr(self, by: int = 1) -> int:
        self.sql.exec(
            "INSERT INTO c VALUES (0, ?) ON CONFLICT(id) DO UPDATE SET n = n + excluded.n", (by,)
        )
        return int(self.sql.exec("SELECT n FROM c").fetchone()[0])

    @ak.route("GET", "/")
    async def show(self, req: ak.Request) -> ak.Response:
        row = self.sql.exec("SELECT n FROM c").fetchone()
        return ak.Response.json({"n": row[0] if row else 0})

    @ak.route("POST", "/echo")
    async def echo(self, req: ak.Request) -> ak.Response:
        return ak.Response(200, {"content-type": "application/octet-stream"}, req.body)

    @ak.rpc
    async def slow(self, seconds: float) -> str:
        await trio.sleep(seconds)
        return "done"

    @ak.route("GET", "/bad-header")
    async def bad_header(self, req: ak.Request) -> ak.Response:
        return ak.Response(200, {"x-broken": "a\r\nb"}, b"")


FAST = ServerLimits(
    max_connections=16,
    keep_alive_timeout=0.5,
    header_timeout=0.5,
    transfer_grace=0.5,
    min_rate=64 * 1024,
    graceful_timeout=0.5,
)


@contextlib.asynccontextmanager
async def serving(
    data_dir: Path, limits: ServerLimits = FAST, **host_options: Any
) -> AsyncIterator[tuple[HttpServer, int]]:
    host = ak.Host(app, ak.FileStorage(data_dir), **host_options)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        server = await nursery.start(
            functools.partial(serve_http, host, listeners, limits, until=stop.wait)
        )
        yield server, port
        stop.set()


async def connect(port: int) -> trio.SocketStream:
    return await trio.open_tcp_stream("127.0.0.1", port)


async def read_until_closed(stream: trio.SocketStream, timeout: float = 5.0) -> bytes:
    data = b""
    with trio.fail_after(timeout):
        while chunk := await stream.receive_some(65536):
            data += chunk
    return data


class Reply:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def json(self) -> Any:
        return json.loads(self.body)


async def read_replies(
    stream: trio.SocketStream, count: int, method: bytes = b"GET"
) -> list[Reply]:
    """``count`` replies from ``stream``, parsed with h11 as a client would."""
    client = h11.Connection(h11.CLIENT)
    replies: list[Reply] = []
    with trio.fail_after(5):
        while len(replies) < count:
            # h11 wants to see the request it is reading the reply of.
            client.send(h11.Request(method=method, target="/", headers=[("host", "t")]))
            client.send(h11.EndOfMessage())
            status, headers, body = 0, {}, b""
            while True:
                event = client.next_event()
                if event is h11.NEED_DATA:
                    client.receive_data(await stream.receive_some(65536))
                elif isinstance(event, h11.Response):
                    status = event.status_code
                    headers = {k.decode(): v.decode() for k, v in event.headers}
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    replies.append(Reply(status, headers, body))
                    break
                elif isinstance(event, h11.InformationalResponse):
                    continue
                else:
                    raise AssertionError(f"unexpected {event!r}")
            if client.our_state is h11.MUST_CLOSE or client.their_state is h11.MUST_CLOSE:
                break
            client.start_next_cycle()
    return replies


def rpc_request(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return (
        b"POST %s HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n%s\r\n" % (path.encode(), len(body), extra)
    ) + body


async def healthy(port: int) -> bool:
    stream = await connect(port)
    async with stream:
        await stream.send_all(b"GET /_actorkeep/health HTTP/1.1\r\nhost: t\r\n\r\n")
        (reply,) = await read_replies(stream, 1)
        return reply.status == 200


# -- HTTP/2 is not served, and cannot end the host -------------------------------------------

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def h2_headers(*fields: tuple[bytes, bytes]) -> bytes:
    """A HEADERS frame (END_STREAM | END_HEADERS, stream 1) of literal HPACK fields."""
    block = b"".join(b"\x00" + bytes([len(k)]) + k + bytes([len(v)]) + v for k, v in fields)
    return len(block).to_bytes(3, "big") + b"\x01\x05\x00\x00\x00\x01" + block


H2_PROBES = {
    "connect-without-path": h2_headers((b":method", b"CONNECT"), (b":authority", b"t")),
    "non-ascii-path": h2_headers(
        (b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/caf\xc3\xa9/x/")
    ),
    "non-ascii-method": h2_headers(
        (b":method", b"G\xc3\x89T"), (b":scheme", b"http"), (b":path", b"/counter/a/")
    ),
}


@pytest.mark.parametrize("frames", list(H2_PROBES.values()), ids=list(H2_PROBES))
async def test_http2_prior_knowledge_gets_505_and_the_host_keeps_serving(
    data_dir: Path, frames: bytes
) -> None:
    async with serving(data_dir) as (_, port):
        stream = await connect(port)
        async with stream:
            await stream.send_all(PREFACE + SETTINGS + frames)
            reply = await read_until_closed(stream)
        assert reply.startswith(b"HTTP/1.1 505 HTTP Version Not Supported\r\n"), reply
        assert b"connection: close" in reply
        assert await healthy(port)


async def test_h2c_upgrade_is_ignored(data_dir: Path) -> None:
    async with serving(data_dir) as (_, port):
        stream = await connect(port)
        async with stream:
            await stream.send_all(
                b"GET /counter/a/ HTTP/1.1\r\nhost: t\r\nconnection: Upgrade, HTTP2-Settings\r\n"
                b"upgrade: h2c\r\nhttp2-settings: AAMAAABkAAQAAP__\r\n\r\n"
            )
            (reply,) = await read_replies(stream, 1)
        assert reply.status == 200 and reply.json() == {"n": 0}


# -- malformed HTTP/1.1 ----------------------------------------------------------------------

MALFORMED = {
    "non-ascii-target": (b"GET /caf\xc3\xa9/x/ HTTP/1.1\r\nhost: t\r\n\r\n", 400),
    "no-host": (b"GET /counter/a/ HTTP/1.1\r\n\r\n", 400),
    "bad-content-length": (
        b"POST /counter/a/echo HTTP/1.1\r\nhost: t\r\ncontent-length: x\r\n\r\n",
        400,
    ),
    "two-lengths": (
        b"POST /counter/a/echo HTTP/1.1\r\nhost: t\r\ncontent-length: 1\r\n"
        b"content-length: 2\r\n\r\nab",
        400,
    ),
    "garbage": (b"\x00\x01\x02\xff\r\n\r\n", 400),
    "huge-header": (b"GET / HTTP/1.1\r\nhost: t\r\nx: " + b"a" * 20_000 + b"\r\n\r\n", 431),
    "http-0.9": (b"GET /\r\n\r\n", 400),
    "http-3.0": (b"GET / HTTP/3.0\r\nhost: t\r\n\r\n", 505),
}


@pytest.mark.parametrize(("request_bytes", "status"), list(MALFORMED.values()), ids=list(MALFORMED))
async def test_malformed_requests_are_refused_and_create_nothing(
    data_dir: Path, request_bytes: bytes, status: int
) -> None:
    async with serving(data_dir) as (_, port):
        stream = await connect(port)
        async with stream:
            await stream.send_all(request_bytes)
            reply = await read_until_closed(stream)
        assert reply.startswith(b"HTTP/1.1 %d " % status), reply
        assert await healthy(port)
    assert not (data_dir / "actors").exists()


async def test_a_response_http_cannot_carry_is_a_500_not_a_dead_connection(
    data_dir: Path,
) -> None:
    async with serving(data_dir) as (_, port):
        stream = await connect(port)
        async with stream:
            await stream.send_all(b"GET /counter/a/bad-header HTTP/1.1\r\nhost: t\r\n\r\n")
            (reply,) = await read_replies(stream, 1)
        assert reply.status == 500 and reply.json()["error"] == "InternalError"


# -- keep-alive, pipelining, bodies ------------------------------------------------------------


async def test_keep_alive_and_pipelined_requests_are_answered_in_order(data_dir: Path) -> None:
    async with serving(data_dir) as (_, port):
        stream = await connect(port)
        async with stream:
            one = rpc_request("/counter/a/_rpc/incr", b'{"by": 1}')
            await stream.send_all(one * 3 + b"GET /counter/a/ HTTP/1.1\r\nhost: t\r\n\r\n")
            replies = await read_replies(stream, 4)
            assert [r.json() for r in replies] == [1, 2, 3, {"n": 3}]
            # Still open for more.
            await stream.send_all(one)
            (reply,) = await read_replies(stream, 1)
            assert reply.json() == 4


async def test_chunked_body_and_expect_100_continue(data_dir: Path) -> None:
    async with serving(data_dir) as (_, port):
        stream = await connect(port)
        async with stream:
            await stream.send_all(
                b"POST /counter/a/echo HTTP/1.1\r\nhost: t\r\nexpect: 100-continue\r\n"
                b"content-length: 5\r\n\r\n"
            )
            with trio.fail_after(2):
                interim = await stream.receive_some(65536)
            assert interim.startswith(b"HTTP/1.1 100 "), interim
            await stream.send_all(b"hello")
            (reply,) = await read_replies(stream, 1)
            assert reply.body == b"hello"
            await stream.send_all(
                b"POST /counter/a/echo HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n"
                b"3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n"
            )
            (reply,) = await read_replies(stream, 1)
            assert reply.body == b"abcdefg"


async def test_head_gets_the_length_and_no_body(data_dir: Path) -> None:
    async with serving(data_dir) as (_, port):
        stream = await connect(port)
        async with stream:
            await stream.send_all(b"HEAD /_actorkeep/health HTTP/1.1\r\nhost: t\r\n\r\n")
            (reply,) = await read_replies(stream, 1, method=b"HEAD")
        assert reply.status == 200 and reply.body == b""
        assert int(reply.headers["content-length"]) > 0


async def test_bodies_over_max_body_get_413_unread(data_dir: Path) -> None:
    async with serving(data_dir, max_body=100) as (_, port):
        stream = await connect(port)
        async with stream:
            await stream.send_all(
                b"POST /counter/a/echo HTTP/1.1\r\nhost: t\r\ncontent-length: 101\r\n\r\n"
            )
            reply = await read_until_closed(stream)
        assert reply.startswith(b"HTTP/1.1 413 "), reply
        stream = await connect(port)
        async with stream:
            await stream.send_all(
                b"POST /counter/a/echo HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n"
                + b"40\r\n"
                + b"x" * 64
                + b"\r\n"
                + b"40\r\n"
                + b"x" * 64
                + b"\r\n"
            )
            reply = await read_until_closed(stream)
        assert reply.startswith(b"HTTP/1.1 413 "), reply
    assert not (data_dir / "actors").exists()


async def test_a_connection_is_closed_after_keep_alive_requests(data_dir: Path) -> None:
    limits = ServerLimits(keep_alive_requests=3, graceful_timeout=0.1)
    async with serving(data_dir, limits) as (_, port):
        stream = await connect(port)
        async with stream:
            one = b"GET /_actorkeep/health HTTP/1.1\r\nhost: t\r\n\r\n"
            await stream.send_all(one * 3)
            replies = await read_replies(stream, 3)
            assert [r.status for r in replies] == [200, 200, 200]
            assert replies[-1].headers.get("connection") == "close"
            assert "connection" not in replies[0].headers
            assert await read_until_closed(stream) == b""


# -- slow and idle clients ---------------------------------------------------------------------


async def test_idle_and_slow_clients_are_cut_off(data_dir: Path) -> None:
    limits = ServerLimits(
        keep_alive_timeout=0.3, header_timeout=0.3, transfer_grace=0.3, min_rate=1000
    )
    async with serving(data_dir, limits) as (_, port):
        # A connection that sends nothing is closed without a word.
        stream = await connect(port)
        async with stream:
            assert await read_until_closed(stream) == b""
        # Half a request head: 408 after the header timeout.
        stream = await connect(port)
        async with stream:
            await stream.send_all(b"GET /counter/a/ HTTP/1.1\r\nhost:")
            assert (await read_until_closed(stream)).startswith(b"HTTP/1.1 408 ")
        # Headers of a 1 MiB body, then nothing.
        stream = await connect(port)
        async with stream:
            await stream.send_all(
                b"POST /counter/a/echo HTTP/1.1\r\nhost: t\r\ncontent-length: 1048576\r\n\r\n"
            )
            started = trio.current_time()
            assert (await read_until_closed(stream)).startswith(b"HTTP/1.1 408 ")
            assert trio.current_time() - started < 2
        # A body trickling at 100 bytes/s, under min_rate: cut off, though bytes keep coming.
        stream = await connect(port)
        async with stream:
            await stream.send_all(
                b"POST /counter/a/echo HTTP/1.1\r\nhost: t\r\ncontent-length: 100000\r\n\r\n"
            )
            got = b""
            with trio.fail_after(5):
                with contextlib.suppress(trio.BrokenResourceError):
                    while not got:
                        await stream.send_all(b"x" * 10)
                        with trio.move_on_after(0.1):
                            got = await stream.receive_some(65536)
            assert got.startswith(b"HTTP/1.1 408 "), got
        # An idle keep-alive connection is closed after the keep-alive time.
        stream = await connect(port)
        async with stream:
            await stream.send_all(b"GET /_actorkeep/health HTTP/1.1\r\nhost: t\r\n\r\n")
            await read_replies(stream, 1)
            started = trio.current_time()
            assert await read_until_closed(stream) == b""
            assert 0.2 < trio.current_time() - started < 2
        assert await healthy(port)
    assert not (data_dir / "actors").exists()


async def test_at_the_connection_cap_the_longest_waiting_connection_makes_room(
    data_dir: Path,
) -> None:
    limits = ServerLimits(max_connections=8, header_timeout=30, transfer_grace=30)
    async with serving(data_dir, limits) as (server, port):
        hostile: list[trio.SocketStream] = []
        for i in range(40):  # five times the cap, each holding a request it never finishes
            stream = await connect(port)
            await stream.send_all(
                b"POST /counter/a/echo HTTP/1.1\r\nhost: t\r\ncontent-length: 1000000\r\n\r\n"
                if i % 2
                else b"GET /counter/a/ HTTP/1.1\r\n"
            )
            hostile.append(stream)
        await trio.sleep(0.1)
        assert server.connections <= limits.max_connections
        # A client that sends whole requests is answered every time.
        for n in range(1, 11):
            stream = await connect(port)
            async with stream:
                await stream.send_all(rpc_request("/counter/a/_rpc/incr", b"{}"))
                with trio.fail_after(1):
                    (reply,) = await read_replies(stream, 1)
                assert reply.json() == n
        assert server.shed >= 40 - limits.max_connections
        for stream in hostile:
            await stream.aclose()


async def test_at_the_cap_with_every_connection_busy_new_ones_get_503(data_dir: Path) -> None:
    limits = ServerLimits(max_connections=2, graceful_timeout=0.1)
    async with serving(data_dir, limits) as (server, port):
        busy = [await connect(port) for _ in range(2)]
        for i, stream in enumerate(busy):
            await stream.send_all(rpc_request(f"/counter/b{i}/_rpc/slow", b'{"seconds": 1}'))
        await trio.sleep(0.2)
        with structlog.testing.capture_logs() as logs:
            stream = await connect(port)
            async with stream:
                reply = await read_until_closed(stream)
        assert reply.startswith(b"HTTP/1.1 503 "), reply
        assert b"retry-after: 1" in reply
        assert server.refused == 1
        lines = [
            e for e in logs if e["event"] == "refusing connections: the connection cap is reached"
        ]
        assert [(e["refused"], e["max_connections"]) for e in lines] == [(1, 2)]
        for stream in busy:
            (done,) = await read_replies(stream, 1)
            assert done.json() == "done"
            await stream.aclose()


# -- shutdown ----------------------------------------------------------------------------------


async def test_shutdown_answers_every_request_it_took(data_dir: Path) -> None:
    limits = ServerLimits(graceful_timeout=0.3)
    host = ak.Host(app, ak.FileStorage(data_dir))
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    stop = trio.Event()
    replies: dict[str, Reply] = {}
    async with trio.open_nursery() as nursery:
        await nursery.start(functools.partial(serve_http, host, listeners, limits, until=stop.wait))

        async def call(label: str, request: bytes) -> None:
            stream = await connect(port)
            async with stream:
                await stream.send_all(request)
                (replies[label],) = await read_replies(stream, 1)

        # A quick one finishes within the graceful time; a slow one does not, and one queued
        # behind it never starts: both get 503 HostClosed, not a closed connection.
        nursery.start_soon(call, "quick", rpc_request("/counter/q/_rpc/slow", b'{"seconds": 0.1}'))
        nursery.start_soon(call, "slow", rpc_request("/counter/s/_rpc/slow", b'{"seconds": 10}'))
        await trio.sleep(0.1)
        # Two queued: each gets its own answer (one shared outcome used to fail the second).
        nursery.start_soon(call, "queued", rpc_request("/counter/s/_rpc/incr", b"{}"))
        nursery.start_soon(call, "queued-too", rpc_request("/counter/s/_rpc/incr", b"{}"))
        idle = await connect(port)
        await idle.send_all(b"GET /_actorkeep/health HTTP/1.1\r\nhost: t\r\n\r\n")
        await read_replies(idle, 1)
        await trio.sleep(0.1)
        stop.set()
        # The idle keep-alive connection is closed at once.
        assert await read_until_closed(idle, timeout=0.2) == b""
        await idle.aclose()
    assert replies["quick"].status == 200 and replies["quick"].json() == "done"
    for label in ("slow", "queued", "queued-too"):
        assert replies[label].status == 503, label
        assert replies[label].json()["error"] == "HostClosed"
        assert replies[label].headers["connection"] == "close"
    # Nothing of the queued request ran.
    async with ak.testing.open_host(app, data_dir) as again:
        assert (await again.request("GET", "/counter/s/")).json() == {"n": 0}


async def test_at_shutdown_what_has_not_reached_the_host_does_not_run(data_dir: Path) -> None:
    """A real shutdown (``serve_http``'s ``until``): the running request is answered, with
    ``connection: close``; a request pipelined behind it and a half-sent head are never run."""
    limits = ServerLimits(graceful_timeout=2.0)
    host = ak.Host(app, ak.FileStorage(data_dir))
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(functools.partial(serve_http, host, listeners, limits, until=stop.wait))
        running = await connect(port)
        await running.send_all(
            rpc_request("/counter/s/_rpc/slow", b'{"seconds": 0.5}')
            + rpc_request("/counter/behind/_rpc/incr", b"{}")
        )
        half = await connect(port)
        await half.send_all(b"POST /counter/half/_rpc/incr HTTP/1.1\r\nhost:")
        await trio.sleep(0.2)
        stop.set()
        (reply,) = await read_replies(running, 1)
        assert reply.json() == "done" and reply.headers["connection"] == "close"
        assert await read_until_closed(running, timeout=2) == b""
        assert await read_until_closed(half, timeout=2) == b""
        await running.aclose()
        await half.aclose()
    for name in ("behind", "half"):
        assert not any((data_dir / "actors" / "counter").rglob(f"{name}.sqlite")), name


async def test_stalled_uploads_give_way_to_whole_requests_when_memory_runs_short(
    data_dir: Path,
) -> None:
    """Bodies take the in-flight budget as they arrive. Uploads that stall while holding it
    are closed (slowest first) to make room for a request that arrives whole."""
    limits = ServerLimits(transfer_grace=1.0)
    async with serving(data_dir, limits, max_body=100_000, max_inflight_bytes=200_000) as (
        server,
        port,
    ):
        stalled = []
        for _ in range(2):
            stream = await connect(port)
            await stream.send_all(
                b"POST /counter/a/echo HTTP/1.1\r\nhost: t\r\ncontent-length: 100000\r\n\r\n"
                + b"x" * 90_000
            )
            stalled.append(stream)
            await trio.sleep(0.05)
        await trio.sleep(0.2)
        assert server.host.inflight.in_use == 180_000
        await trio.sleep(1.0)  # past the first window: nothing arrived since
        stream = await connect(port)
        async with stream:
            body = b"y" * 50_000
            await stream.send_all(
                b"POST /counter/b/echo HTTP/1.1\r\nhost: t\r\ncontent-length: 50000\r\n\r\n" + body
            )
            (reply,) = await read_replies(stream, 1)
        assert reply.status == 200 and reply.body == body
        # One stalled upload made room; the other is still open and may finish.
        assert await read_until_closed(stalled[0], timeout=1) == b""
        with trio.move_on_after(0.3) as still_open:
            await stalled[1].receive_some(1)
        assert still_open.cancelled_caught
        await stalled[1].send_all(b"x" * 10_000)
        (done,) = await read_replies(stalled[1], 1)
        assert done.status == 200 and len(done.body) == 100_000
        for s in stalled:
            await s.aclose()


async def test_fast_uploads_keep_the_budget_and_a_trickle_cannot_bank_a_fast_start(
    data_dir: Path,
) -> None:
    """An upload well above the minimum rate is never closed to make room (a newcomer that
    does not fit then gets 503); an upload that sends most of its body at once and then
    trickles is cut off once a rate window brings less than the minimum."""
    limits = ServerLimits(transfer_grace=1.0, min_rate=4096)
    async with serving(data_dir, limits, max_body=200_000, max_inflight_bytes=300_000) as (
        server,
        port,
    ):
        stop = trio.Event()

        async def upload(stream: trio.SocketStream) -> None:
            await stream.send_all(
                b"POST /counter/a/echo HTTP/1.1\r\nhost: t\r\ncontent-length: 200000\r\n\r\n"
            )
            sent = 0
            while not stop.is_set() and sent < 190_000:
                await stream.send_all(b"z" * 1000)  # about 200 KB/s
                sent += 1000
                await trio.sleep(0.005)

        async with trio.open_nursery() as nursery:
            busy = [await connect(port) for _ in range(2)]
            for b in busy:
                nursery.start_soon(upload, b)
            await trio.sleep(0.5)
            stream = await connect(port)
            async with stream:
                await stream.send_all(
                    b"POST /counter/b/echo HTTP/1.1\r\nhost: t\r\ncontent-length: 150000\r\n\r\n"
                    + b"y" * 150_000
                )
                (reply,) = await read_replies(stream, 1)
            assert reply.status == 503 and reply.json()["error"] == "Overloaded"
            assert server.shed == 0
            stop.set()
        for b in busy:
            await b.aclose()
        # A fast start, then a byte every half second: 408 at the end of the next window.
        stream = await connect(port)
        async with stream:
            await stream.send_all(
                b"POST /counter/a/echo HTTP/1.1\r\nhost: t\r\ncontent-length: 100000\r\n\r\n"
                + b"x" * 99_000
            )
            started = trio.current_time()
            got = b""
            with trio.fail_after(10), contextlib.suppress(trio.BrokenResourceError):
                while not got:
                    await stream.send_all(b"x")
                    with trio.move_on_after(0.5):
                        got = await stream.receive_some(65536)
            assert got.startswith(b"HTTP/1.1 408 "), got
            assert trio.current_time() - started < 1.0 + 5.0 + 1.0


async def test_a_flood_of_empty_connections_sheds_itself_not_a_client_mid_upload(
    data_dir: Path,
) -> None:
    """At the cap, connections that have sent nothing go first (the flood's own), then half
    heads, then the slowest upload: a client uploading at a good rate gets its answer."""
    limits = ServerLimits(max_connections=8, header_timeout=30, transfer_grace=30)
    async with serving(data_dir, limits, max_body=300_000) as (server, port):
        stop = trio.Event()
        opened: list[trio.SocketStream] = []

        async def flood() -> None:
            while not stop.is_set():
                opened.append(await connect(port))  # and never send a byte
                await trio.sleep(0.001)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(flood)
            await trio.sleep(0.2)
            for _ in range(3):
                stream = await connect(port)
                async with stream:
                    await stream.send_all(
                        b"POST /counter/a/echo HTTP/1.1\r\nhost: t\r\n"
                        b"content-length: 262144\r\n\r\n"
                    )
                    for _ in range(64):
                        await stream.send_all(b"u" * 4096)
                        await trio.sleep(0.005)  # about 800 KB/s
                    (reply,) = await read_replies(stream, 1)
                assert reply.status == 200 and len(reply.body) == 262144
            stop.set()
        assert server.shed > 20  # the flood's connections, closed to make room
        for s in opened:
            await s.aclose()


async def test_at_the_cap_a_new_connection_whose_request_waits_to_be_read_is_kept() -> None:
    """Under a flood of new connections, a connection's task may run only after many more
    accepts: one whose client has already sent its request is not closed to make room (the
    silent ones are), and when only such connections are left, the newcomer is refused."""
    budget = ByteBudget(1 << 20)
    conns = Connections(min_rate=4096.0, budget=budget)
    pairs = [socket.socketpair() for _ in range(3)]
    try:
        client_sent, silent_a, silent_b = pairs
        client_sent[1].sendall(b"GET / HTTP/1.1\r\nhost: t\r\n\r\n")  # not read by anyone yet
        sent = conns.add(client_sent[0].fileno())  # the oldest
        a = conns.add(silent_a[0].fileno())
        b = conns.add(silent_b[0].fileno())
        assert not sent.silent() and a.silent() and b.silent()
        assert conns.shed_one() and a.scope.cancel_called  # the oldest silent one goes
        assert conns.shed_one() and b.scope.cancel_called
        assert not conns.shed_one()  # only the client with a request is left: keep it
        assert not sent.scope.cancel_called
        assert conns.shed == 2
    finally:
        for left, right in pairs:
            left.close()
            right.close()


async def test_a_trickle_that_opens_with_a_kilobyte_is_slow_not_a_fast_upload(
    mock_clock: trio.testing.MockClock,
) -> None:
    """A body is judged as if it had been coming for at least ``RATE_SPAN``: 1 KiB in its
    first 10 ms is a trickle, closed to make room before a new connection whose request has
    not arrived yet (seen in the hostile probe, where such trickles filled the table)."""
    conns = Connections(min_rate=4096.0, budget=ByteBudget(1 << 20))
    trickle = conns.add()
    conns.move(trickle, "body")
    trickle.window_start = trio.current_time()
    trickle.held = 1024
    mock_clock.jump(0.01)
    left, right = socket.socketpair()
    try:
        newcomer = conns.add(left.fileno())  # its client has not sent its request yet
        assert trickle.slow(trio.current_time(), 4 * 4096.0)
        assert conns.shed_one() and trickle.scope.cancel_called
        assert not newcomer.scope.cancel_called
        # An upload 2 MB in, 10 ms into a new window at 100 KB/s, is not slow.
        upload = conns.add()
        conns.move(upload, "body")
        upload.window_base = 2_000_000
        upload.window_start = trio.current_time()
        upload.held = upload.window_base + 1_000
        mock_clock.jump(0.01)
        assert not upload.slow(trio.current_time(), 4 * 4096.0)
    finally:
        left.close()
        right.close()
