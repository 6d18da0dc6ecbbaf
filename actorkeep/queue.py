"""``ak.queue``: the client of queue actors, the consumer side of push delivery, and the frames
both sides exchange (SPEC §8).

A queue is one actor of the ready class ``queues.Queue`` (``queue/emails``). Everything here
runs inside an actor's event: the client calls the queue through the actor whose event is
running, found with ``ak.current_actor()``.

The protocol is internal and versioned in its path: ``POST /actorkeep-queue/v1/<op>`` with a
msgpack map and a msgpack map in reply; a bad frame gets 400 with the JSON error body. Every
field is checked by the functions of this module, on both sides, so that the client refuses
before any call exactly what the queue would refuse on the wire.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, overload

from . import codec
from .address import split_address
from .errors import error_for_status
from .http import Headers, Request, Response, error_response
from .routing import route
from .runtime.activation import current_actor

__all__ = [
    "DELIVER_PATH",
    "PREFIX",
    "Ack",
    "Client",
    "Config",
    "DeadLetter",
    "Job",
    "Lease",
    "Retry",
    "RetryLater",
    "Stats",
    "consumer",
    "handle_delivery",
]

PREFIX = "/actorkeep-queue/v1"
DELIVER_PATH = f"{PREFIX}/deliver"
MSGPACK_HEADERS = {"content-type": codec.MSGPACK}

# -- limits ------------------------------------------------------------------------------------

MAX_BATCH = 1_000  # messages per send_batch, leases per lease(), outcomes per settle()
MAX_BODY = 1 << 20  # bytes per message body
MAX_BATCH_BYTES = 16 << 20  # bytes of bodies per send_batch
MAX_SECONDS = 1e9  # longest delay, visibility, backoff or retention (about 31 years)
MAX_ERROR = 4096  # characters of a recorded error
MIN_PRIORITY, MAX_PRIORITY = -(2**31), 2**31 - 1
MAX_ID = 2**63 - 1
MAX_ATTEMPTS = 1_000_000

State = Literal["ready", "delayed", "leased", "dead"]

# -- public values -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Lease:
    """A leased message. ``(id, attempt)`` names the lease; ``attempt`` counts from 1."""

    id: int
    attempt: int
    body: bytes
    enqueued_at: float


@dataclass(frozen=True, slots=True)
class Ack:
    """Outcome: the message is done; delete it if ``(id, attempt)`` is still the lease."""

    id: int
    attempt: int

    def __post_init__(self) -> None:
        check_id(self.id)
        check_attempt(self.attempt)


@dataclass(frozen=True, slots=True)
class Retry:
    """Outcome: make the message visible again after ``delay`` (None: the queue's backoff)."""

    id: int
    attempt: int
    delay: float | None = None
    error: str | None = None

    def __post_init__(self) -> None:
        check_id(self.id)
        check_attempt(self.attempt)
        if self.delay is not None:
            check_seconds(self.delay, "delay")
        check_error(self.error)


Outcome = Ack | Retry


@dataclass(frozen=True, slots=True)
class RetryLater:
    """What a consumer's handler returns to have its message retried after ``delay`` seconds."""

    delay: float

    def __post_init__(self) -> None:
        check_seconds(self.delay, "delay")


@dataclass(frozen=True, slots=True)
class Stats:
    """Message counts by state; ``oldest_ready_age``: seconds since the oldest ready message
    was enqueued (None when none is ready)."""

    ready: int
    delayed: int
    leased: int
    dead: int
    oldest_ready_age: float | None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message moved to the dead-letter table, with why."""

    id: int
    body: bytes
    enqueued_at: float
    attempts: int
    failed_at: float
    reason: str


@dataclass(frozen=True, slots=True)
class Job:
    """One message as ``get(id)`` sees it. ``visible_at`` is when a delayed message becomes
    ready or a lease ends (None for a dead letter); ``failed_at`` is set for a dead letter,
    whose ``last_error`` is the reason."""

    id: int
    state: State
    attempts: int
    visible_at: float | None
    last_error: str | None
    priority: int
    enqueued_at: float
    body: bytes
    failed_at: float | None = None


@dataclass(frozen=True, slots=True)
class Config:
    """A queue's settings, stored durably in the queue by ``configure``.

    ``consumer``: the address pushed to (None: pull only). ``batch_size``: messages per push.
    ``visibility``: seconds a pushed batch stays leased. ``max_attempts``: leases before a
    message is dead-lettered. ``backoff_base``/``backoff_max``: the retry backoff, doubling per
    attempt with equal jitter. ``dead_retention``: seconds dead letters are kept (None: forever).
    """

    consumer: str | None = None
    batch_size: int = 10
    visibility: float = 30.0
    max_attempts: int = 5
    backoff_base: float = 1.0
    backoff_max: float = 300.0
    dead_retention: float | None = None

    def __post_init__(self) -> None:
        if self.consumer is not None:
            split_address(self.consumer)
        check_int(self.batch_size, "batch_size", 1, MAX_BATCH)
        check_positive_seconds(self.visibility, "visibility")
        check_int(self.max_attempts, "max_attempts", 1, MAX_ATTEMPTS)
        check_positive_seconds(self.backoff_base, "backoff_base")
        check_positive_seconds(self.backoff_max, "backoff_max")
        if self.backoff_max < self.backoff_base:
            raise ValueError("backoff_max must be at least backoff_base")
        if self.dead_retention is not None:
            check_seconds(self.dead_retention, "dead_retention")

    def to_wire(self) -> dict[str, Any]:
        return {
            "consumer": self.consumer,
            "batch_size": self.batch_size,
            "visibility": float(self.visibility),
            "max_attempts": self.max_attempts,
            "backoff_base": float(self.backoff_base),
            "backoff_max": float(self.backoff_max),
            "dead_retention": None if self.dead_retention is None else float(self.dead_retention),
        }

    @classmethod
    def from_wire(cls, value: Any) -> Config:
        m = check_map(value, "config", set(_CONFIG_FIELDS))
        if m.get("consumer") is not None:
            check_str(m["consumer"], "consumer", 1000)
        try:
            return cls(**m)
        except TypeError as exc:  # a value of the wrong type inside a comparison
            raise ValueError(f"config: {exc}") from None


_CONFIG_FIELDS = (
    "consumer",
    "batch_size",
    "visibility",
    "max_attempts",
    "backoff_base",
    "backoff_max",
    "dead_retention",
)


def backoff(attempts: int, base: float, cap: float, rand: float) -> float:
    """Equal-jitter backoff after the ``attempts``-th lease: ``d = min(cap, base * 2**(n-1))``,
    then ``d/2 + rand * d/2`` with ``rand`` in [0, 1)."""
    exponent = min(max(attempts, 1) - 1, 1100)  # 2.0**1100 would overflow; the cap applies anyway
    d = cap if exponent > 1023 else min(cap, base * 2.0**exponent)
    return d / 2 + rand * (d / 2)


# -- field checks (shared by the client and the queue) -------------------------------------


def _is_int(v: object) -> bool:
    return type(v) is int


def _is_number(v: object) -> bool:
    return (type(v) is int or type(v) is float) and math.isfinite(v)


def check_int(v: object, name: str, lo: int, hi: int) -> int:
    if not _is_int(v):
        raise ValueError(f"{name} must be an int, not {type(v).__name__}")
    assert isinstance(v, int)
    if not lo <= v <= hi:
        raise ValueError(f"{name} must be in {lo}..{hi}, not {v}")
    return v


def check_id(v: object, name: str = "id") -> int:
    return check_int(v, name, 1, MAX_ID)


def check_attempt(v: object) -> int:
    return check_int(v, "attempt", 1, MAX_ID)


def check_seconds(v: object, name: str) -> float:
    """A finite number of seconds in 0..MAX_SECONDS."""
    if not _is_number(v):
        raise ValueError(f"{name} must be a finite number of seconds, not {v!r}")
    assert isinstance(v, int | float)
    if not 0 <= v <= MAX_SECONDS:
        raise ValueError(f"{name} must be in 0..{MAX_SECONDS:g} seconds, not {v!r}")
    return float(v)


#: The shortest visibility or backoff: shorter spans vanish in ``now + span`` (a subnormal
#: visibility would make a lease visible again at once).
MIN_SPAN = 0.001


def check_positive_seconds(v: object, name: str) -> float:
    s = check_seconds(v, name)
    if s < MIN_SPAN:
        raise ValueError(f"{name} must be at least {MIN_SPAN} seconds, not {v!r}")
    return s


def check_priority(v: object) -> int:
    return check_int(v, "priority", MIN_PRIORITY, MAX_PRIORITY)


def check_str(v: object, name: str, limit: int) -> str:
    if not isinstance(v, str):
        raise ValueError(f"{name} must be a str, not {type(v).__name__}")
    if len(v) > limit:
        raise ValueError(f"{name} is longer than {limit} characters")
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{name} is not encodable as UTF-8") from None
    return v


def check_error(v: object) -> str | None:
    return None if v is None else check_str(v, "error", MAX_ERROR)


def check_body(v: object, name: str = "body") -> bytes:
    if not isinstance(v, bytes | bytearray):
        raise ValueError(f"{name} must be bytes, not {type(v).__name__}")
    if len(v) > MAX_BODY:
        raise ValueError(f"{name} is over {MAX_BODY} bytes")
    return bytes(v)


def check_bodies(v: object) -> list[bytes]:
    if isinstance(v, bytes | bytearray | str) or not isinstance(v, Sequence | list):
        raise ValueError(f"bodies must be a list of bytes, not {type(v).__name__}")
    if not 1 <= len(v) <= MAX_BATCH:
        raise ValueError(f"a batch holds 1..{MAX_BATCH} messages, not {len(v)}")
    bodies = [check_body(b, "each body") for b in v]
    if sum(map(len, bodies)) > MAX_BATCH_BYTES:
        raise ValueError(f"a batch holds at most {MAX_BATCH_BYTES} bytes of bodies")
    return bodies


def check_list(v: object, name: str, lo: int, hi: int) -> list[Any]:
    if not isinstance(v, list):
        raise ValueError(f"{name} must be a list, not {type(v).__name__}")
    if not lo <= len(v) <= hi:
        raise ValueError(f"{name} holds {lo}..{hi} items, not {len(v)}")
    return v


def check_map(
    v: object, name: str, allowed: set[str], required: Iterable[str] = ()
) -> dict[str, Any]:
    """A map with string keys, only ``allowed`` ones, all ``required`` ones present."""
    if not isinstance(v, dict):
        raise ValueError(f"{name} must be a map, not {type(v).__name__}")
    extra = [k for k in v if k not in allowed]
    if extra:
        raise ValueError(f"{name}: unexpected field(s): {', '.join(sorted(map(repr, extra)))}")
    missing = [k for k in required if k not in v]
    if missing:
        raise ValueError(f"{name}: missing field(s): {', '.join(missing)}")
    return v


def check_ids(v: object) -> list[int]:
    return [check_id(i, "each id") for i in check_list(v, "ids", 1, MAX_BATCH)]


# -- frames ------------------------------------------------------------------------------------


def decode_frame(body: bytes) -> Any:
    """A msgpack value from a frame body; ``ValueError`` if it is not one value of msgpack."""
    try:
        return codec.unpack(body)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise ValueError(f"frame is not valid msgpack: {type(exc).__name__}") from None


def outcome_to_wire(o: Outcome) -> dict[str, Any]:
    if isinstance(o, Ack):
        return {"id": o.id, "attempt": o.attempt, "op": "ack"}
    return {
        "id": o.id,
        "attempt": o.attempt,
        "op": "retry",
        "delay": None if o.delay is None else float(o.delay),
        "error": o.error,
    }


def outcome_from_wire(v: object) -> Outcome:
    m = check_map(v, "outcome", {"id", "attempt", "op", "delay", "error"}, ("id", "attempt", "op"))
    op = m["op"]
    if op == "ack":
        if "delay" in m or "error" in m:
            raise ValueError("outcome: an ack has no delay or error")
        return Ack(m["id"], m["attempt"])
    if op == "retry":
        return Retry(m["id"], m["attempt"], m.get("delay"), m.get("error"))
    raise ValueError(f"outcome: op must be 'ack' or 'retry', not {op!r}")


def outcomes_from_wire(v: object) -> list[Outcome]:
    return [outcome_from_wire(o) for o in check_list(v, "outcomes", 0, MAX_BATCH)]


def lease_to_wire(lease: Lease) -> list[Any]:
    return [lease.id, lease.attempt, lease.body, lease.enqueued_at]


def lease_from_wire(v: object) -> Lease:
    if not isinstance(v, list) or len(v) != 4:
        raise ValueError("a lease is [id, attempt, body, enqueued_at]")
    i, attempt, body, enqueued_at = v
    if not isinstance(body, bytes) or not _is_number(enqueued_at):
        raise ValueError("a lease is [id, attempt, body, enqueued_at]")
    return Lease(check_id(i), check_attempt(attempt), body, float(enqueued_at))


def encode_deliver(queue: str, leases: Sequence[Lease]) -> bytes:
    return codec.pack({"queue": queue, "messages": [lease_to_wire(x) for x in leases]})


def decode_deliver(body: bytes) -> tuple[str, list[Lease]]:
    m = check_map(decode_frame(body), "delivery", {"queue", "messages"}, ("queue", "messages"))
    queue = check_str(m["queue"], "queue", 300)
    split_address(queue)
    messages = [lease_from_wire(x) for x in check_list(m["messages"], "messages", 0, MAX_BATCH)]
    return queue, messages


# -- the client --------------------------------------------------------------------------------


def _reply_error(resp: Response) -> Exception:
    try:
        err = resp.json()
        error, message = str(err["error"]), str(err["message"])
    except Exception:
        error, message = "RemoteError", resp.body[:200].decode("utf-8", "replace")
    return error_for_status(resp.status, error, message)


def _reply_map(value: Any, op: str, keys: Iterable[str]) -> dict[str, Any]:
    if not isinstance(value, dict) or not all(k in value for k in keys):
        raise ValueError(f"queue answered {op} with a malformed reply")
    return value


T = TypeVar("T")


def _build(cls: type[T], value: Any, op: str) -> T:
    """A reply value (a map of fields, or a list of them in order) as ``cls``."""
    try:
        if isinstance(value, dict):
            return cls(**value)
        if isinstance(value, list):
            return cls(*value)
    except TypeError:
        pass
    raise ValueError(f"queue answered {op} with a malformed reply")


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

    async def _call(self, op: str, payload: dict[str, Any]) -> Any:
        actor = current_actor()
        resp = await actor.actors.call(
            self.address,
            "POST",
            f"{PREFIX}/{op}",
            codec.pack(payload),
            headers=MSGPACK_HEADERS,
            timeout=self.timeout,
        )
        if not 200 <= resp.status < 300:
            raise _reply_error(resp)
        return decode_frame(resp.body)

    async def send(self, body: bytes, delay: float = 0.0, priority: int = 0) -> int:
        """Queue one message, visible after ``delay`` seconds. Its id once it is durable."""
        return (await self.send_batch([body], delay, priority))[0]

    async def send_delayed(self, body: bytes, delay: float) -> int:
        """``send(body, delay=delay)``."""
        return await self.send(body, delay=delay)

    async def send_batch(
        self, bodies: Sequence[bytes], delay: float = 0.0, priority: int = 0
    ) -> list[int]:
        """Queue 1..1,000 messages in one durable write, all or none; their ids in order."""
        payload = {
            "bodies": check_bodies(bodies),
            "delay": check_seconds(delay, "delay"),
            "priority": check_priority(priority),
        }
        reply = _reply_map(await self._call("send", payload), "send", ("ids",))
        ids = reply["ids"]
        if not isinstance(ids, list) or len(ids) != len(payload["bodies"]):  # type: ignore[arg-type]
            raise ValueError("queue answered send with a malformed reply")
        return [check_id(i) for i in ids]

    async def lease(self, max: int = 10, visibility: float = 30.0) -> list[Lease]:
        """Lease up to ``max`` visible messages for ``visibility`` seconds."""
        payload = {
            "max": check_int(max, "max", 1, MAX_BATCH),
            "visibility": check_positive_seconds(visibility, "visibility"),
        }
        reply = _reply_map(await self._call("lease", payload), "lease", ("leases",))
        return [lease_from_wire(x) for x in check_list(reply["leases"], "leases", 0, MAX_BATCH)]

    async def settle(self, outcomes: Sequence[Outcome]) -> list[bool]:
        """Apply acks and retries in one event; for each, False if its lease was stale."""
        if not isinstance(outcomes, Sequence):
            raise ValueError("outcomes must be a list of Ack or Retry")
        if len(outcomes) > MAX_BATCH:
            raise ValueError(f"settle takes at most {MAX_BATCH} outcomes")
        for o in outcomes:
            if not isinstance(o, Ack | Retry):
                raise ValueError(f"an outcome must be Ack or Retry, not {type(o).__name__}")
        if not outcomes:
            return []
        payload = {"outcomes": [outcome_to_wire(o) for o in outcomes]}
        reply = _reply_map(await self._call("settle", payload), "settle", ("results",))
        results = reply["results"]
        if not isinstance(results, list) or len(results) != len(outcomes):
            raise ValueError("queue answered settle with a malformed reply")
        return [r is True for r in results]

    async def ack(self, id: int, attempt: int) -> bool:
        """Delete the message if ``(id, attempt)`` is its current lease; False if stale."""
        return (await self.settle([Ack(id, attempt)]))[0]

    async def retry(
        self, id: int, attempt: int, delay: float | None = None, error: str | None = None
    ) -> bool:
        """Make the message visible after ``delay`` (None: backoff); False if stale."""
        return (await self.settle([Retry(id, attempt, delay, error)]))[0]

    async def extend(self, id: int, attempt: int, visibility: float) -> bool:
        """Heartbeat: the current lease now ends ``visibility`` seconds from now."""
        payload = {
            "id": check_id(id),
            "attempt": check_attempt(attempt),
            "visibility": check_positive_seconds(visibility, "visibility"),
        }
        reply = _reply_map(await self._call("extend", payload), "extend", ("ok",))
        return reply["ok"] is True

    async def cancel(self, id: int) -> bool:
        """Delete a message in any live state (durably); False if there is none."""
        reply = _reply_map(await self._call("cancel", {"id": check_id(id)}), "cancel", ("ok",))
        return reply["ok"] is True

    async def get(self, id: int) -> Job | None:
        """The message (live or dead) with this id, or None."""
        reply = _reply_map(await self._call("get", {"id": check_id(id)}), "get", ("job",))
        job = reply["job"]
        if job is None:
            return None
        return _build(Job, job, "get")

    async def stats(self) -> Stats:
        """Counts by state and the age of the oldest ready message."""
        return _build(Stats, await self._call("stats", {}), "stats")

    async def dead_letters(self, limit: int = 100, after: int | None = None) -> list[DeadLetter]:
        """Dead letters in id order, starting after id ``after``."""
        payload = {
            "limit": check_int(limit, "limit", 1, MAX_BATCH),
            "after": None if after is None else check_int(after, "after", 0, MAX_ID),
        }
        reply = _reply_map(await self._call("dead_letters", payload), "dead_letters", ("items",))
        items = check_list(reply["items"], "items", 0, MAX_BATCH)
        return [_build(DeadLetter, x, "dead_letters") for x in items]

    async def redrive(self, ids: Sequence[int] | None = None) -> int:
        """Move dead letters (all, or those ``ids``) back to ready, as new messages with new
        ids and no attempts. The number moved."""
        payload = {"ids": None if ids is None else check_ids(list(ids))}
        reply = _reply_map(await self._call("redrive", payload), "redrive", ("count",))
        return check_int(reply["count"], "count", 0, MAX_ID)

    async def configure(self, config: Config) -> None:
        """Store ``config`` durably in the queue (and arm push delivery if it names a consumer)."""
        if not isinstance(config, Config):
            raise ValueError(f"configure takes an ak.queue.Config, not {type(config).__name__}")
        await self._call("configure", {"config": config.to_wire()})

    async def config(self) -> Config:
        """The queue's current settings."""
        reply = _reply_map(await self._call("config", {}), "config", ("config",))
        return Config.from_wire(reply["config"])


# -- the consumer side -------------------------------------------------------------------------

Handler = Callable[[Lease], Awaitable[RetryLater | None] | RetryLater | None]


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
    records the error; returning ``RetryLater(delay)`` retries it after ``delay``. A request
    from outside (no caller) gets 403, and so does a queue not in ``queues`` when given.
    A bad frame gets 400. The handler must not call the queue that delivers (``ReentryError``).
    """
    if request.caller is None:
        return error_response(403, "Forbidden", "deliveries come from queue actors only")
    if queues is not None and request.caller not in set(queues):
        return error_response(403, "Forbidden", f"{request.caller!r} may not deliver here")
    try:
        _, messages = decode_deliver(request.body)
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
            outcomes.append(outcome_to_wire(Retry(msg.id, msg.attempt, None, _error_text(exc))))
            continue
        if isinstance(result, RetryLater):
            outcomes.append(outcome_to_wire(Retry(msg.id, msg.attempt, result.delay)))
        else:
            outcomes.append(outcome_to_wire(Ack(msg.id, msg.attempt)))
    body = codec.pack({"outcomes": outcomes})
    return Response(200, Headers._from_lower(dict(MSGPACK_HEADERS)), body)


S = TypeVar("S")
MethodHandler = Callable[[S, Lease], Awaitable[RetryLater | None]]
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


def parse_reply(resp_body: bytes) -> list[Outcome]:
    """The outcomes in a consumer's reply to a delivery; ``ValueError`` if malformed."""
    m = check_map(decode_frame(resp_body), "reply", {"outcomes"}, ("outcomes",))
    return outcomes_from_wire(m["outcomes"])
