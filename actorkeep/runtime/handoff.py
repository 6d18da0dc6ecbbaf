"""Events, and the hand-off between a caller and an actor's worker (decision 0001).

A caller appends an ``Event`` to the actor's inbox and parks (``wait_reply``) until the worker
hands back the reply with ``trio.lowlevel.reschedule`` (``reply``); a caller that times out or
is cancelled stops waiting (the event is then *abandoned*: skipped if it has not started), and
an event that has started keeps running. One task watches every caller's deadline.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import outcome
import trio
from trio.lowlevel import Abort, Task, current_task, reschedule, wait_task_rescheduled

from .. import codec
from ..errors import CallTimeout
from ..http import Headers, Request, Response, ValueReply
from .stats import HostStats

_RESULT_HEADERS = {  # shared: Headers are read-only
    "msgpack": Headers({"content-type": codec.MSGPACK}),
    "json": Headers({"content-type": codec.JSON}),
}

#: A request (an outside request or an HTTP-shaped call), an ``@rpc`` call, the alarm, a
#: WebSocket's message or close (runtime/sockets.py), or a checkpoint of the actor's
#: write-ahead log (the host's own, with no handler).
EventKind = Literal["request", "rpc", "alarm", "websocket", "checkpoint"]
#: What a WebSocket event answers its waiter (nobody reads it).
_HANDLED = Response(204)


class Event:
    """One unit of work for an actor."""

    __slots__ = (
        "abandoned",
        "args",
        "chain",
        "direct",
        "encoding",
        "fn",
        "inline",
        "kind",
        "params",
        "positional",
        "request",
        "timeout",
        "waiter",
    )

    def __init__(
        self,
        kind: EventKind,
        fn: Callable[..., Any] | None,
        request: Request | None,
        chain: tuple[str, ...],
        params: dict[str, str] | None = None,
        args: dict[str, Any] | None = None,
        encoding: codec.Encoding | None = None,
        inline: bool = False,
    ) -> None:
        self.kind = kind
        self.fn = fn  # the handler; None for the alarm
        self.request = request  # None for an @rpc call between actors and the alarm
        self.chain = chain  # addresses whose events wait on this one, outermost first
        self.params = params
        self.args = args  # the arguments of an @rpc call
        self.positional: tuple[Any, ...] | None = None  # a WebSocket handler's arguments
        self.encoding = encoding
        self.inline = inline  # the handler never suspends (routing.never_suspends)
        self.waiter: Task | None = None
        self.timeout: float | None = None  # set while the waiter's timeout is registered
        self.abandoned = False
        self.direct = False  # a protocol operation's value, handed over without a request

    @classmethod
    def alarm(cls) -> Event:
        return cls("alarm", None, None, ())

    @classmethod
    def websocket(cls, fn: Callable[..., Any], args: tuple[Any, ...]) -> Event:
        ev = cls("websocket", fn, None, ())
        ev.positional = args
        return ev

    @classmethod
    def direct_call(
        cls, fn: Callable[..., Any], value: Any, chain: tuple[str, ...], inline: bool
    ) -> Event:
        """A call of a route marked ``@direct`` with the value its ``parse`` would give: its
        handler's value is answered as it is (``ValueReply``). Counted as a request."""
        ev = cls("request", fn, None, chain, inline=inline)
        ev.positional = (value,)
        ev.direct = True
        return ev

    @classmethod
    def checkpoint(cls) -> Event:
        return cls("checkpoint", None, None, ())

    @classmethod
    def direct_rpc(
        cls, fn: Callable[..., Any], args: dict[str, Any], chain: tuple[str, ...], inline: bool
    ) -> Event:
        """An ``@rpc`` call from an actor of this host: its value is answered as a copy
        (``ValueReply``), what encoding it and decoding the reply would give."""
        ev = cls("rpc", fn, None, chain, None, args, "msgpack", inline)
        ev.direct = True
        return ev

    @property
    def from_outside(self) -> bool:
        """Whether an outside client sent it (no actor called)."""
        return self.request is not None and self.request.caller is None

    def call_handler(self, inst: Any) -> Awaitable[Any]:
        """The handler's coroutine on the actor ``inst``: an ``@rpc`` method takes its
        arguments, a route the request and its path parameters."""
        assert self.fn is not None
        if self.positional is not None:
            return self.fn(inst, *self.positional)  # type: ignore[no-any-return]
        if self.args is not None:
            return self.fn(inst, **self.args)  # type: ignore[no-any-return]
        return self.fn(inst, self.request, **(self.params or {}))  # type: ignore[no-any-return]

    def response(self, result: Any, in_transaction: bool) -> Response:
        """The reply to this event, whose handler returned ``result`` (``in_transaction``:
        the actor's database still has a transaction open, a bug of the handler's)."""
        if in_transaction:
            raise RuntimeError(
                "the event ended with a transaction still open: commit it before returning "
                "(or use `with self.sql.transaction():`)"
            )
        if self.kind == "websocket":
            return _HANDLED
        if self.direct:
            if self.kind == "rpc":  # the caller's own copy, as msgpack both ways would give
                return ValueReply(codec.copy_value(result))
            return result if isinstance(result, Response) else ValueReply(result)
        if self.encoding is not None:  # @rpc: encode the return value as the request was
            headers = _RESULT_HEADERS[self.encoding]
            return Response(200, headers, codec.encode(result, self.encoding))
        if not isinstance(result, Response):
            assert self.fn is not None
            request = self.request
            if request is not None and request.upgrade is not None:
                return request.upgrade.accepted(result, self.fn)
            raise TypeError(
                f"route handler {self.fn.__qualname__} returned {type(result).__name__}, "
                "not ak.Response"
            )
        return result


def check_timeout(timeout: float | None) -> None:
    """``ValueError`` unless ``timeout`` is None or a number of seconds >= 0."""
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout >= 0
    ):
        raise ValueError(f"timeout must be None or a number of seconds >= 0, not {timeout!r}")


class CallTimeouts:
    """The deadlines of every waiting caller, watched by one task.

    A cancel scope per call costs more than the rest of a call; instead each waiting event is
    kept in one ``OrderedDict`` per timeout value. Calls of one timeout value arrive in deadline
    order, so each dict is sorted by deadline and adding, removing and finding the earliest are
    O(1).
    """

    def __init__(self, stats: HostStats | None = None) -> None:
        self.stats = stats if stats is not None else HostStats()
        self._by_timeout: dict[float, OrderedDict[Event, float]] = {}
        self._scope: trio.CancelScope | None = None

    def __len__(self) -> int:
        """How many timeout values have a waiting caller (each keeps an entry until then)."""
        return len(self._by_timeout)

    def add(self, ev: Event, timeout: float) -> None:
        deadline = trio.current_time() + timeout
        pending = self._by_timeout.get(timeout)
        if pending is None:
            pending = self._by_timeout[timeout] = OrderedDict()
        pending[ev] = deadline
        ev.timeout = timeout
        scope = self._scope
        if scope is not None and deadline < scope.deadline:
            scope.deadline = deadline

    def discard(self, ev: Event) -> None:
        timeout = ev.timeout
        if timeout is not None:
            ev.timeout = None
            pending = self._by_timeout[timeout]
            del pending[ev]
            if not pending:  # callers may use many timeout values: keep only live ones
                del self._by_timeout[timeout]

    async def watch(self) -> None:
        while True:
            now = trio.current_time()
            earliest = math.inf
            for timeout, pending in list(self._by_timeout.items()):
                while pending:
                    ev, deadline = next(iter(pending.items()))
                    if deadline > now:
                        earliest = min(earliest, deadline)
                        break
                    del pending[ev]
                    ev.timeout = None
                    waiter = ev.waiter
                    if waiter is not None:
                        ev.waiter = None
                        ev.abandoned = True
                        self.stats.call_timeouts += 1
                        reschedule(
                            waiter, outcome.Error(CallTimeout(f"no answer within {timeout} s"))
                        )
                if not pending:
                    del self._by_timeout[timeout]
            with trio.CancelScope(deadline=earliest) as scope:
                self._scope = scope
                await trio.sleep_forever()
            self._scope = None

    async def wait_reply(self, ev: Event, timeout: float | None) -> Response:
        """Park until the worker answers ``ev``, ``timeout`` passes (``CallTimeout``) or we are
        cancelled. In the last two cases the event is abandoned: skipped if not started."""
        ev.waiter = current_task()
        if timeout is not None:
            self.add(ev, timeout)

        def abort(_: Any) -> Abort:
            ev.waiter = None
            ev.abandoned = True
            self.discard(ev)
            return Abort.SUCCEEDED

        return await wait_task_rescheduled(abort)  # type: ignore[no-any-return]

    def reply(self, ev: Event, result: outcome.Outcome[Response]) -> None:
        """Hand ``result`` to the caller of ``ev``, if it still waits. An outcome is unwrapped
        once: give each event its own."""
        waiter = ev.waiter
        if waiter is not None:
            ev.waiter = None
            self.discard(ev)
            reschedule(waiter, result)


#: What a parked worker is woken with when its actor leaves memory.
STOP = object()


def _abort_park(_: Any) -> Abort:
    return Abort.SUCCEEDED


async def park() -> object:
    """Park the current task until ``wake``; what it was woken with."""
    return await wait_task_rescheduled(_abort_park)


def wake(task: Task, value: object = None) -> None:
    """Wake a task parked in ``park`` with ``value``."""
    reschedule(task, outcome.Value(value))
