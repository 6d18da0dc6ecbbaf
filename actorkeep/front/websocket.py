"""WebSockets on the HTTP server: the opening handshake, then frames with wsproto.

``handshake`` checks an upgrade request (RFC 6455 §4.2.1) and gives the ``101`` to write if
the actor accepts. A ``Session`` is one accepted socket on its connection and the host's
``SocketLink`` for it: what the actor sends is framed at once into a bounded queue that a
writer task empties, and the reader hands each whole message to the host, one at a time (the
next is read once the actor's event for this one has run: a client cannot flood the host).
No extension (permessage-deflate) or subprotocol is negotiated. See docs/websockets.md and
docs/decisions/0022-websockets.md.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
from collections import deque

import structlog
import trio
from wsproto.connection import Connection, ConnectionState, ConnectionType
from wsproto.events import BytesMessage, CloseConnection, Ping, TextMessage
from wsproto.utilities import LocalProtocolError, generate_accept_token

from ..http import Response, error_response
from ..runtime.sockets import ABNORMAL, GOING_AWAY, POLICY, TOO_BIG, SocketLimits, Sockets
from ..ws import WebSocket
from .http11 import RequestHead

log = structlog.get_logger("actorkeep")

#: Seconds the client gets to answer our close frame before the connection is cut.
CLOSE_WAIT = 1.0
RECEIVE_SIZE = 65536
_GONE = (trio.BrokenResourceError, trio.ClosedResourceError)


def _tokens(value: str) -> set[str]:
    return {token.strip().lower() for token in value.split(",")}


def handshake(request: RequestHead) -> bytes | Response:
    """The ``101`` head that accepts the upgrade ``request``, or the reply that refuses it."""
    headers: dict[str, str] = {}
    for name, value in request.headers:
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    if request.method != "GET" or request.version != "1.1":
        return error_response(400, "BadRequest", "a WebSocket upgrade is an HTTP/1.1 GET")
    if request.content_length != 0:
        return error_response(400, "BadRequest", "a WebSocket upgrade has no body")
    if "websocket" not in _tokens(headers.get("upgrade", "")) or "upgrade" not in _tokens(
        headers.get("connection", "")
    ):
        return error_response(400, "BadRequest", "want upgrade: websocket, connection: upgrade")
    if headers.get("sec-websocket-version") != "13":
        return error_response(
            426,
            "UpgradeRequired",
            "WebSocket version 13 only",
            {"sec-websocket-version": "13", "upgrade": "websocket"},
        )
    key = headers.get("sec-websocket-key", "")
    try:
        valid = len(base64.b64decode(key, validate=True)) == 16
    except (binascii.Error, ValueError):
        valid = False
    if not valid:
        return error_response(400, "BadRequest", "sec-websocket-key must be 16 bytes in base64")
    accept = generate_accept_token(key.encode("ascii")).decode("ascii")
    return (
        b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\n"
        b"sec-websocket-accept: %s\r\n\r\n" % accept.encode("ascii")
    )


class Session:
    """One accepted WebSocket on its connection (``SocketLink`` of ``runtime/sockets.py``).

    ``run`` writes the handshake's ``101``, then what the actor sent meanwhile, and reads
    until the socket ends; ``going_away`` ends it with 1001 once the event in flight (if any)
    has run.
    """

    __slots__ = (
        "_closing",
        "_conn",
        "_drained",
        "_end",
        "_going",
        "_limits",
        "_nursery",
        "_out",
        "_queued",
        "_read_scope",
        "_rest",
        "_stream",
        "_writing",
    )

    def __init__(self, stream: trio.abc.Stream, limits: SocketLimits, rest: bytes) -> None:
        self._stream = stream
        self._limits = limits
        self._rest = rest  # bytes the client sent after its upgrade request
        self._conn = Connection(ConnectionType.SERVER)
        self._out: deque[bytes] = deque()
        self._queued = 0
        self._writing = False
        self._drained: trio.Event | None = None  # set when the writer ends, if waited for
        self._nursery: trio.Nursery | None = None
        self._read_scope: trio.CancelScope | None = None
        #: We sent (or queued) a close frame: what the client sends now is dropped.
        self._closing = False
        self._going = False
        #: How the socket ended, for the actor's ``websocket_close`` (None: no event).
        self._end: tuple[int, str] | None = None

    # -- the host's side (SocketLink) ----------------------------------------------------
    def send(self, message: str | bytes) -> None:
        if self._closing:
            return
        frame = self._conn.send(
            TextMessage(message) if isinstance(message, str) else BytesMessage(message)
        )
        if self._queued + len(frame) > self._limits.send_buffer:
            self._out.clear()
            self._queued = 0
            self._stop(POLICY, "send buffer full: the client reads too slowly", tell=True)
            return
        self._queue(frame)

    def close(self, code: int, reason: str) -> None:
        self._stop(code, reason, tell=False)

    # -- ours -------------------------------------------------------------------------------
    def going_away(self) -> None:
        """The host stops: close with 1001 once the event in flight has run."""
        self._going = True
        if self._read_scope is not None:
            self._read_scope.cancel()

    def _stop(self, code: int, reason: str, tell: bool) -> None:
        """Queue our close frame; with ``tell``, the actor hears of it (``websocket_close``)."""
        if self._closing:
            return
        self._closing = True
        if tell:
            self._end = (code, reason)
        with contextlib.suppress(LocalProtocolError):  # the client's close came first
            self._queue(self._conn.send(CloseConnection(code, reason)))
        scope = self._read_scope
        if scope is not None:  # give the client a moment to answer, then cut
            scope.deadline = min(scope.deadline, trio.current_time() + CLOSE_WAIT)

    def _queue(self, data: bytes) -> None:
        self._out.append(data)
        self._queued += len(data)
        if not self._writing and self._nursery is not None:
            self._writing = True
            self._nursery.start_soon(self._write)

    async def _write(self) -> None:
        try:
            while self._out:
                data = self._out.popleft() if len(self._out) == 1 else b"".join(self._out)
                self._out.clear()
                self._queued = 0
                await self._stream.send_all(data)
        except _GONE:
            self._lost()
        finally:
            self._writing = False
            if self._drained is not None:
                self._drained.set()

    def _lost(self) -> None:
        """The connection broke under us."""
        if self._end is None and not self._closing:
            self._end = (ABNORMAL, "connection lost")
        self._closing = True
        if self._read_scope is not None:
            self._read_scope.cancel()

    async def run(self, hub: Sockets, ws: WebSocket, accepted: bytes) -> None:
        """Serve the socket until it ends; then the actor hears of it, if it should."""
        self._out.appendleft(accepted)  # before anything the actor sent meanwhile
        self._queued += len(accepted)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._writing = True
                nursery.start_soon(self._write)
                await self._read(hub, ws)
                # What we queued last (a close frame) gets its moment to leave.
                if self._writing:
                    self._drained = trio.Event()
                    with trio.move_on_after(CLOSE_WAIT):
                        await self._drained.wait()
                nursery.cancel_scope.cancel()
        finally:
            end = self._end
            if end is None or self._going:
                hub.forget(ws)
            else:
                with trio.CancelScope(shield=True):
                    await hub.ended(ws, *end)

    async def _read(self, hub: Sockets, ws: WebSocket) -> None:
        conn = self._conn
        max_message = self._limits.max_message
        parts: list[str | bytes] = []
        size = 0
        if self._rest:
            conn.receive_data(self._rest)
            self._rest = b""
        while True:
            for event in conn.events():
                if isinstance(event, TextMessage | BytesMessage):
                    if self._closing or self._going:
                        continue
                    piece = event.data
                    if isinstance(piece, bytearray):
                        piece = bytes(piece)
                    size += (
                        len(piece)
                        if isinstance(piece, bytes) or piece.isascii()
                        else len(piece.encode())
                    )
                    if size > max_message:
                        self._stop(TOO_BIG, f"a message holds at most {max_message} bytes", True)
                        continue
                    parts.append(piece)
                    if not event.message_finished:
                        continue
                    if len(parts) == 1:
                        message = parts[0]
                    elif isinstance(piece, str):
                        message = "".join(parts)  # type: ignore[arg-type]
                    else:
                        message = b"".join(parts)  # type: ignore[arg-type]
                    parts, size = [], 0
                    await hub.receive(ws, message)
                elif isinstance(event, Ping):
                    if not self._closing:
                        self._queue(conn.send(event.response()))
                elif isinstance(event, CloseConnection):
                    self._closed_by_client(event)
                    return
            if self._going and not self._closing:
                self._stop(GOING_AWAY, "the host is shutting down", tell=False)
            with trio.CancelScope() as scope:
                if self._closing:
                    scope.deadline = trio.current_time() + CLOSE_WAIT
                self._read_scope = scope
                try:
                    data = bytes(await self._stream.receive_some(RECEIVE_SIZE))
                except _GONE:
                    data = b""
                finally:
                    self._read_scope = None
            if scope.cancelled_caught:
                if self._closing:
                    return  # our close was not answered in time, or the connection broke
                continue  # going away: the loop closes
            if not data and self._closing:
                return
            conn.receive_data(data or None)

    def _closed_by_client(self, event: CloseConnection) -> None:
        """The client's close frame, or what wsproto makes of bytes that break the protocol
        or of a connection lost: answer it, and end."""
        conn = self._conn
        if self._closing:
            return  # the answer to ours
        self._closing = True
        code, reason = event.code, event.reason or ""
        self._end = (int(code), reason)
        if conn.state is ConnectionState.REMOTE_CLOSING:
            self._queue(conn.send(event.response()))
        elif conn.state is ConnectionState.OPEN:  # a protocol error: wsproto names the code
            self._queue(conn.send(CloseConnection(code, reason)))
