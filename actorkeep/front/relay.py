"""A WebSocket relayed to the cluster host that serves its actor (docs/websockets.md).

In a cluster, the host that takes an upgrade holds the client's socket; if another host owns
the actor, this one opens a WebSocket of its own to the owner's front with the client's
request (its path, query and headers, less those of the hop), and passes messages both ways,
frame by frame, so each side's backpressure reaches the other. The owner treats it as any
outside client: its access rules, limits and hibernation apply there.

When the owner goes (it dies, stops, or the actor moves), the client's socket closes with
1012 (service restart): the client reconnects, and its upgrade reaches the new owner. A ping
goes to the owner every ``PING_EVERY`` seconds; an owner silent for twice that is gone.
"""

from __future__ import annotations

import contextlib
import urllib.parse
from collections.abc import Awaitable, Callable

import structlog
import trio
from wsproto import ConnectionType, WSConnection
from wsproto.connection import Connection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Ping,
    Pong,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

from ..http import RESERVED_HEADER_PREFIX, Headers, Response, error_response
from ..runtime.sockets import GOING_AWAY, RESTART
from .http11 import RequestHead

log = structlog.get_logger("actorkeep")

PING_EVERY = 5.0
#: Seconds for the owner to answer the upgrade, and for either side to answer a close.
HANDSHAKE_TIMEOUT = 10.0
CLOSE_WAIT = 1.0
RECEIVE_SIZE = 65536
#: Headers of the client's hop, not passed to the owner.
_HOP = frozenset(
    {
        "host",
        "connection",
        "upgrade",
        "keep-alive",
        "te",
        "trailer",
        "transfer-encoding",
        "content-length",
        "proxy-authorization",
        "sec-websocket-key",
        "sec-websocket-version",
        "sec-websocket-extensions",
        "sec-websocket-protocol",
    }
)
#: Close codes that never travel in a close frame (RFC 6455 §7.4.1).
_UNSENDABLE = frozenset({1005, 1006, 1015})
_GONE = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)

#: The front URL (``ws://host:port``) of the host at an internal address, if it gave one.
FrontOf = Callable[[str], Awaitable[str | None]]


def _unavailable(message: str) -> Response:
    return error_response(503, "Unavailable", message, {"retry-after": "1"})


async def open_relay(
    front_of: FrontOf | None, owner: str, request: RequestHead, rest: bytes
) -> Relay | Response:
    """A relay to ``owner`` (an internal address) for the upgrade ``request``, once the
    owner accepted it; else the reply to give the client (the owner's refusal, or 503)."""
    url = await front_of(owner) if front_of is not None else None
    if url is None:
        return _unavailable("the host that serves this actor takes no relayed WebSockets now")
    parts = urllib.parse.urlsplit(url)
    if parts.hostname is None or parts.port is None:
        return _unavailable("the host that serves this actor gave no usable address")
    upstream: trio.SocketStream | None = None
    try:
        with trio.fail_after(HANDSHAKE_TIMEOUT):
            upstream = await trio.open_tcp_stream(parts.hostname, parts.port)
            conn = WSConnection(ConnectionType.CLIENT)
            extra = [
                (name.encode("latin-1"), value.encode("latin-1"))
                for name, value in request.headers
                if name not in _HOP and not name.startswith(RESERVED_HEADER_PREFIX)
            ]
            await upstream.send_all(
                conn.send(Request(host=parts.netloc, target=request.target, extra_headers=extra))
            )
            refused = await _handshake(upstream, conn)
    except (*_GONE, trio.TooSlowError, RemoteProtocolError) as exc:
        if upstream is not None:
            await trio.aclose_forcefully(upstream)
        log.warning("relay failed: the owner did not answer the upgrade", owner=owner, error=exc)
        return _unavailable("the host that serves this actor did not answer")
    if refused is not None:
        await trio.aclose_forcefully(upstream)
        return refused
    return Relay(upstream, conn, rest)


async def _handshake(upstream: trio.SocketStream, conn: WSConnection) -> Response | None:
    """None once the owner accepted; its refusal as a reply otherwise."""
    refusal: RejectConnection | None = None
    body: list[bytes] = []
    while True:
        data = await upstream.receive_some(RECEIVE_SIZE)
        conn.receive_data(data or None)
        for event in conn.events():
            if isinstance(event, AcceptConnection):
                return None
            if isinstance(event, RejectConnection):
                refusal = event
                if not event.has_body:
                    return _refused(refusal, b"")
            elif isinstance(event, RejectData):
                body.append(event.data)
                if event.body_finished and refusal is not None:
                    return _refused(refusal, b"".join(body))
        if not data:
            raise trio.BrokenResourceError("the owner closed the connection")


def _refused(event: RejectConnection, body: bytes) -> Response:
    keep = ("content-type", "retry-after", "sec-websocket-version", "upgrade")
    headers = {
        name.decode("latin-1").lower(): value.decode("latin-1") for name, value in event.headers
    }
    return Response(event.status_code, Headers({k: headers[k] for k in keep if k in headers}), body)


class Relay:
    """The client's socket (``down``) and ours to the owner (``up``), passing messages."""

    def __init__(self, upstream: trio.SocketStream, up: WSConnection, rest: bytes) -> None:
        self._upstream = upstream
        self._up = up
        self._down = Connection(ConnectionType.SERVER)
        self._rest = rest
        self._pong_seen = trio.current_time()
        self._scope: trio.CancelScope | None = None
        self._nursery: trio.Nursery | None = None
        self._client: trio.abc.Stream | None = None
        self._client_lock = trio.Lock()
        self._owner_lock = trio.Lock()
        self._closing = False

    def going_away(self) -> None:
        """This host stops: both sides get 1001."""
        self._end_soon(GOING_AWAY, "the host is shutting down", to_owner=(GOING_AWAY, ""))

    async def run(self, client: trio.abc.Stream, accepted: bytes) -> None:
        """Write ``accepted`` (the client's 101), then pass messages until either side ends."""
        self._client = client
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._scope = nursery.cancel_scope
                await client.send_all(accepted)
                nursery.start_soon(self._from_client)
                nursery.start_soon(self._from_owner)
                nursery.start_soon(self._ping)
        except _GONE:
            pass
        finally:
            await trio.aclose_forcefully(self._upstream)

    # -- the two directions -------------------------------------------------------------
    async def _from_client(self) -> None:
        down = self._down
        if self._rest:
            down.receive_data(self._rest)
        while True:
            for event in down.events():
                if isinstance(event, TextMessage | BytesMessage):
                    await self._to_owner(_like(event))
                elif isinstance(event, Ping):
                    await self._to_client(event.response())
                elif isinstance(event, CloseConnection):
                    code = 1000 if event.code in _UNSENDABLE else int(event.code)
                    if down.state.name == "REMOTE_CLOSING":
                        await self._to_client(event.response())
                    else:  # a protocol error of the client's: it gets wsproto's code
                        await self._to_client(CloseConnection(event.code, event.reason))
                    await self._close_owner(code, event.reason or "")
                    return
            assert self._client is not None
            try:
                data = bytes(await self._client.receive_some(RECEIVE_SIZE))
            except _GONE:
                data = b""
            if not data:  # the client went without a close frame
                await self._close_owner(1000, "the client went away")
                return
            down.receive_data(data)

    async def _from_owner(self) -> None:
        up = self._up
        while True:
            try:
                data = bytes(await self._upstream.receive_some(RECEIVE_SIZE))
            except _GONE:
                data = b""
            if not data:
                return self._end_soon(RESTART, "the actor's host is gone: reconnect")
            up.receive_data(data)
            for event in up.events():
                if isinstance(event, TextMessage | BytesMessage):
                    await self._to_client(_like(event))
                elif isinstance(event, Ping):
                    await self._to_owner(event.response())
                elif isinstance(event, Pong):
                    self._pong_seen = trio.current_time()
                elif isinstance(event, CloseConnection):
                    # The owner stopping means the actor moves: the client reconnects.
                    code = RESTART if event.code in (GOING_AWAY, *_UNSENDABLE) else event.code
                    with contextlib.suppress(LocalProtocolError, *_GONE):
                        await self._to_owner(event.response())
                    return self._end_soon(int(code), event.reason or "", to_owner=None)

    async def _ping(self) -> None:
        while True:
            await trio.sleep(PING_EVERY)
            if trio.current_time() - self._pong_seen > 2 * PING_EVERY:
                return self._end_soon(RESTART, "the actor's host does not answer: reconnect")
            await self._to_owner(Ping(b"relay"))

    # -- writing and ending -------------------------------------------------------------
    async def _to_client(self, event: Event) -> None:
        assert self._client is not None
        async with self._client_lock:
            with contextlib.suppress(LocalProtocolError):
                data = self._down.send(event)
                await self._client.send_all(data)

    async def _to_owner(self, event: Event) -> None:
        async with self._owner_lock:
            with contextlib.suppress(LocalProtocolError):
                data = self._up.send(event)
                await self._upstream.send_all(data)

    async def _close_owner(self, code: int, reason: str) -> None:
        with contextlib.suppress(*_GONE):
            await self._to_owner(CloseConnection(code, reason))
        self._cancel_after(CLOSE_WAIT)

    def _end_soon(self, code: int, reason: str, to_owner: tuple[int, str] | None = None) -> None:
        """Close the client's socket with ``code`` (and ours with ``to_owner``), then stop."""
        if self._closing or self._nursery is None:
            return
        self._closing = True

        async def close() -> None:
            with contextlib.suppress(*_GONE):
                await self._to_client(CloseConnection(code, reason))
                if to_owner is not None:
                    await self._to_owner(CloseConnection(*to_owner))
            self._cancel_after(CLOSE_WAIT)

        assert self._nursery is not None
        self._nursery.start_soon(close)

    def _cancel_after(self, seconds: float) -> None:
        if self._scope is not None:
            self._scope.deadline = min(self._scope.deadline, trio.current_time() + seconds)


def _like(event: TextMessage | BytesMessage) -> Event:
    """``event`` as one to send on the other connection (a frame of a message, in order)."""
    if isinstance(event, TextMessage):
        return TextMessage(event.data, message_finished=event.message_finished)
    return BytesMessage(bytes(event.data), message_finished=event.message_finished)
