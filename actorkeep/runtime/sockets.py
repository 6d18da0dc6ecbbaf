"""The host's WebSockets: every open socket of every actor, whether its actor is in memory or
not (hibernation), and the events they bring (docs/websockets.md, decision 0022).

A socket's transport (``SocketLink``: the HTTP server's WebSocket session, or ``ak.testing``'s
in-process one) lives outside the runtime. Here are the sockets' records (``ak.WebSocket``),
the limits, and the way a message, or a close the actor did not ask for, becomes an event of
the actor: FIFO with its other events, one at a time, waking the actor if it was evicted.
What an actor sends leaves through its output gate, like a reply.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
import trio

from ..app import ActorClass
from ..errors import HostClosed, Overloaded, Quarantined
from ..http import Response
from ..ws import WebSocket
from .activation import Activation
from .handoff import Event

log = structlog.get_logger("actorkeep")

#: Close codes the host sends (RFC 6455 §7.4.1).
GOING_AWAY = 1001  # the host stops
POLICY = 1008  # a slow reader
TOO_BIG = 1009
INTERNAL = 1011  # the actor's storage failed, or it is quarantined
RESTART = 1012  # the actor is served elsewhere now (a cluster's failover)
TRY_LATER = 1013
#: What the actor's ``websocket_close`` gets for a connection lost without a close frame.
ABNORMAL = 1006

#: The reply of an accept event that accepted (the front writes the handshake's own).
ACCEPTED = Response(101)
#: How often the host looks for sockets of actors it no longer serves (a cluster's failover).
WATCH_EVERY = 1.0
MESSAGE_HANDLER = "websocket_message"
CLOSE_HANDLER = "websocket_close"


class ServedElsewhere(Exception):
    """An upgrade for an actor that another host of the cluster serves (``owner``: its
    internal address): the front relays the socket there."""

    def __init__(self, owner: str) -> None:
        super().__init__(f"served by {owner}")
        self.owner = owner


class SocketLink(Protocol):
    """The transport of one accepted socket. Neither method waits."""

    def send(self, message: str | bytes) -> None:
        """Queue a message. A link whose queue passes its bound closes itself (1008) and
        tells the hub (``Sockets.ended``)."""

    def close(self, code: int, reason: str) -> None:
        """Queue a close frame; the link ends once the client answers it (or soon after)."""


@dataclass(frozen=True, slots=True)
class SocketLimits:
    """What a host allows its sockets; validated on creation."""

    #: Open sockets on the host, at most (an upgrade beyond gets 503).
    max_sockets: int = 50_000
    #: Open sockets of one actor, at most (503 beyond).
    max_per_actor: int = 10_000
    #: Bytes of one message from a client, at most (the socket closes with 1009 beyond);
    #: also the largest message an actor may send.
    max_message: int = 1 << 20
    #: Bytes queued for one client, at most: a client that reads slower than its actor
    #: sends is cut off (1008), and the actor goes on.
    send_buffer: int = 4 << 20

    def __post_init__(self) -> None:
        for name in ("max_sockets", "max_per_actor", "max_message", "send_buffer"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")
        if self.send_buffer < self.max_message:
            raise ValueError("send_buffer must be at least max_message")


class EventRunner(Protocol):
    """What the hub asks of the dispatcher."""

    closing: bool

    def activation(self, address: str, actor_class: ActorClass, name: str) -> Activation: ...

    def enqueue(self, act: Activation, ev: Event, limit: bool) -> None: ...

    def activation_of(self, address: str) -> Activation | None: ...

    def wait_done(self, ev: Event) -> Awaitable[Any]: ...

    def spawn(self, fn: Callable[[], Awaitable[None]]) -> None: ...


class Upgrade:
    """A WebSocket upgrade whose accept event runs: ``req.accept_websocket()`` lands here."""

    __slots__ = ("_hub", "actor_class", "address", "link", "name", "socket")

    def __init__(
        self, hub: Sockets, actor_class: ActorClass, address: str, name: str, link: SocketLink
    ) -> None:
        self._hub = hub
        self.actor_class = actor_class
        self.address = address
        self.name = name
        self.link = link
        #: The accepted socket, once accepted.
        self.socket: WebSocket | None = None

    def accept(self, tags: tuple[str, ...], attachment: bytes) -> WebSocket:
        if self.socket is not None:
            raise RuntimeError("this upgrade is accepted already")
        self.socket = self._hub.add(self, tags, attachment)
        return self.socket

    def accepted(self, result: object, handler: Callable[..., Any]) -> Response:
        if result is not None and result is self.socket:
            return ACCEPTED
        raise TypeError(
            f"WebSocket route {handler.__qualname__} returned {type(result).__name__}: return "
            "the socket req.accept_websocket() gave, or an ak.Response to refuse"
        )

    def abandon(self) -> None:
        """The accept event refused the socket (or failed): forget it, with no event."""
        if self.socket is not None:
            self._hub.forget(self.socket)


class Sockets:
    """The open sockets of one host, by actor."""

    def __init__(self, classes: dict[str, ActorClass], limits: SocketLimits | None = None) -> None:
        self.classes = classes
        self.limits = limits or SocketLimits()
        self.runner: EventRunner | None = None  # the dispatcher, once it exists
        #: Whether this host serves an address now (the router's ``serves``): a socket of
        #: an actor served elsewhere now closes with 1012 instead of sending or running.
        self.serves: Callable[[str], bool] = lambda address: True
        self._watching = False  # ``watch`` runs (while sockets are open)
        self._by_address: dict[str, dict[int, WebSocket]] = {}
        self._links: dict[int, SocketLink] = {}
        self._classes_of: dict[int, tuple[ActorClass, str]] = {}
        self._ids = itertools.count(1)
        #: Messages answered by a class's ``websocket_auto_reply`` without waking the actor.
        self.auto_replies = 0
        #: Sockets closed because their client read too slowly.
        self.slow_closed = 0

    def __len__(self) -> int:
        return len(self._links)

    def __iter__(self) -> Iterator[WebSocket]:
        for sockets in list(self._by_address.values()):
            yield from list(sockets.values())

    def count_of(self, address: str) -> int:
        """How many sockets ``address`` has open."""
        sockets = self._by_address.get(address)
        return len(sockets) if sockets else 0

    def of(self, address: str, tag: str | None = None) -> list[WebSocket]:
        """The open sockets of ``address`` in the order they were accepted; with ``tag``, only
        those tagged with it."""
        sockets = self._by_address.get(address)
        if not sockets:
            return []
        if tag is None:
            return list(sockets.values())
        return [ws for ws in sockets.values() if tag in ws.tags]

    def check_room(self, address: str) -> None:
        """``Overloaded`` if the host or ``address`` has all the sockets it may have."""
        limits = self.limits
        if len(self._links) >= limits.max_sockets:
            raise Overloaded(f"this host holds {limits.max_sockets} WebSockets, its limit")
        if self.count_of(address) >= limits.max_per_actor:
            raise Overloaded(f"{address} holds {limits.max_per_actor} WebSockets, its limit")

    def upgrade(
        self, actor_class: ActorClass, address: str, name: str, link: SocketLink
    ) -> Upgrade:
        """A pending upgrade to ``address`` over ``link`` (``Overloaded`` if no room)."""
        self.check_room(address)
        return Upgrade(self, actor_class, address, name, link)

    def add(self, upgrade: Upgrade, tags: tuple[str, ...], attachment: bytes) -> WebSocket:
        self.check_room(upgrade.address)
        ws = WebSocket(self, upgrade.address, next(self._ids), tags, attachment)
        self._by_address.setdefault(upgrade.address, {})[ws.id] = ws
        self._links[ws.id] = upgrade.link
        self._classes_of[ws.id] = (upgrade.actor_class, upgrade.name)
        if not self._watching and self.runner is not None:
            self._watching = True
            self.runner.spawn(self.watch)
        return ws

    def forget(self, ws: WebSocket) -> SocketLink | None:
        """Take ``ws`` out (it is closed from now on); its link, if it was still here."""
        ws.closed = True
        self._classes_of.pop(ws.id, None)
        sockets = self._by_address.get(ws.address)
        if sockets is not None:
            sockets.pop(ws.id, None)
            if not sockets:
                del self._by_address[ws.address]
        return self._links.pop(ws.id, None)

    # -- what the actor does (ak.WebSocket) ---------------------------------------------------
    def send(self, ws: WebSocket, message: str | bytes) -> None:
        link = self._links.get(ws.id)
        if link is None:
            return
        size = (
            len(message)
            if type(message) is bytes or message.isascii()
            else len(
                message.encode()  # type: ignore[union-attr]
            )
        )
        if size > self.limits.max_message:
            raise ValueError(f"a message holds at most {self.limits.max_message} bytes")
        self._gated(ws.address, functools.partial(link.send, message))

    def close(self, ws: WebSocket, code: int, reason: str) -> None:
        link = self.forget(ws)
        if link is not None:
            self._gated(ws.address, functools.partial(link.close, code, reason))

    def _gated(self, address: str, output: Callable[[], None]) -> None:
        if not self.serves(address):  # its lease ran out: nothing leaves from here
            self.close_actor(address, RESTART, "the actor moved to another host")
            return
        runner = self.runner
        act = runner.activation_of(address) if runner is not None else None
        gate = act.gate if act is not None else None
        if gate is not None and gate.closed:
            gate.defer(output)  # dropped if the sync fails: the sockets then close (1011)
        else:
            output()

    def close_actor(self, address: str, code: int, reason: str) -> None:
        """Close every socket of ``address`` now, with no event (its storage failed, it is
        quarantined, or another host serves it now)."""
        for ws in self.of(address):
            link = self.forget(ws)
            if link is not None:
                link.close(code, reason)

    def close_all(self, code: int, reason: str) -> None:
        """Close every socket, with no event (the host stops)."""
        for address in list(self._by_address):
            self.close_actor(address, code, reason)

    async def watch(self) -> None:
        """While sockets are open, every ``WATCH_EVERY`` seconds: close (1012) those of
        actors this host no longer serves, so that their clients reconnect to the owner."""
        try:
            while self._links:
                await trio.sleep(WATCH_EVERY)
                for address in list(self._by_address):
                    if not self.serves(address):
                        self.close_actor(address, RESTART, "the actor moved to another host")
        finally:
            self._watching = False

    # -- what the client does (the link) ------------------------------------------------------
    async def receive(self, ws: WebSocket, message: str | bytes) -> None:
        """A whole message from the client: answered at once if it is the class's
        ``websocket_auto_reply`` request, else an event ``websocket_message(ws, message)``
        of the actor; returns once the handler has run. A socket that cannot take events
        closes (``Quarantined``: 1011; ``HostClosed``: 1001; ``Overloaded``: 1013)."""
        found = self._classes_of.get(ws.id)
        if found is None:
            return  # closed meanwhile
        actor_class, name = found
        auto = actor_class.cls.websocket_auto_reply
        if auto is not None and message == auto[0]:
            link = self._links.get(ws.id)
            if link is not None:
                self.auto_replies += 1
                link.send(auto[1])
            return
        handler = getattr(actor_class.cls, MESSAGE_HANDLER)
        await self._run(ws, actor_class, name, Event.websocket(handler, (ws, message)))

    async def ended(self, ws: WebSocket, code: int, reason: str) -> None:
        """The socket ended without the actor closing it (the client closed it, the
        connection was lost, or the host cut it off): the socket is forgotten, and the
        actor's ``websocket_close(ws, code, reason)`` runs as an event, if it has one."""
        found = self._classes_of.get(ws.id)
        self.forget(ws)
        if code == POLICY:
            self.slow_closed += 1
        runner = self.runner
        if found is None or runner is None or runner.closing:
            return
        actor_class, name = found
        handler = getattr(actor_class.cls, CLOSE_HANDLER, None)
        if handler is not None:
            await self._run(ws, actor_class, name, Event.websocket(handler, (ws, code, reason)))

    async def _run(self, ws: WebSocket, actor_class: ActorClass, name: str, ev: Event) -> None:
        runner = self.runner
        assert runner is not None
        if not self.serves(ws.address):
            self.close_actor(ws.address, RESTART, "the actor moved to another host")
            return
        try:
            act = runner.activation(ws.address, actor_class, name)
            runner.enqueue(act, ev, limit=False)  # at most one event in flight per socket
            await runner.wait_done(ev)
        except Quarantined as exc:
            self.close_actor(ws.address, INTERNAL, "the actor is quarantined")
            log.warning("socket closed: its actor is quarantined", address=ws.address, error=exc)
        except HostClosed:
            self.close_actor(ws.address, GOING_AWAY, "the host is shutting down")
        except Overloaded as exc:
            self._close_one(ws, TRY_LATER, exc.message[:100])

    def _close_one(self, ws: WebSocket, code: int, reason: str) -> None:
        link = self.forget(ws)
        if link is not None:
            link.close(code, reason)
