"""The HTTP/1.1 server of ``actorkeep serve``: trio sockets, h11, and the ``Front``.

One task per connection reads a request with h11, hands it to ``Front.handle`` and writes the
reply. Nothing a client sends can end the process: every failure of a connection is logged
with an id and closes that connection only. Slow and idle clients are timed out, the number of
connections is capped below the file-descriptor budget, and when the cap is reached the
connection that has waited longest for its request (idle keep-alive first, then the slowest
upload) is closed to make room, so clients that send whole requests keep getting answers.
HTTP/2 is not served (decision 0010): a prior-knowledge preface gets ``505`` and the
connection is closed. See docs/decisions/0010-http-server.md.
"""

from __future__ import annotations

import contextlib
import errno
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import h11
import structlog
import trio

from ..http import Response, error_response
from ..runtime.host import Host
from .connections import Connection, Connections
from .front import Front

log = structlog.get_logger("actorkeep")

#: accept() errors that mean "out of descriptors or memory", not a broken listener.
CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
RECEIVE_SIZE = 65536
#: Seconds a refused or closing connection gets to take its last reply.
LAST_WORDS = 1.0
#: After ``transfer_grace``, every window of this many seconds must bring ``min_rate`` bytes
#: per second of a body (or the rest of it): a body may not bank a fast start and then trickle.
RATE_WINDOW = 5.0
#: At most this many refusals (at the cap) are written at once; beyond, connections are
#: closed at once.
MAX_REFUSING = 64
_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
_NO_BODY_STATUSES = frozenset({204, 304})
#: What a stream raises once the client has gone.
_GONE = (trio.BrokenResourceError, trio.ClosedResourceError)


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """What the server allows a client; every field is validated on creation."""

    #: Open connections, at most. Keep it below the open-file limit minus what actors use.
    max_connections: int = 1024
    #: Seconds an idle keep-alive connection is kept.
    keep_alive_timeout: float = 5.0
    #: Requests served on one connection before it is closed (the client reconnects).
    keep_alive_requests: int = 1000
    #: Seconds from a connection's start (or its first byte after keep-alive) to a whole
    #: request head.
    header_timeout: float = 10.0
    #: Bytes of request line and headers, at most (431 beyond).
    max_header_bytes: int = 16 * 1024
    #: A body, and a reply being written, get this many seconds plus one second per
    #: ``min_rate`` bytes: a client slower than that on average is cut off (408 for a body).
    transfer_grace: float = 10.0
    min_rate: float = 4096.0
    #: Seconds that requests already running get to finish at shutdown.
    graceful_timeout: float = 5.0

    def __post_init__(self) -> None:
        for name in ("keep_alive_timeout", "header_timeout", "transfer_grace", "min_rate"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive number of seconds, not {value!r}")
        if not (isinstance(self.graceful_timeout, int | float) and self.graceful_timeout >= 0):
            raise ValueError("graceful_timeout must be a number of seconds >= 0")
        for name in ("max_connections", "keep_alive_requests", "max_header_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")


class _Timeout(Exception):
    """The client did not send what it should have in time."""

    def __init__(self, partial: bool) -> None:
        self.partial = partial  # some of it had arrived


class _Refused(Exception):
    """The request is answered without running: ``response``, then the connection closes."""

    def __init__(self, response: Response) -> None:
        self.response = response


class HttpServer:
    """Serves a ``Front`` on listeners. ``serve_http`` runs it around a host's life."""

    def __init__(self, front: Front, limits: ServerLimits | None = None) -> None:
        self.front = front
        self.host = front.host
        self.limits = limits or ServerLimits()
        self.draining = False
        self._conns = Connections(self.limits.min_rate, self.host.inflight)
        self._refusing = 0
        self._handling = 0
        self._handled_all = trio.Event()
        self._accept_errors = 0
        self._accept_error_logged = -math.inf
        self.refused = 0  # connections refused at the cap
        self.host.inflight.reclaim = self._conns.reclaim

    @property
    def connections(self) -> int:
        """Connections open now."""
        return len(self._conns)

    @property
    def shed(self) -> int:
        """Connections closed to make room for new ones (or for their bytes)."""
        return self._conns.shed

    # -- accepting --------------------------------------------------------------------------
    async def accept_loop(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        """Accept connections until cancelled; each gets a task in ``nursery``."""
        async with listener:
            while True:
                try:
                    stream = await listener.accept()
                except OSError as exc:
                    if exc.errno not in CAPACITY_ERRNOS:
                        raise
                    self._note_accept_error(exc)
                    # Closing a waiting connection frees a descriptor once its task has run.
                    await trio.sleep(0 if self._conns.shed_one() else 0.05)
                    continue
                conns = self._conns
                if len(conns) >= self.limits.max_connections and not conns.shed_one():
                    self._refuse(stream, nursery)
                    continue
                conn = conns.add(stream.socket.fileno())
                nursery.start_soon(self._serve_connection, conn, stream)

    def _note_accept_error(self, exc: OSError) -> None:
        self._accept_errors += 1
        now = trio.current_time()
        if now - self._accept_error_logged >= 10.0:
            log.warning(
                "accept failed: out of file descriptors or memory; closing waiting connections",
                error=errno.errorcode.get(exc.errno or 0, str(exc.errno)),
                times=self._accept_errors,
                connections=len(self._conns),
            )
            self._accept_error_logged = now
            self._accept_errors = 0

    def _refuse(self, stream: trio.SocketStream, nursery: trio.Nursery) -> None:
        self.refused += 1
        if self._refusing >= MAX_REFUSING:
            nursery.start_soon(trio.aclose_forcefully, stream)
            return
        self._refusing += 1
        nursery.start_soon(self._write_refusal, stream)

    async def _write_refusal(self, stream: trio.SocketStream) -> None:
        try:
            with trio.move_on_after(LAST_WORDS), contextlib.suppress(*_GONE):
                await stream.send_all(_REFUSAL)
        finally:
            self._refusing -= 1
            await trio.aclose_forcefully(stream)

    # -- shutdown ---------------------------------------------------------------------------
    def drain(self) -> None:
        """Stop taking requests: waiting connections close now, the rest after their reply."""
        self.draining = True
        self._conns.close_waiting()
        if self._handling == 0:
            self._handled_all.set()

    async def wait_handled(self) -> None:
        """Wait until no request is being handled (after ``drain``)."""
        if self._handling:
            await self._handled_all.wait()

    # -- one connection ---------------------------------------------------------------------
    async def _serve_connection(self, conn: Connection, stream: trio.SocketStream) -> None:
        h = h11.Connection(h11.SERVER, max_incomplete_event_size=self.limits.max_header_bytes)
        try:
            with conn.scope:
                await self._requests(conn, h, stream)
        except _GONE:
            pass  # the client went away
        except Exception as exc:  # a bug: this connection ends, nothing else does
            error_id = self.host.error_id()
            log.error("connection failed", error_id=error_id, exc_info=exc)
            with trio.move_on_after(LAST_WORDS) as scope:
                scope.shield = True
                await self._answer(h, stream, _internal_error(error_id))
        finally:
            self._conns.remove(conn)
            await trio.aclose_forcefully(stream)

    async def _requests(self, conn: Connection, h: h11.Connection, stream: Any) -> None:
        limits = self.limits
        served = 0
        deadline = trio.current_time() + limits.header_timeout
        event: Any = None  # the next request, when it was already buffered (pipelined)
        while True:
            try:
                if event is None:
                    event = await self._next_event(h, stream, deadline, conn)
            except _Timeout as exc:
                if exc.partial:
                    await self._answer(h, stream, _timeout("request head too slow"))
                return
            except h11.RemoteProtocolError as exc:
                await self._answer(h, stream, _protocol_error(exc))
                return
            if isinstance(event, h11.ConnectionClosed):
                return
            assert isinstance(event, h11.Request), event
            request, event = event, None
            self._conns.move(conn, "body")
            served += 1
            self._handling += 1
            try:
                resp = await self._handle(conn, h, stream, request)
            except _Refused as refused:
                await self._answer(h, stream, refused.response, request.method)
                return
            finally:
                self._handling -= 1
                if self.draining and self._handling == 0:
                    self._handled_all.set()
            close = (
                self.draining or served >= limits.keep_alive_requests or not _keeps_alive(request)
            )
            if not await self._send_response(h, stream, request.method, resp, close):
                return
            if close or h.our_state is h11.MUST_CLOSE or self.draining:
                return
            h.start_next_cycle()
            self._conns.move(conn, "idle")
            try:
                event = h.next_event()
            except h11.RemoteProtocolError as exc:
                await self._answer(h, stream, _protocol_error(exc))
                return
            if event is h11.NEED_DATA:
                event = None
                # Idle: the next request's first byte within the keep-alive time.
                with trio.move_on_after(limits.keep_alive_timeout) as idle:
                    h.receive_data(await stream.receive_some(RECEIVE_SIZE))
                if idle.cancelled_caught:
                    return
                self._conns.move(conn, "head")
            deadline = trio.current_time() + limits.header_timeout

    async def _handle(
        self, conn: Connection, h: h11.Connection, stream: Any, request: h11.Request
    ) -> Response:
        """Read the body and ask the front. ``_Refused`` if the request must not run.

        Until the body is whole the connection still waits for its client, and may be closed
        to make room (``Connections.shed_one``); from then on it waits for the host, and is kept."""
        host = self.host
        if request.http_version not in (b"1.1", b"1.0"):
            raise _Refused(error_response(505, "HTTPVersionNotSupported", "HTTP/1.1 only"))
        if self.draining:
            raise _Refused(_HOST_CLOSED)
        length: int | None = None
        headers: list[tuple[str, str]] = []
        # h11 bounds a head that arrives in pieces; one that arrives whole is measured here.
        size = len(request.method) + len(request.target) + 12
        for key, value in request.headers:
            name = key.decode("latin-1")
            if name == "content-length":
                length = int(value)  # h11 checked that it is a number
            headers.append((name, value.decode("latin-1")))
            size += len(key) + len(value) + 4
        if size > self.limits.max_header_bytes:
            raise _Refused(error_response(431, "HeadersTooLarge", "request head too large"))
        if length is not None and length > host.max_body:
            raise _Refused(_too_large(host))
        try:
            body = await self._read_body(conn, h, stream, length)
        except _Timeout:
            raise _Refused(_timeout("request body too slow")) from None
        except h11.RemoteProtocolError as exc:
            raise _Refused(_protocol_error(exc)) from None
        finally:
            host.inflight.give(conn.held)  # the front takes the whole body's share itself
            conn.held = 0
        self._conns.move(conn, "busy")
        target = request.target.decode("latin-1")
        path, _, query = target.partition("?")
        return await self.front.handle(request.method.decode("ascii"), path, query, headers, body)

    async def _read_body(
        self, conn: Connection, h: h11.Connection, stream: Any, length: int | None
    ) -> bytes:
        """The request body, in time, taking its share of the in-flight budget as it arrives
        (``conn.held``): a declared length costs nothing until the bytes come.

        In time: by ``transfer_grace`` seconds, and then in every ``RATE_WINDOW`` seconds, at
        least ``min_rate`` bytes a second (or all that is left of a declared length) must
        arrive, so a body cannot bank a fast start and then trickle.
        """
        limits = self.limits
        host = self.host
        if h.client_is_waiting_for_100_continue:
            continue_ = h11.InformationalResponse(status_code=100, headers=[])
            await self._send_all(stream, h.send(continue_))
        chunks: list[bytes] = []
        conn.window_start = trio.current_time()
        conn.window_base = 0
        window_end = conn.window_start + limits.transfer_grace
        need = limits.min_rate * limits.transfer_grace  # in the first window
        while True:
            try:
                event = await self._next_event(h, stream, window_end)
            except _Timeout:
                left = need if length is None else min(need, length - conn.held)
                if conn.held - conn.window_base < left:
                    raise
                conn.window_start, conn.window_base = window_end, conn.held
                window_end += RATE_WINDOW
                need = limits.min_rate * RATE_WINDOW
                continue
            if isinstance(event, h11.Data):
                size = conn.held + len(event.data)
                if size > host.max_body:
                    raise _Refused(_too_large(host))
                if not host.inflight.take(len(event.data)):
                    raise _Refused(_NO_MEMORY)
                conn.held = size
                chunks.append(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return b"".join(chunks)
            else:  # ConnectionClosed
                raise trio.BrokenResourceError("the client left mid-body")

    async def _next_event(
        self, h: h11.Connection, stream: Any, deadline: float, conn: Connection | None = None
    ) -> Any:
        """h11's next event, receiving until ``deadline`` (``_Timeout``). With ``conn``, the
        first bytes of a request move it to "head"."""
        partial = False
        while True:
            event = h.next_event()
            if event is not h11.NEED_DATA:
                return event
            with trio.move_on_at(deadline):
                data = await stream.receive_some(RECEIVE_SIZE)
                if data and not partial:
                    partial = True
                    if conn is not None and conn.stage in ("fresh", "idle"):
                        self._conns.move(conn, "head")
                h.receive_data(data)
                continue
            raise _Timeout(partial)

    # -- writing ----------------------------------------------------------------------------
    async def _send_response(
        self, h: h11.Connection, stream: Any, method: bytes, resp: Response, close: bool
    ) -> bool:
        """Write ``resp``; False if the client did not take it in time."""
        status = resp.status
        body = resp.body
        headers = [
            (k, v)
            for k, v in resp.headers.items()
            if k not in ("content-length", "connection", "transfer-encoding")
        ]
        if status not in _NO_BODY_STATUSES:
            headers.append(("content-length", str(len(body))))
        if close:
            headers.append(("connection", "close"))
        try:
            event = h11.Response(
                status_code=status, headers=headers, reason=_REASONS.get(status, b"")
            )
        except h11.LocalProtocolError as exc:  # a status or header HTTP cannot carry
            error_id = self.host.error_id()
            log.error("invalid response", error_id=error_id, status=status, error=str(exc))
            return await self._send_response(h, stream, method, _internal_error(error_id), close)
        parts = [h.send(event) or b""]
        if body and method != b"HEAD" and status not in _NO_BODY_STATUSES:
            parts.append(h.send(h11.Data(data=body)) or b"")
        parts.append(h.send(h11.EndOfMessage()) or b"")
        return await self._send_all(stream, b"".join(parts))

    async def _send_all(self, stream: Any, data: bytes) -> bool:
        limits = self.limits
        with trio.move_on_after(limits.transfer_grace + len(data) / limits.min_rate):
            await stream.send_all(data)
            return True
        return False

    async def _answer(
        self, h: h11.Connection, stream: Any, resp: Response, method: bytes = b"GET"
    ) -> None:
        """Answer ``resp`` and close, if a reply can still be written on this connection.

        A client still sending its body would get a reset instead of the answer if the socket
        closed with its bytes unread: so read and drop them for a moment first (a lingering
        close)."""
        if h.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        mid_body = h.their_state is h11.SEND_BODY
        with trio.move_on_after(LAST_WORDS), contextlib.suppress(*_GONE):
            await self._send_response(h, stream, method, resp, True)
            if mid_body:
                await stream.send_eof()
                while await stream.receive_some(RECEIVE_SIZE):
                    pass


def _keeps_alive(request: h11.Request) -> bool:
    for key, value in request.headers:
        if key == b"connection":
            return b"close" not in value.lower()
    return request.http_version == b"1.1"


def _too_large(host: Host) -> Response:
    return error_response(413, "PayloadTooLarge", f"body over {host.max_body} bytes")


def _timeout(message: str) -> Response:
    return error_response(408, "RequestTimeout", message)


def _protocol_error(exc: h11.RemoteProtocolError) -> Response:
    return error_response(exc.error_status_hint, "BadRequest", f"malformed HTTP: {exc}")


def _internal_error(error_id: str) -> Response:
    return error_response(500, "InternalError", f"internal error (id {error_id})")


_NO_MEMORY = error_response(
    503, "Overloaded", "too many request bytes in flight", {"retry-after": "1"}
)
_HOST_CLOSED = error_response(503, "HostClosed", "the host is shutting down", {"retry-after": "1"})
_REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"retry-after: 1\r\nconnection: close\r\ncontent-length: 55\r\n\r\n"
    b'{"error":"Overloaded","message":"too many connections"}'
)


async def serve_http(
    host: Host,
    listeners: list[trio.SocketListener],
    limits: ServerLimits | None = None,
    *,
    until: Callable[[], Awaitable[object]],
    task_status: trio.TaskStatus[HttpServer] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Open ``host``, serve it on ``listeners`` until ``until()`` returns, then shut down.

    Shutdown: stop accepting, close idle connections, give running requests
    ``graceful_timeout`` seconds, then close the host, which answers what is still queued or
    running with 503 ``HostClosed``; those replies are written (with ``connection: close``)
    before the connections close.
    """
    server = HttpServer(Front(host), limits)
    async with trio.open_nursery() as connections:
        async with host.open():
            async with trio.open_nursery() as acceptors:
                for listener in listeners:
                    acceptors.start_soon(server.accept_loop, listener, connections)
                task_status.started(server)
                await until()
                server.drain()
                acceptors.cancel_scope.cancel()
            with trio.move_on_after(server.limits.graceful_timeout):
                await server.wait_handled()
        # The host is closed: what was still waiting has its 503 now; let it be written.
        server.drain()
        connections.cancel_scope.deadline = trio.current_time() + LAST_WORDS
