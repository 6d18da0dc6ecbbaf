"""The HTTP/1.1 server of ``actorkeep serve``: trio sockets, httptools, and the ``Front``.

One task per connection reads a request (``http11.RequestReader``), hands it to
``Front.handle`` and writes the reply. Nothing a client sends can end the process: every
failure of a connection is logged with an id and closes that connection only. Slow and idle
clients are timed out, the number of connections is capped below the file-descriptor budget,
and when the cap is reached the connection that has waited longest for its request (idle
keep-alive first, then the slowest upload) is closed to make room, so clients that send whole
requests keep getting answers. HTTP/2 is not served (decision 0010): a prior-knowledge
preface gets ``505`` and the connection is closed. See docs/decisions/0010-http-server.md and
0019-http-parser.md.
"""

from __future__ import annotations

import contextlib
import errno
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import structlog
import trio

from ..http import Response, error_response
from ..runtime.budget import ByteBudget
from ..runtime.burst import BurstLog
from ..runtime.host import Host
from ..runtime.sockets import ServedElsewhere
from .connections import Connection, Connections
from .front import Front, Handler
from .http11 import (
    CLOSED,
    CONTINUE,
    END,
    MAX_FEED,
    NEED_DATA,
    ProtocolError,
    RequestHead,
    RequestReader,
    encode_response,
)
from .limits import ServerLimits
from .relay import FrontOf, Relay, open_relay
from .replies import (
    HOST_CLOSED,
    NO_MEMORY,
    REFUSAL,
    internal_error,
    log_access,
    protocol_error,
    timeout_reply,
    too_large,
)
from .websocket import Session, handshake

log = structlog.get_logger("actorkeep")

#: accept() errors that mean "out of descriptors or memory", not a broken listener.
CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
RECEIVE_SIZE = MAX_FEED
#: Seconds a refused or closing connection gets to take its last reply.
LAST_WORDS = 1.0
#: After ``transfer_grace``, every window of this many seconds must bring ``min_rate`` bytes
#: per second of a body (or the rest of it): a body may not bank a fast start and then trickle.
RATE_WINDOW = 5.0
#: At most this many refusals (at the cap) are written at once; beyond, connections are
#: closed at once.
MAX_REFUSING = 64
#: What a stream raises once the client has gone.
_GONE = (trio.BrokenResourceError, trio.ClosedResourceError)


class _Timeout(Exception):
    """The client did not send what it should have in time."""

    def __init__(self, partial: bool) -> None:
        self.partial = partial  # some of it had arrived


class _Refused(Exception):
    """The request is answered without running: ``response``, then the connection closes."""

    def __init__(self, response: Response) -> None:
        self.response = response


class HttpServer:
    """Serves a ``Handler`` on listeners. ``serve_http`` runs it around a host's life."""

    def __init__(
        self,
        front: Handler,
        limits: ServerLimits | None = None,
        inflight: ByteBudget | None = None,
        access_log: bool = False,
    ) -> None:
        self.front = front
        #: Log one line per request answered (method, target, status, milliseconds).
        self.access_log = access_log
        self.host = front.host
        self.limits = limits or ServerLimits()
        self.draining = False
        #: The bytes of request bodies in flight (the host's own budget unless given one).
        self.inflight = self.host.inflight if inflight is None else inflight
        self._conns = Connections(self.limits.min_rate, self.inflight)
        self._refusing = 0
        self._handling = 0
        self._handled_all = trio.Event()
        self._sessions: set[Session | Relay] = set()  # the WebSockets open
        #: In a cluster: the front URL of another host, by its internal address (relay.py).
        self.front_of: FrontOf | None = None
        self._accept_log = BurstLog(
            "accept failed: out of file descriptors or memory; closing waiting connections",
            trio.current_time,
        )
        self.refused = 0  # connections refused at the cap
        self._cap_log = BurstLog(
            "refusing connections: the connection cap is reached", trio.current_time
        )
        self.inflight.reclaim = self._conns.reclaim

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
                    error = errno.errorcode.get(exc.errno or 0, str(exc.errno))
                    self._accept_log.note(error=error, connections=len(self._conns))
                    # Closing a waiting connection frees a descriptor once its task has run.
                    await trio.sleep(0 if self._conns.shed_one() else 0.05)
                    continue
                conns = self._conns
                if len(conns) >= self.limits.max_connections and not conns.shed_one():
                    self._refuse(stream, nursery)
                    continue
                conn = conns.add(stream.socket.fileno())
                nursery.start_soon(self._serve_connection, conn, stream)

    def _refuse(self, stream: trio.SocketStream, nursery: trio.Nursery) -> None:
        self.refused += 1
        self._cap_log.note(max_connections=self.limits.max_connections)
        if self._refusing >= MAX_REFUSING:
            nursery.start_soon(trio.aclose_forcefully, stream)
            return
        self._refusing += 1
        nursery.start_soon(self._write_refusal, stream)

    async def _write_refusal(self, stream: trio.SocketStream) -> None:
        try:
            with trio.move_on_after(LAST_WORDS), contextlib.suppress(*_GONE):
                await stream.send_all(REFUSAL)
        finally:
            self._refusing -= 1
            await trio.aclose_forcefully(stream)

    # -- shutdown ---------------------------------------------------------------------------
    def drain(self) -> None:
        """Stop taking requests: waiting connections close now, the rest after their reply."""
        self.draining = True
        self._conns.close_waiting()
        for session in self._sessions:
            session.going_away()
        if self._handling == 0:
            self._handled_all.set()

    async def wait_handled(self) -> None:
        """Wait until no request is being handled (after ``drain``)."""
        if self._handling:
            await self._handled_all.wait()

    # -- one connection ---------------------------------------------------------------------
    async def _serve_connection(self, conn: Connection, stream: trio.SocketStream) -> None:
        reader = RequestReader(self.limits.max_header_bytes)
        try:
            with conn.scope:
                await self._requests(conn, reader, stream)
        except _GONE:
            pass  # the client went away
        except Exception as exc:  # a bug: this connection ends, nothing else does
            error_id = self.host.error_id()
            log.error("connection failed", error_id=error_id, exc_info=exc)
            with trio.move_on_after(LAST_WORDS) as scope:
                scope.shield = True
                await self._answer(conn, reader, stream, internal_error(error_id))
        finally:
            self._conns.remove(conn)
            await trio.aclose_forcefully(stream)

    async def _requests(self, conn: Connection, reader: RequestReader, stream: Any) -> None:
        limits = self.limits
        served = 0
        deadline = trio.current_time() + limits.header_timeout
        event: Any = None  # the next request, when it was already buffered (pipelined)
        while True:
            try:
                if event is None:
                    event = await self._next_event(reader, stream, deadline, conn)
            except _Timeout as exc:
                if exc.partial:
                    await self._answer(conn, reader, stream, timeout_reply("request head too slow"))
                return
            except ProtocolError as exc:
                await self._answer(conn, reader, stream, protocol_error(exc))
                return
            if event is CLOSED:
                return
            assert isinstance(event, RequestHead), event
            request, event = event, None
            if request.websocket and reader.upgraded is not None:
                return await self._websocket(conn, reader, stream, request)
            started = trio.current_time() if self.access_log else 0.0
            self._conns.move(conn, "body")
            served += 1
            self._handling += 1
            try:
                resp = await self._handle(conn, reader, stream, request)
            except _Refused as refused:
                await self._answer(conn, reader, stream, refused.response, request.method)
                if self.access_log:
                    log_access(request, refused.response.status, started)
                return
            finally:
                self._handling -= 1
                if self.draining and self._handling == 0:
                    self._handled_all.set()
            close = self.draining or served >= limits.keep_alive_requests or not request.keep_alive
            await self._send_response(conn, stream, request.method, resp, close)
            if self.access_log:
                log_access(request, resp.status, started)
            if close or self.draining:
                return
            self._conns.move(conn, "idle")
            try:
                event = reader.next_event()
            except ProtocolError as exc:
                await self._answer(conn, reader, stream, protocol_error(exc))
                return
            if event is NEED_DATA:
                event = None
                # Idle: the next request's first byte within the keep-alive time, or the
                # connection's scope ends it (a deadline costs less than a scope per request).
                conn.scope.deadline = trio.current_time() + limits.keep_alive_timeout
                try:
                    # The client has just read our reply: its next request is not here yet,
                    # and a read now would only fail. Wait for it, then read once.
                    await trio.lowlevel.wait_readable(stream.socket)
                    data = await stream.receive_some(RECEIVE_SIZE)
                finally:
                    conn.scope.deadline = math.inf
                reader.feed(data)
                self._conns.move(conn, "head")
            deadline = trio.current_time() + limits.header_timeout

    async def _websocket(
        self, conn: Connection, reader: RequestReader, stream: Any, request: RequestHead
    ) -> None:
        """An upgrade to WebSocket: the actor's accept event, then the socket until it ends
        (the connection ends with it). Counted as a request being handled while it lasts."""
        front = self.front
        if not isinstance(front, Front):
            no_sockets = error_response(404, "NotFound", "no WebSockets on this listener")
            return await self._answer(conn, reader, stream, no_sockets)
        accepted = HOST_CLOSED if self.draining else handshake(request)
        if isinstance(accepted, Response):
            return await self._answer(conn, reader, stream, accepted)
        rest = reader.upgraded
        assert rest is not None
        session = Session(stream, self.host.sockets.limits, rest)
        relay: Relay | None = None
        self._conns.move(conn, "busy")
        self._handling += 1
        try:
            path, _, query = request.target.partition("?")
            try:
                resp, ws = await front.upgrade(path, query, request.headers, session)
            except ServedElsewhere as there:  # a cluster's: relayed to the owner (relay.py)
                relayed = await open_relay(self.front_of, there.owner, request, rest)
                if isinstance(relayed, Response):
                    resp, ws = relayed, None
                else:
                    self._sessions.add(relay := relayed)
                    return await relay.run(stream, accepted)
            if ws is None:
                return await self._send_response(conn, stream, "GET", resp, True)
            self._sessions.add(session)
            await session.run(self.host.sockets, ws, accepted)
        finally:
            self._sessions.discard(session)
            if relay is not None:
                self._sessions.discard(relay)
            self._handling -= 1
            if self.draining and self._handling == 0:
                self._handled_all.set()

    async def _handle(
        self, conn: Connection, reader: RequestReader, stream: Any, request: RequestHead
    ) -> Response:
        """Read the body and ask the front. ``_Refused`` if the request must not run.

        Until the body is whole the connection still waits for its client, and may be closed
        to make room (``Connections.shed_one``); from then on it waits for the host, and is kept."""
        host = self.host
        if self.draining:
            raise _Refused(HOST_CLOSED)
        # The reader bounds a head that arrives in pieces; a whole one is measured here.
        if request.size > self.limits.max_header_bytes:
            raise _Refused(error_response(431, "HeadersTooLarge", "request head too large"))
        length = request.content_length
        if length is not None and length > host.max_body:
            raise _Refused(too_large(host))
        try:
            body = await self._read_body(conn, reader, stream, length)
        except _Timeout:
            raise _Refused(timeout_reply("request body too slow")) from None
        except ProtocolError as exc:
            raise _Refused(protocol_error(exc)) from None
        finally:
            self.inflight.give(conn.held)  # the front takes the whole body's share itself
            conn.held = 0
        self._conns.move(conn, "busy")
        path, _, query = request.target.partition("?")
        return await self.front.handle(request.method, path, query, request.headers, body)

    async def _read_body(
        self, conn: Connection, reader: RequestReader, stream: Any, length: int | None
    ) -> bytes:
        """The request body, in time, taking its share of the in-flight budget as it arrives
        (``conn.held``): a declared length costs nothing until the bytes come.

        In time: by ``transfer_grace`` seconds, and then in every ``RATE_WINDOW`` seconds, at
        least ``min_rate`` bytes a second (or all that is left of a declared length) must
        arrive, so a body cannot bank a fast start and then trickle.
        """
        limits = self.limits
        host = self.host
        if reader.waiting_for_continue:
            reader.waiting_for_continue = False
            await self._send_all(conn, stream, CONTINUE)
        chunks: list[bytes] = []
        conn.window_start = trio.current_time()
        conn.window_base = 0
        window_end = conn.window_start + limits.transfer_grace
        need = limits.min_rate * limits.transfer_grace  # in the first window
        while True:
            try:
                event = await self._next_event(reader, stream, window_end)
            except _Timeout:
                left = need if length is None else min(need, length - conn.held)
                if conn.held - conn.window_base < left:
                    raise
                conn.window_start, conn.window_base = window_end, conn.held
                window_end += RATE_WINDOW
                need = limits.min_rate * RATE_WINDOW
                continue
            if type(event) is bytes:
                size = conn.held + len(event)
                if size > host.max_body:
                    raise _Refused(too_large(host))
                if not self.inflight.take(len(event)):
                    raise _Refused(NO_MEMORY)
                conn.held = size
                chunks.append(event)
            elif event is END:
                return b"".join(chunks)
            else:  # the reader raises before it could say anything else mid-body
                raise AssertionError(f"unexpected {event!r} in a body")

    async def _next_event(
        self, reader: RequestReader, stream: Any, deadline: float, conn: Connection | None = None
    ) -> Any:
        """The reader's next event, receiving until ``deadline`` (``_Timeout``). With ``conn``,
        the first bytes of a request move it to "head"."""
        partial = False
        while True:
            event = reader.next_event()
            if event is not NEED_DATA:
                return event
            with trio.move_on_at(deadline):
                data = await stream.receive_some(RECEIVE_SIZE)
                if data and not partial:
                    partial = True
                    if conn is not None and conn.stage in ("fresh", "idle"):
                        self._conns.move(conn, "head")
                reader.feed(data)
                continue
            raise _Timeout(partial)

    # -- writing ----------------------------------------------------------------------------
    async def _send_response(
        self, conn: Connection, stream: Any, method: str, resp: Response, close: bool
    ) -> None:
        """Write ``resp`` (``_send_all``)."""
        try:
            head_only = method == "HEAD"
            data = encode_response(
                resp.status, resp.headers.items(), resp.body, head_only=head_only, close=close
            )
        except ValueError as exc:  # a status or header HTTP cannot carry
            error_id = self.host.error_id()
            log.error("invalid response", error_id=error_id, status=resp.status, error=str(exc))
            return await self._send_response(conn, stream, method, internal_error(error_id), close)
        conn.replying = True
        await self._send_all(conn, stream, data)
        conn.replying = False

    async def _send_all(self, conn: Connection, stream: Any, data: bytes) -> None:
        """Write ``data``: a client that does not take it in time (``transfer_grace`` and
        ``min_rate``) ends the connection, through the deadline of its scope."""
        limits = self.limits
        conn.scope.deadline = (
            trio.current_time() + limits.transfer_grace + len(data) / limits.min_rate
        )
        try:
            await stream.send_all(data)
        finally:
            conn.scope.deadline = math.inf

    async def _answer(
        self,
        conn: Connection,
        reader: RequestReader,
        stream: Any,
        resp: Response,
        method: str = "GET",
    ) -> None:
        """Answer ``resp`` and close, if a reply can still be written on this connection.

        A client still sending its body would get a reset instead of the answer if the socket
        closed with its bytes unread: so read and drop them for a moment first (a lingering
        close)."""
        if conn.replying:  # a reply was cut off: nothing can follow it
            return
        mid_body = reader.in_body
        with trio.move_on_after(LAST_WORDS), contextlib.suppress(*_GONE):
            await self._send_response(conn, stream, method, resp, True)
            if mid_body:
                await stream.send_eof()
                while await stream.receive_some(RECEIVE_SIZE):
                    pass


async def serve_http(
    host: Host,
    listeners: list[trio.SocketListener],
    limits: ServerLimits | None = None,
    *,
    until: Callable[[], Awaitable[object]],
    also: Sequence[tuple[HttpServer, list[trio.SocketListener]]] = (),
    access_log: bool = False,
    task_status: trio.TaskStatus[HttpServer] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Open ``host``, serve it on ``listeners`` until ``until()`` returns, then shut down;
    ``also``: other servers of the same host, each on its own listeners, that live and stop
    with it (the admin API). ``access_log``: a log line for each request answered.

    Shutdown: stop accepting, close idle connections, give running requests
    ``graceful_timeout`` seconds, then close the host, which answers what is still queued or
    running with 503 ``HostClosed``; those replies are written (with ``connection: close``)
    before the connections close.
    """
    server = HttpServer(Front(host), limits, access_log=access_log)
    servers = [(server, listeners), *also]
    async with trio.open_nursery() as connections:
        async with host.open():
            async with trio.open_nursery() as acceptors:
                for each, its_listeners in servers:
                    for listener in its_listeners:
                        acceptors.start_soon(each.accept_loop, listener, connections)
                task_status.started(server)
                await until()
                for each, _ in servers:
                    each.drain()
                acceptors.cancel_scope.cancel()
            with trio.move_on_after(server.limits.graceful_timeout):
                for each, _ in servers:
                    await each.wait_handled()
        # The host is closed: what was still waiting has its 503 now; let it be written.
        for each, _ in servers:
            each.drain()
        connections.cancel_scope.deadline = trio.current_time() + LAST_WORDS
