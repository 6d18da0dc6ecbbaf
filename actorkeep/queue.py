"""``ak.queue``: the client of queue actors and the consumer side of push delivery
(docs/queues.md, docs/reference.md).

A queue is one actor of the ready class ``queues.Queue`` (``queue/emails``). Everything here
runs inside an actor's event: the client calls the queue through the actor whose event is
running, found with ``ak.current_actor()``, by its public call path. The frames both sides
exchange, their limits and the values they carry are declared once, in
``actorkeep.wire.queue``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from .address import split_address
from .http import Request, Response, error_response
from .routing import route
from .runtime.activation import current_actor
from .wire import Op, reply_response
from .wire import queue as wire
from .wire.queue import (
    Ack,
    Bury,
    Config,
    DeadLetter,
    Job,
    Lease,
    OnDuplicate,
    Outcome,
    Retry,
    Stats,
)
from .wire.queue_checks import MAX_ERROR, check_seconds

__all__ = [
    "DELIVER_PATH",
    "PREFIX",
    "Ack",
    "Bury",
    "Client",
    "Config",
    "DeadLetter",
    "Fail",
    "Job",
    "Lease",
    "Retry",
    "RetryLater",
    "Stats",
    "consumer",
    "handle_delivery",
]

#: The path prefix of the queue protocol, and the path push deliveries are posted to.
PREFIX = wire.QUEUE.prefix.rstrip("/")
DELIVER_PATH = wire.DELIVER.path


@dataclass(frozen=True, slots=True)
class RetryLater:
    """What a consumer's handler returns to have its message retried after ``delay`` seconds."""

    delay: float

    def __post_init__(self) -> None:
        check_seconds(self.delay, "delay")


@dataclass(frozen=True, slots=True)
class Fail:
    """What a consumer's handler returns to dead-letter its message now, with ``reason``,
    whatever attempts it has left (a message that can never succeed)."""

    reason: str

    def __post_init__(self) -> None:
        Bury(1, 1, self.reason)  # the same checks as on the wire


# -- the client --------------------------------------------------------------------------------


class Client:
    """Talks to the queue actor at ``address`` on behalf of the actor whose event is running.

    Every method checks its arguments before any call (``ValueError``), and raises
    ``ak.RemoteError`` (or a subclass: ``BadRequest``, ``Forbidden``, ``Overloaded``,
    ``ReentryError``) for an error reply and ``ak.CallTimeout`` after ``timeout`` seconds.
    A write whose reply is lost may have applied: a retried send may queue the message twice.
    """

    __slots__ = ("address", "timeout")

    def __init__(self, address: str, timeout: float | None = 30.0) -> None:
        split_address(address)
        self.address = address
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"<ak.queue.Client {self.address}>"

    async def _call(self, op: Op, **fields: Any) -> dict[str, Any]:
        op.check(fields)  # refused here, as the queue would refuse it
        resp = await current_actor().actors.call_op(self.address, op, fields, self.timeout)
        return op.result(resp)

    async def send(
        self,
        body: bytes,
        delay: float = 0.0,
        priority: int = 0,
        *,
        key: str | None = None,
        group: str | None = None,
        on_duplicate: OnDuplicate = "keep",
        remember: float | None = None,
        expires: float | None = None,
        max_attempts: int | None = None,
    ) -> int:
        """Queue one message, visible after ``delay`` seconds. Its id once it is durable.

        ``key``: while a message with this key is live, no second one is queued and its id
        comes back (``on_duplicate="replace"``: its body is replaced and its due time pushed
        back to ``delay`` from now, unless it is leased); ``remember`` keeps the key that many
        seconds after the message is acked. ``group``: one message of a group is leased at a
        time, in send order. ``expires``: seconds until a message not done goes to the dead
        letters as ``"expired"``. ``max_attempts``: this message's, instead of the queue's.
        """
        return (
            await self.send_batch(
                [body],
                delay,
                priority,
                keys=None if key is None else [key],
                groups=None if group is None else [group],
                on_duplicate=on_duplicate,
                remember=remember,
                expires=expires,
                max_attempts=max_attempts,
            )
        )[0]

    async def send_delayed(self, body: bytes, delay: float) -> int:
        """``send(body, delay=delay)``."""
        return await self.send(body, delay=delay)

    async def send_batch(
        self,
        bodies: Sequence[bytes],
        delay: float = 0.0,
        priority: int = 0,
        *,
        keys: Sequence[str | None] | None = None,
        groups: Sequence[str | None] | None = None,
        on_duplicate: OnDuplicate = "keep",
        remember: float | None = None,
        expires: float | None = None,
        max_attempts: int | None = None,
    ) -> list[int]:
        """Queue 1..1,000 messages in one durable write, all or none; their ids in order.
        ``keys`` and ``groups`` hold one entry (or None) per body; the rest as for ``send``."""
        if not isinstance(bodies, list | bytes | bytearray | str) and isinstance(bodies, Sequence):
            bodies = list(bodies)
        fields: dict[str, Any] = {"bodies": bodies, "delay": delay, "priority": priority}
        for name, value in (
            ("keys", keys),
            ("groups", groups),
            ("remember", remember),
            ("expires", expires),
            ("max_attempts", max_attempts),
        ):
            if value is not None:
                fields[name] = list(value) if isinstance(value, tuple) else value
        if on_duplicate != "keep":
            fields["on_duplicate"] = on_duplicate
        for name, names in (("keys", keys), ("groups", groups)):
            if names is not None and not isinstance(names, str) and len(names) != len(bodies):
                raise ValueError(f"send: {name} holds one entry per body ({len(bodies)})")
        ids: list[int] = (await self._call(wire.SEND, **fields))["ids"]
        if len(ids) != len(bodies):
            raise ValueError("queue answered send with a malformed reply")
        return ids

    async def lease(
        self, max: int = 10, visibility: float = 30.0, worker: str | None = None
    ) -> list[Lease]:
        """Lease up to ``max`` visible messages for ``visibility`` seconds, at most one per
        group. ``worker`` names the claimant, shown by ``get()`` and the dead letters."""
        fields: dict[str, Any] = {"max": max, "visibility": visibility}
        if worker is not None:
            fields["worker"] = worker
        leases: list[Lease] = (await self._call(wire.LEASE, **fields))["leases"]
        return leases

    async def settle(self, outcomes: Sequence[Outcome]) -> list[bool]:
        """Apply acks and retries in one event; for each, False if its lease was stale."""
        if isinstance(outcomes, str | bytes) or not isinstance(outcomes, Sequence):
            raise ValueError("outcomes must be a list of Ack, Retry or Bury")
        for o in outcomes:
            if not isinstance(o, Ack | Retry | Bury):
                raise ValueError(f"an outcome must be Ack, Retry or Bury, not {type(o).__name__}")
        if not outcomes:
            return []
        frames = [wire.outcome_to_wire(o) for o in outcomes]
        results: list[bool] = (await self._call(wire.SETTLE, outcomes=frames))["results"]
        if len(results) != len(outcomes):
            raise ValueError("queue answered settle with a malformed reply")
        return results

    async def ack(self, id: int, attempt: int) -> bool:
        """Delete the message if ``(id, attempt)`` is its current lease; False if stale."""
        return (await self.settle([Ack(id, attempt)]))[0]

    async def retry(
        self, id: int, attempt: int, delay: float | None = None, error: str | None = None
    ) -> bool:
        """Make the message visible after ``delay`` (None: backoff); False if stale."""
        return (await self.settle([Retry(id, attempt, delay, error)]))[0]

    async def fail(self, id: int, attempt: int, reason: str) -> bool:
        """Dead-letter the message now with ``reason`` if ``(id, attempt)`` is its current
        lease; False if stale."""
        return (await self.settle([Bury(id, attempt, reason)]))[0]

    async def extend(self, id: int, attempt: int, visibility: float) -> bool:
        """Heartbeat: the current lease now ends ``visibility`` seconds from now."""
        reply = await self._call(wire.EXTEND, id=id, attempt=attempt, visibility=visibility)
        ok: bool = reply["ok"]
        return ok

    async def cancel(self, id: int) -> bool:
        """Delete a message in any live state (durably); False if there is none."""
        ok: bool = (await self._call(wire.CANCEL, id=id))["ok"]
        return ok

    async def get(self, id: int) -> Job | None:
        """The message (live or dead) with this id, or None."""
        job: Job | None = (await self._call(wire.GET, id=id))["job"]
        return job

    async def stats(self) -> Stats:
        """Counts by state and the age of the oldest ready message."""
        reply = await self._call(wire.STATS)
        return Stats(*(reply[name] for name in wire.STATS.reply_fields))

    async def dead_letters(self, limit: int = 100, after: int | None = None) -> list[DeadLetter]:
        """Dead letters in id order, starting after id ``after``."""
        items: list[DeadLetter] = (await self._call(wire.DEAD_LETTERS, limit=limit, after=after))[
            "items"
        ]
        return items

    async def redrive(self, ids: Sequence[int] | None = None) -> int:
        """Move dead letters (all, or those ``ids``) back to ready, as new messages with new
        ids and no attempts. The number moved."""
        listed = None if ids is None else list(ids)
        count: int = (await self._call(wire.REDRIVE, ids=listed))["count"]
        return count

    async def configure(self, config: Config) -> None:
        """Store ``config`` durably in the queue (and arm push delivery if it names a consumer)."""
        if not isinstance(config, Config):
            raise ValueError(f"configure takes an ak.queue.Config, not {type(config).__name__}")
        await self._call(wire.CONFIGURE, config=config.to_wire())

    async def config(self) -> Config:
        """The queue's current settings."""
        config: Config = (await self._call(wire.CONFIG))["config"]
        return config


# -- the consumer side -------------------------------------------------------------------------

Handler = Callable[[Lease], Awaitable[RetryLater | Fail | None] | RetryLater | Fail | None]


def _error_text(exc: BaseException) -> str:
    # backslashreplace: an error text may hold lone surrogates (os.fsdecode of bad bytes),
    # which msgpack cannot encode; the queue must still record it.
    text = f"{type(exc).__name__}: {exc}".encode("utf-8", "backslashreplace").decode()
    return text if len(text) <= MAX_ERROR else text[: MAX_ERROR - 1] + "…"


async def handle_delivery(
    request: Request, handler: Handler, queues: Iterable[str] | None = None
) -> Response:
    """Answer a push delivery: call ``handler(message)`` for each message in order.

    Returning normally acks the message; raising retries it with the queue's backoff and
    records the error; returning ``RetryLater(delay)`` retries it after ``delay``; returning
    ``Fail(reason)`` dead-letters it now. A request
    from outside (no caller) gets 403, and so does a queue not in ``queues`` when given.
    A bad frame gets 400. The handler must not call the queue that delivers (``ReentryError``).
    """
    if request.caller is None:
        return error_response(403, "Forbidden", "deliveries come from queue actors only")
    if queues is not None and request.caller not in set(queues):
        return error_response(403, "Forbidden", f"{request.caller!r} may not deliver here")
    try:
        messages: list[Lease] = wire.DELIVER.decode(request.body)["messages"]
    except ValueError as exc:
        return error_response(400, "BadRequest", str(exc))
    outcomes: list[dict[str, Any]] = []
    for msg in messages:
        result: object
        try:
            result = handler(msg)
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:
            outcomes.append(
                wire.outcome_to_wire(Retry(msg.id, msg.attempt, None, _error_text(exc)))
            )
            continue
        if isinstance(result, RetryLater):
            outcomes.append(wire.outcome_to_wire(Retry(msg.id, msg.attempt, result.delay)))
        elif isinstance(result, Fail):
            outcomes.append(wire.outcome_to_wire(Bury(msg.id, msg.attempt, result.reason)))
        else:
            outcomes.append(wire.outcome_to_wire(Ack(msg.id, msg.attempt)))
    return reply_response({"outcomes": outcomes})


S = TypeVar("S")
MethodHandler = Callable[[S, Lease], Awaitable[RetryLater | Fail | None]]
RouteMethod = Callable[[S, Request], Awaitable[Response]]


@overload
def consumer(fn: MethodHandler[S], /) -> RouteMethod[S]: ...
@overload
def consumer(
    *, queues: Iterable[str] | None = None
) -> Callable[[MethodHandler[S]], RouteMethod[S]]: ...
def consumer(
    fn: MethodHandler[S] | None = None, /, *, queues: Iterable[str] | None = None
) -> RouteMethod[S] | Callable[[MethodHandler[S]], RouteMethod[S]]:
    """Mount ``async def handle(self, message: Lease)`` at the deliver path of its actor class.

    The decorated attribute becomes the route handler (``POST /actorkeep-queue/v1/deliver``);
    see ``handle_delivery`` for what the method's result means. ``queues`` limits which queue
    addresses may deliver.
    """
    allowed = None if queues is None else frozenset(queues)
    if allowed is not None:
        for q in allowed:
            split_address(q)

    def wrap(method: MethodHandler[S]) -> RouteMethod[S]:
        if not inspect.iscoroutinefunction(method):
            raise TypeError(f"@ak.queue.consumer method {method.__qualname__} must be async def")

        @functools.wraps(method)
        async def deliver(self: S, request: Request) -> Response:
            return await handle_delivery(request, functools.partial(method, self), allowed)

        return route("POST", DELIVER_PATH)(deliver)

    return wrap if fn is None else wrap(fn)
