"""Events between the hosts of a cluster (decision 0017): a host sends an event for an actor
it does not own to the owner's internal port, and the owner runs it as if it had come from
there, caller and call chain included (they are trusted because every frame is signed with the
cluster's secret: ``peerwire.py``).

A request is an ``@rpc`` call, an operation of a ready class's protocol, or an HTTP-shaped
request (``peer_requests.py`` says what each carries). Many requests share one connection per
pair of hosts, each answered when its event ends.
"""

from __future__ import annotations

import contextlib
import math
import secrets
import socket
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import outcome
import structlog
import trio

from .. import codec
from ..address import split_address
from ..errors import (
    CallTimeout,
    HostClosed,
    OutcomeUnknown,
    RemoteError,
)
from ..http import Request, Response, ValueReply
from ..routing import Operation
from .peer_requests import (
    UNKNOWN_REQUEST,
    Local,
    error_of,
    op_request,
    outcome_unknown,
    raise_error,
    response_of,
    run_request,
)
from .peerwire import Channel, FrameTooLarge, Nonce, PeerRefused, Unsendable, accept, dial

log = structlog.get_logger("actorkeep")

#: How much longer than the callee's own timeout the caller waits for the answer.
GRACE: Final = 1.0
#: At most how many tasks of a connection, each done with a request, wait for the next one.
IDLE_ANSWERERS: Final = 64
#: How long dialing a host may take before it counts as unreachable.
CONNECT_TIMEOUT: Final = 2.0

_OK, _ERROR = 0, 1
#: ``[id, "batches"]``: the dialer reads frames of many messages (``peerwire.py``), and asks
#: whether the listener does. A host from before batches answers 400 ``UNKNOWN_REQUEST``.
BATCHES: Final = "batches"


class Unreachable(Exception):
    """The owner's internal port could not be reached: nothing was sent."""


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
            reply = [msg[0], _OK, await run_request(local, msg)]
        except ValueError as exc:  # a peer's bad request: refused, the host goes on
            reply = [msg[0], _ERROR, ["remote", 400, "BadRequest", str(exc), None]]
        except Exception as exc:
            if not isinstance(exc, RemoteError | CallTimeout | HostClosed):
                log.exception("an event from another host failed", op=msg[1])
            reply = [msg[0], _ERROR, error_of(exc)]
        try:
            await say(reply)
        except Unsendable as exc:  # nothing was sent: this call fails, not the connection
            if not isinstance(exc, FrameTooLarge):  # not msgpack, or too deep in its reply
                log.error("a reply to another host could not be packed", op=msg[1], error=str(exc))
            await say([msg[0], _ERROR, ["remote", 500, "InternalError", str(exc), None]])

    async def say(reply: list[Any]) -> None:
        # Not contextlib.suppress: a context manager a reply costs more than the try.
        try:  # noqa: SIM105
            await channel.send(reply)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the dialer gone: nobody hears it, nor does the host

    # Each request is answered by a task of its own; a task that answered waits for the next
    # request (at most IDLE_ANSWERERS of them wait), which costs less than a new task.
    idle: list[trio.lowlevel.Task] = []

    async def answerer(msg: list[Any]) -> None:
        task = trio.lowlevel.current_task()

        def unpark(_: Any) -> trio.lowlevel.Abort:
            idle.remove(task)
            return trio.lowlevel.Abort.SUCCEEDED

        while True:
            await answer(msg)
            if len(idle) >= IDLE_ANSWERERS:
                return
            idle.append(task)
            msg = await trio.lowlevel.wait_task_rescheduled(unpark)

    async with stream, trio.open_nursery() as nursery:
        try:
            while True:
                msg = await channel.receive()
                if type(msg) is not list or not msg or type(msg[0]) is not int:
                    raise PeerRefused("a request without an id")
                if len(msg) == 2 and msg[1] == BATCHES:  # the dialer reads batches
                    channel.batches = True
                    nursery.start_soon(say, [msg[0], _OK, True])
                    continue
                if idle:
                    trio.lowlevel.reschedule(idle.pop(), outcome.Value(msg))
                else:
                    nursery.start_soon(answerer, msg)
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
    """Where one call's reply lands: ``reply`` is None if the connection ended first, or if
    ``deadline`` passed first (``late``). ``end`` wakes the caller if it waits (``wait``)."""

    __slots__ = ("deadline", "done", "late", "reply", "task")

    def __init__(self) -> None:
        self.done = False
        self.reply: list[Any] | None = None
        self.deadline = math.inf
        self.late = False
        self.task: trio.lowlevel.Task | None = None  # the caller, while it waits

    def end(self, reply: list[Any] | None = None, *, late: bool = False) -> None:
        if self.done:
            return
        self.done, self.reply, self.late = True, reply, late
        task = self.task
        if task is not None:
            self.task = None
            trio.lowlevel.reschedule(task)

    async def wait(self) -> None:
        if not self.done:
            self.task = trio.lowlevel.current_task()
            await trio.lowlevel.wait_task_rescheduled(self._abort)

    def _abort(self, _: Any) -> trio.lowlevel.Abort:
        self.task = None  # cancelled: a reply that comes now must not wake it
        return trio.lowlevel.Abort.SUCCEEDED


class _Link:
    """One connection to a peer, shared by every call to it."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.waiting: dict[int, _Slot] = {}
        self.next_id = 0
        self.broken = False
        self.takes_ops = True  # until the peer answers an "op" request UNKNOWN_REQUEST

    async def read_replies(self) -> None:
        try:
            while True:
                msg = await self.channel.receive()
                if type(msg) is not list or len(msg) != 3 or type(msg[0]) is not int:
                    raise PeerRefused("a reply of the wrong shape")
                slot = self.waiting.pop(msg[0], None)
                if slot is not None:
                    slot.end(msg)
        except (trio.EndOfChannel, trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except PeerRefused as exc:
            log.warning("closed a connection to another host", reason=str(exc))
        finally:
            self.broken = True
            for slot in self.waiting.values():
                slot.end()  # no reply: the outcome is unknown
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
        self._deadlines = trio.CancelScope()  # the watcher's sleep until the earliest deadline

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the connections' reader tasks, and watch the calls' deadlines, until
        cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                await self._watch_deadlines()
            finally:
                self._nursery = None

    async def _watch_deadlines(self) -> None:
        # One task for every call's deadline: a cancel scope per call costs more than the rest
        # of the caller's side of a call (as the host's CallTimeouts found).
        while True:
            now, earliest = trio.current_time(), math.inf
            for link in list(self._links.values()):
                for slot in link.waiting.values():
                    if slot.deadline <= now:
                        slot.end(late=True)
                    elif slot.deadline < earliest:
                        earliest = slot.deadline
            with trio.CancelScope(deadline=earliest) as self._deadlines:
                await trio.sleep_forever()

    def _watch(self, slot: _Slot, deadline: float) -> None:
        slot.deadline = deadline
        if deadline < self._deadlines.deadline:
            self._deadlines.deadline = deadline

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
            self._nursery.start_soon(self._ask_batches, link, peer)
            return link

    async def _ask_batches(self, link: _Link, peer: str) -> None:
        """Ask the listener whether it reads batches, again while it does not answer in time;
        until it says so, and if it cannot (a host from before them, or the connection ends
        first), one message a frame."""
        while not link.broken:
            try:
                said = await self._call(link, [BATCHES], CONNECT_TIMEOUT, peer)
            except CallTimeout as exc:
                if isinstance(exc, OutcomeUnknown):
                    return  # the connection ended
                continue  # not answered in time: one message a frame until it answers
            except Exception as exc:
                if not (isinstance(exc, RemoteError) and exc.message == UNKNOWN_REQUEST):
                    log.info("no batches on a connection", peer=peer, reason=repr(exc))
                return
            link.channel.batches = said is True
            return

    async def call(self, peer: str, request: list[Any], timeout: float | None, address: str) -> Any:
        """Send ``request`` (without its id) to ``peer`` (``host:port``); its result.

        ``Unreachable`` if it could not be sent; ``Elsewhere`` if the peer does not own the
        actor; ``OutcomeUnknown`` if the connection broke after it was sent; else the error
        the event raised there."""
        return await self._call(await self._link(peer), request, timeout, address)

    async def _call(
        self, link: _Link, request: list[Any], timeout: float | None, address: str
    ) -> Any:
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
            if timeout is not None:
                self._watch(slot, trio.current_time() + timeout + GRACE)
            await slot.wait()
            if slot.late:
                raise CallTimeout(f"{address} did not answer in {timeout} s")
        finally:
            link.waiting.pop(call_id, None)
        reply = slot.reply
        if reply is None:
            raise outcome_unknown(address)
        _, status, result = reply
        if status != _OK:
            raise_error(result, address)
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
        return response_of(await self.call(peer, msg, timeout, f"{class_name}/{name}"))

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
        """``call_rpc_local`` on ``peer``. ``args`` that could not be called with on this host
        (``codec.copy_args``: not msgpack, or keys the decoder refuses) raise here, as they
        would there, and nothing is sent."""
        msg = ["rpc", caller, list(chain), address, method, codec.copy_args(args), timeout]
        return await self.call(peer, msg, timeout, address)

    async def call_op(
        self,
        peer: str,
        caller: str,
        chain: tuple[str, ...],
        address: str,
        op: Operation,
        values: Mapping[str, Any],
        timeout: float | None,
    ) -> Response:
        """``call_op_local`` on ``peer``: a ``ValueReply`` if the handler returned its reply
        map, else the ``Response``. To a host from before ``op`` requests, as an ``http``
        request to the operation's route."""
        link = await self._link(peer)
        if link.takes_ops:
            msg = ["op", caller, list(chain), address, op.path, values, timeout]
            try:
                result = await self._call(link, msg, timeout, address)
            except RemoteError as exc:
                if exc.status != 400 or exc.message != UNKNOWN_REQUEST:
                    raise
                link.takes_ops = False  # it ran nothing: send it the route's way
            else:
                if type(result) is list and len(result) == 1:
                    return ValueReply(result[0])
                return response_of(result)
        class_name, name = split_address(address)
        request = op_request(caller, op.path, values)
        return await self.deliver(peer, class_name, name, request, chain, timeout)
