"""Events between the hosts of a cluster (decision 0017): a host sends an event for an actor
it does not own to the owner's internal port, and the owner runs it as if it had come from
there, caller and call chain included (they are trusted because every frame is signed with the
cluster's secret: ``peerwire.py``).

A request is ``[id, "rpc", caller, chain, address, method, args, timeout]`` or ``[id, "http",
class, name, method, path, query, headers, body, caller, chain, timeout]``; its reply is ``[id,
0, result]`` (an rpc's value, or ``[status, headers, body]``) or ``[id, 1, [kind, status,
error, message, retry_after]]``. Many requests share one connection per pair of hosts, each
answered when its event ends.
"""

from __future__ import annotations

import contextlib
import math
import secrets
import socket
from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol

import structlog
import trio

from ..address import split_address
from ..errors import (
    CallTimeout,
    HostClosed,
    OutcomeUnknown,
    Overloaded,
    RemoteError,
    error_for_status,
)
from ..http import Headers, Request, Response
from .peerwire import Channel, FrameTooLarge, Nonce, PeerRefused, accept, dial

log = structlog.get_logger("actorkeep")

#: How much longer than the callee's own timeout the caller waits for the answer.
GRACE: Final = 1.0
#: How long dialing a host may take before it counts as unreachable.
CONNECT_TIMEOUT: Final = 2.0

_OK, _ERROR = 0, 1


class Elsewhere(Overloaded):
    """This host does not own the actor's partition (any more): nothing of the event ran, and
    the caller may send it to the owner."""

    def __init__(self, address: str) -> None:
        super().__init__(f"{address} is not served by this host now", retry_after=1.0)


class Unreachable(Exception):
    """The owner's internal port could not be reached: nothing was sent."""


def outcome_unknown(address: str) -> OutcomeUnknown:
    """The connection to the owner was lost after the event was sent, or the owner stopped
    with it: it may have run."""
    return OutcomeUnknown(f"lost the host serving {address}; the call may have run")


class Local(Protocol):
    """What a host runs for its peers: the events of the actors it owns (``Elsewhere`` for
    the others, before anything of the event runs)."""

    async def deliver_local(
        self,
        class_name: str,
        name: str,
        request: Request,
        chain: tuple[str, ...],
        timeout: float | None,
    ) -> Response: ...

    async def call_rpc_local(
        self,
        caller: str,
        chain: tuple[str, ...],
        address: str,
        method: str,
        args: dict[str, Any],
        timeout: float | None,
    ) -> Any: ...


# -- what goes on the wire ----------------------------------------------------------------------
def _error_of(exc: BaseException) -> list[Any]:
    if isinstance(exc, Elsewhere):
        return ["elsewhere", 503, "Overloaded", exc.message, exc.retry_after]
    if isinstance(exc, RemoteError):
        retry_after = getattr(exc, "retry_after", None)
        return ["remote", exc.status, exc.error, exc.message, retry_after]
    if isinstance(exc, OutcomeUnknown):
        return ["unknown", 503, "OutcomeUnknown", exc.message, exc.retry_after]
    if isinstance(exc, CallTimeout):
        return ["timeout", 504, "CallTimeout", str(exc), None]
    if isinstance(exc, HostClosed):
        return ["closed", 503, "HostClosed", str(exc), None]
    return ["remote", 500, "InternalError", "the owner host failed the call", None]


def _raise_error(error: Any, address: str) -> None:
    if type(error) is not list or len(error) != 5:
        raise PeerRefused("an error reply of the wrong shape")
    kind, status, name, message, retry_after = error
    if type(status) is not int or type(name) is not str or type(message) is not str:
        raise PeerRefused("an error reply of the wrong shape")
    if kind == "elsewhere":
        raise Elsewhere(address)
    if kind == "timeout":
        raise CallTimeout(message)
    if kind == "unknown":
        raise OutcomeUnknown(message)
    if kind == "closed":
        # The owner is stopping: the event may have run (cancelled halfway, or its reply
        # abandoned), so it is not tried again.
        raise outcome_unknown(address)
    exc = error_for_status(status, name, message)
    if isinstance(exc, Overloaded) and isinstance(retry_after, int | float):
        exc.retry_after = float(retry_after)
    raise exc


def _timeout(value: Any) -> float | None:
    if value is None:
        return None
    if type(value) not in (int, float) or not (0 < value < math.inf):
        raise ValueError(f"bad timeout {value!r}")
    return float(value)


def _strings(value: Any, what: str) -> tuple[str, ...]:
    if type(value) is not list or not all(type(x) is str for x in value):
        raise ValueError(f"{what} must be a list of strings")
    return tuple(value)


def _string_map(value: Any, what: str) -> dict[str, str]:
    if type(value) is not dict or not all(
        type(k) is str and type(v) is str for k, v in value.items()
    ):
        raise ValueError(f"{what} must map strings to strings")
    return value


def _text(value: Any, what: str) -> str:
    if type(value) is not str:
        raise ValueError(f"{what} must be a string")
    return value


async def _run_request(local: Local, msg: list[Any]) -> Any:
    """Check a peer's request and run it on ``local``; the reply's result."""
    op = msg[1] if len(msg) > 1 else None
    if op == "rpc" and len(msg) == 8:
        _, _, caller, chain, address, method, args, timeout = msg
        if type(args) is not dict:
            raise ValueError("args must be a map")
        split_address(_text(address, "address"))
        return await local.call_rpc_local(
            _text(caller, "caller"),
            _strings(chain, "chain"),
            address,
            _text(method, "method"),
            args,
            _timeout(timeout),
        )
    if op == "http" and len(msg) == 12:
        _, _, class_name, name, method, path, query, headers, body, caller, chain, timeout = msg
        if type(body) is not bytes:
            raise ValueError("body must be bytes")
        if caller is not None:
            _text(caller, "caller")
        split_address(f"{_text(class_name, 'class')}/{_text(name, 'name')}")
        request = Request(
            _text(method, "method"),
            _text(path, "path"),
            _string_map(query, "query"),
            Headers(_string_map(headers, "headers")),
            body,
            caller,
        )
        resp = await local.deliver_local(
            class_name, name, request, _strings(chain, "chain"), _timeout(timeout)
        )
        return [resp.status, dict(resp.headers.items()), bytes(resp.body)]
    raise ValueError("not a request this host knows")


# -- the listening side -------------------------------------------------------------------------
def keep_alive(stream: trio.abc.Stream) -> None:
    """TCP keepalives and a user timeout on a peer connection, so that a peer gone without a
    word (its machine lost, the network cut) breaks the connection within seconds, and the
    calls waiting on it end ("the call may have run"), instead of waiting for ever."""
    if not isinstance(stream, trio.SocketStream):
        return  # the simulator's streams
    for level, option, value in (
        (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPIDLE", None), 5),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPINTVL", None), 2),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPCNT", None), 3),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_USER_TIMEOUT", None), 10_000),
    ):
        if option is not None:
            with contextlib.suppress(OSError):
                stream.setsockopt(level, option, value)


async def serve_connection(
    stream: trio.abc.Stream, secret: bytes, local: Local, nonce: Nonce = secrets.token_bytes
) -> None:
    """Answer one peer's connection until it ends (``serve_peers`` for each one it accepts; the
    simulator for its own streams)."""
    keep_alive(stream)
    try:
        channel = await accept(stream, secret, nonce)
    except (PeerRefused, trio.TooSlowError, trio.EndOfChannel, trio.BrokenResourceError) as exc:
        log.warning("refused a connection on the internal port", reason=str(exc) or repr(exc))
        await stream.aclose()
        return

    async def answer(msg: list[Any]) -> None:
        try:
            reply = [msg[0], _OK, await _run_request(local, msg)]
        except ValueError as exc:  # a peer's bad request: refused, the host goes on
            reply = [msg[0], _ERROR, ["remote", 400, "BadRequest", str(exc), None]]
        except Exception as exc:
            if not isinstance(exc, RemoteError | CallTimeout | HostClosed):
                log.exception("an event from another host failed", op=msg[1])
            reply = [msg[0], _ERROR, _error_of(exc)]
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            # The dialer gone: nobody hears it (and nothing of this reaches the host).
            try:
                await channel.send(reply)
            except FrameTooLarge as exc:
                error = ["remote", 500, "InternalError", str(exc), None]
                await channel.send([msg[0], _ERROR, error])

    async with stream, trio.open_nursery() as nursery:
        try:
            while True:
                msg = await channel.receive()
                if type(msg) is not list or not msg or type(msg[0]) is not int:
                    raise PeerRefused("a request without an id")
                nursery.start_soon(answer, msg)
        except (trio.EndOfChannel, trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except PeerRefused as exc:
            log.warning("closed a connection on the internal port", reason=str(exc))
        nursery.cancel_scope.cancel()  # the dialer is gone: nobody hears these answers


async def serve_peers(
    listeners: list[trio.SocketListener],
    secret: bytes,
    local: Local,
    *,
    task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the internal port until cancelled."""

    async def handler(stream: trio.SocketStream) -> None:
        try:
            await serve_connection(stream, secret, local)
        except Exception:  # one peer's connection never takes the host down
            log.exception("a connection on the internal port failed")

    await trio.serve_listeners(handler, listeners, task_status=task_status)


# -- the dialing side ---------------------------------------------------------------------------
class _Slot:
    """Where one call's reply lands: ``reply`` is None if the connection ended first."""

    __slots__ = ("done", "reply")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.reply: list[Any] | None = None


class _Link:
    """One connection to a peer, shared by every call to it."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.waiting: dict[int, _Slot] = {}
        self.next_id = 0
        self.broken = False

    async def read_replies(self) -> None:
        try:
            while True:
                msg = await self.channel.receive()
                if type(msg) is not list or len(msg) != 3 or type(msg[0]) is not int:
                    raise PeerRefused("a reply of the wrong shape")
                slot = self.waiting.pop(msg[0], None)
                if slot is not None:
                    slot.reply = msg
                    slot.done.set()
        except (trio.EndOfChannel, trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except PeerRefused as exc:
            log.warning("closed a connection to another host", reason=str(exc))
        finally:
            self.broken = True
            for slot in self.waiting.values():
                slot.done.set()  # no reply: the outcome is unknown
            self.waiting.clear()
            with trio.CancelScope(shield=True):
                await self.channel.aclose()


class Peers:
    """The connections of one host to the others; ``call`` sends a request and waits."""

    def __init__(
        self,
        secret: bytes,
        connect: Callable[[str, int], Awaitable[trio.abc.Stream]] = trio.open_tcp_stream,
        nonce: Nonce = secrets.token_bytes,
    ) -> None:
        self._secret = secret
        self._connect = connect
        self._nonce = nonce
        self._links: dict[str, _Link] = {}
        self._dialing: dict[str, trio.Lock] = {}
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the connections' reader tasks until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._nursery = None

    async def _link(self, peer: str) -> _Link:
        link = self._links.get(peer)
        if link is not None and not link.broken and not link.channel.broken:
            return link
        lock = self._dialing.setdefault(peer, trio.Lock())
        async with lock:  # one dial at a time per peer: the others wait for its link
            link = self._links.get(peer)
            if link is not None and not link.broken and not link.channel.broken:
                return link
            if self._nursery is None:
                raise Unreachable("this host's peer connections are not running")
            host, _, port = peer.rpartition(":")
            stream: trio.abc.Stream | None = None
            try:
                with trio.fail_after(CONNECT_TIMEOUT):
                    stream = await self._connect(host.strip("[]"), int(port))
                keep_alive(stream)
                channel = await dial(stream, self._secret, self._nonce)
            except (
                OSError,
                ValueError,
                trio.TooSlowError,
                trio.EndOfChannel,
                trio.BrokenResourceError,
                trio.ClosedResourceError,
                PeerRefused,
            ) as exc:
                if stream is not None:
                    with trio.CancelScope(shield=True):
                        await stream.aclose()
                if isinstance(exc, PeerRefused):
                    log.warning("a host refused this host's secret", peer=peer, reason=str(exc))
                    raise Unreachable(f"the host at {peer} refused: {exc}") from None
                raise Unreachable(f"cannot reach the host at {peer}: {exc!r}") from None
            link = self._links[peer] = _Link(channel)
            self._nursery.start_soon(link.read_replies)
            return link

    async def call(self, peer: str, request: list[Any], timeout: float | None, address: str) -> Any:
        """Send ``request`` (without its id) to ``peer`` (``host:port``); its result.

        ``Unreachable`` if it could not be sent; ``Elsewhere`` if the peer does not own the
        actor; ``OutcomeUnknown`` if the connection broke after it was sent; else the error
        the event raised there."""
        link = await self._link(peer)
        call_id = link.next_id
        link.next_id += 1
        slot = link.waiting[call_id] = _Slot()
        try:
            try:
                await link.channel.send([call_id, *request])
            except FrameTooLarge as exc:
                raise RemoteError(413, "PayloadTooLarge", str(exc)) from None
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                link.broken = True  # the next call dials again
                raise outcome_unknown(address) from None
            if timeout is None:
                await slot.done.wait()
            else:
                with trio.move_on_after(timeout + GRACE):
                    await slot.done.wait()
                if not slot.done.is_set():
                    raise CallTimeout(f"{address} did not answer in {timeout} s")
        finally:
            link.waiting.pop(call_id, None)
        reply = slot.reply
        if reply is None:
            raise outcome_unknown(address)
        _, status, result = reply
        if status != _OK:
            _raise_error(result, address)
        return result

    async def deliver(
        self,
        peer: str,
        class_name: str,
        name: str,
        request: Request,
        chain: tuple[str, ...],
        timeout: float | None,
    ) -> Response:
        """``deliver_local`` on ``peer``."""
        msg = [
            "http", class_name, name, request.method, request.path, request.query,
            dict(request.headers.items()), bytes(request.body), request.caller, list(chain),
            timeout,
        ]  # fmt: skip
        status, headers, body = await self.call(peer, msg, timeout, f"{class_name}/{name}")
        return Response(status, headers, body)

    async def call_rpc(
        self,
        peer: str,
        caller: str,
        chain: tuple[str, ...],
        address: str,
        method: str,
        args: dict[str, Any],
        timeout: float | None,
    ) -> Any:
        """``call_rpc_local`` on ``peer``."""
        msg = ["rpc", caller, list(chain), address, method, args, timeout]
        return await self.call(peer, msg, timeout, address)
