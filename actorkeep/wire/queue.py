"""The protocol between ``ak.queue.Client`` and ``queues.Queue``, and push delivery's frames.

``POST /actorkeep-queue/v1/<op>``. Its limits, the values its frames carry and the checks of
each field live here, once; a bad frame is a 400 (docs/reference.md lists every operation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

from ..address import split_address
from . import REQUIRED, Protocol
from .queue_checks import (
    MAX_ATTEMPTS,
    MAX_BATCH,
    MAX_ERROR,
    MAX_ID,
    MAX_NAME,
    check_attempt,
    check_bodies,
    check_error,
    check_id,
    check_ids,
    check_int,
    check_list,
    check_map,
    check_message_key,
    check_positive_seconds,
    check_priority,
    check_queue_address,
    check_seconds,
    check_str,
    is_number,
)

State = Literal["ready", "delayed", "leased", "dead"]
#: What a send with the key of a live message does: keep that message (and answer its id), or
#: replace its body and push its due time back (debounce), unless it is leased.
OnDuplicate = Literal["keep", "replace"]

# -- the values frames carry -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Lease:
    """A leased message. ``(id, attempt)`` names the lease; ``attempt`` counts from 1.
    ``key`` and ``group`` are the ones it was sent with."""

    id: int
    attempt: int
    body: bytes
    enqueued_at: float
    key: str | None = None
    group: str | None = None


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


@dataclass(frozen=True, slots=True)
class Bury:
    """Outcome: dead-letter the message now, with ``reason``, whatever attempts it has left."""

    id: int
    attempt: int
    reason: str

    def __post_init__(self) -> None:
        check_id(self.id)
        check_attempt(self.attempt)
        if not check_str(self.reason, "reason", MAX_ERROR):
            raise ValueError("reason must not be empty")


Outcome = Ack | Retry | Bury


@dataclass(frozen=True, slots=True)
class Stats:
    """Message counts by state; ``oldest_ready_age``: seconds since the oldest ready message
    was enqueued (None when none is ready)."""

    ready: int
    delayed: int
    leased: int
    dead: int
    oldest_ready_age: float | None
    #: live messages sent with a key, and keys remembered after their message was acked
    keys: int = 0
    #: message groups with live messages
    groups: int = 0
    #: recurring sends declared with the queue
    schedules: int = 0


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message moved to the dead-letter table, with why."""

    id: int
    body: bytes
    enqueued_at: float
    attempts: int
    failed_at: float
    reason: str
    key: str | None = None
    group: str | None = None
    #: who held its last lease (``lease(worker=...)``)
    worker: str | None = None


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
    key: str | None = None
    group: str | None = None
    #: when it goes to the dead letters as "expired" if not done (None: never)
    expires_at: float | None = None
    #: leases it may have (its own, or the queue's)
    max_attempts: int | None = None
    #: who holds or last held its lease (``lease(worker=...)``)
    worker: str | None = None


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
        m = check_map(value, "config", CONFIG_FIELDS)
        if m.get("consumer") is not None:
            check_str(m["consumer"], "consumer", 1000)
        try:
            return cls(**m)
        except TypeError as exc:  # a value of the wrong type inside a comparison
            raise ValueError(f"config: {exc}") from None


#: The fields of a ``Config``, in the order of its stored columns.
CONFIG_FIELDS: Final = (
    "consumer",
    "batch_size",
    "visibility",
    "max_attempts",
    "backoff_base",
    "backoff_max",
    "dead_retention",
)

# -- values on the wire ------------------------------------------------------------------------


def outcome_to_wire(o: Outcome) -> dict[str, Any]:
    if isinstance(o, Ack):
        return {"id": o.id, "attempt": o.attempt, "op": "ack"}
    if isinstance(o, Bury):
        return {"id": o.id, "attempt": o.attempt, "op": "fail", "error": o.reason}
    return {
        "id": o.id,
        "attempt": o.attempt,
        "op": "retry",
        "delay": None if o.delay is None else float(o.delay),
        "error": o.error,
    }


def outcome_from_wire(v: object) -> Outcome:
    m = check_map(v, "outcome", ("id", "attempt", "op", "delay", "error"), ("id", "attempt", "op"))
    op = m["op"]
    if op == "ack":
        if "delay" in m or "error" in m:
            raise ValueError("outcome: an ack has no delay or error")
        return Ack(m["id"], m["attempt"])
    if op == "retry":
        return Retry(m["id"], m["attempt"], m.get("delay"), m.get("error"))
    if op == "fail":
        if "delay" in m or not isinstance(m.get("error"), str):
            raise ValueError("outcome: a fail has an error (its reason) and no delay")
        return Bury(m["id"], m["attempt"], m["error"])
    raise ValueError(f"outcome: op must be 'ack', 'retry' or 'fail', not {op!r}")


def outcomes_from_wire(v: object, least: int = 0) -> list[Outcome]:
    return [outcome_from_wire(o) for o in check_list(v, "outcomes", least, MAX_BATCH)]


def lease_to_wire(lease: Lease) -> list[Any]:
    if lease.key is None and lease.group is None:
        return [lease.id, lease.attempt, lease.body, lease.enqueued_at]
    return [lease.id, lease.attempt, lease.body, lease.enqueued_at, lease.key, lease.group]


_LEASE_SHAPE = "a lease is [id, attempt, body, enqueued_at] or [..., key, group]"


def lease_from_wire(v: object) -> Lease:
    if not isinstance(v, list) or len(v) not in (4, 6):
        raise ValueError(_LEASE_SHAPE)
    i, attempt, body, enqueued_at = v[:4]
    if not isinstance(body, bytes) or not is_number(enqueued_at):
        raise ValueError(_LEASE_SHAPE)
    key = group = None
    if len(v) == 6:
        key, group = check_message_key(v[4], "key"), check_message_key(v[5], "group")
    return Lease(check_id(i), check_attempt(attempt), body, float(enqueued_at), key, group)


def leases_from_wire(v: object) -> list[Lease]:
    return [lease_from_wire(x) for x in check_list(v, "leases", 0, MAX_BATCH)]


def _build(cls: type[Any], value: Any) -> Any:
    """A reply value (a map of fields, or a list of them in order) as ``cls``."""
    try:
        if isinstance(value, dict):
            return cls(**value)
        if isinstance(value, list):
            return cls(*value)
    except TypeError:
        pass
    raise ValueError(f"a {cls.__name__} is a map or a list of its fields")


# -- the operations ----------------------------------------------------------------------------


def _max(v: object) -> int:
    return check_int(v, "max", 1, MAX_BATCH)


def _limit(v: object) -> int:
    return check_int(v, "limit", 1, MAX_BATCH)


def _after(v: object) -> int:
    return 0 if v is None else check_int(v, "after", 0, MAX_ID)


def _visibility(v: object) -> float:
    return check_positive_seconds(v, "visibility")


def _delay(v: object) -> float:
    return check_seconds(v, "delay")


def _names(what: str) -> Any:
    def check(v: object) -> list[str | None] | None:
        if v is None:
            return None
        return [check_message_key(k, what) for k in check_list(v, f"{what}s", 1, MAX_BATCH)]

    return check


def _on_duplicate(v: object) -> OnDuplicate:
    if v not in ("keep", "replace"):
        raise ValueError(f"on_duplicate must be 'keep' or 'replace', not {v!r}")
    return v


def _optional_seconds(name: str) -> Any:
    def check(v: object) -> float | None:
        return None if v is None else check_positive_seconds(v, name)

    return check


def _optional_attempts(v: object) -> int | None:
    return None if v is None else check_int(v, "max_attempts", 1, MAX_ATTEMPTS)


def _worker(v: object) -> str | None:
    return None if v is None else check_str(v, "worker", MAX_NAME)


def _send_shape(frame: dict[str, Any], address: str = "") -> None:
    """The keys and groups of a send, one per body."""
    n = len(frame["bodies"])
    for name in ("keys", "groups"):
        if frame[name] is not None and len(frame[name]) != n:
            raise ValueError(f"send: {name} holds one entry per body ({n}), not {len(frame[name])}")


def _redrive_ids(v: object) -> list[int] | None:
    return None if v is None else check_ids(v)


def _outcomes(v: object) -> list[Outcome]:
    return outcomes_from_wire(v, least=1)


def _flags(v: object) -> list[bool]:
    return [r is True for r in check_list(v, "results", 0, MAX_BATCH)]


def _flag(v: object) -> bool:
    return v is True


def _job(v: object) -> Job | None:
    return None if v is None else _build(Job, v)


def _dead_letters(v: object) -> list[DeadLetter]:
    return [_build(DeadLetter, x) for x in check_list(v, "items", 0, MAX_BATCH)]


def _count(v: object, name: str) -> int:
    return check_int(v, name, 0, MAX_ID)


def _age(v: object) -> float | None:
    return None if v is None else check_seconds(v, "oldest_ready_age")


def _not_own_consumer(frame: dict[str, Any], address: str) -> None:
    if frame["config"].consumer == address:
        raise ValueError("a queue cannot be its own consumer")


QUEUE: Final = Protocol("actorkeep-queue", 1)

SEND: Final = QUEUE.op(
    "send",
    {
        "bodies": (check_bodies, REQUIRED),
        "delay": (_delay, 0.0),
        "priority": (check_priority, 0),
        "keys": (_names("key"), None),
        "groups": (_names("group"), None),
        "on_duplicate": (_on_duplicate, "keep"),
        "remember": (_optional_seconds("remember"), None),
        "expires": (_optional_seconds("expires"), None),
        "max_attempts": (_optional_attempts, None),
    },
    reply={"ids": check_ids},
    validate=_send_shape,
)
LEASE: Final = QUEUE.op(
    "lease",
    {
        "max": (_max, REQUIRED),
        "visibility": (_visibility, REQUIRED),
        "worker": (_worker, None),
    },
    reply={"leases": leases_from_wire},
)
SETTLE: Final = QUEUE.op("settle", {"outcomes": (_outcomes, REQUIRED)}, reply={"results": _flags})
EXTEND: Final = QUEUE.op(
    "extend",
    {
        "id": (check_id, REQUIRED),
        "attempt": (check_attempt, REQUIRED),
        "visibility": (_visibility, REQUIRED),
    },
    reply={"ok": _flag},
)
CANCEL: Final = QUEUE.op("cancel", {"id": (check_id, REQUIRED)}, reply={"ok": _flag})
GET: Final = QUEUE.op("get", {"id": (check_id, REQUIRED)}, reply={"job": _job})
STATS: Final = QUEUE.op(
    "stats",
    {},
    reply={
        "ready": lambda v: _count(v, "ready"),
        "delayed": lambda v: _count(v, "delayed"),
        "leased": lambda v: _count(v, "leased"),
        "dead": lambda v: _count(v, "dead"),
        "oldest_ready_age": _age,
        "keys": lambda v: _count(v, "keys"),
        "groups": lambda v: _count(v, "groups"),
        "schedules": lambda v: _count(v, "schedules"),
    },
    exact_reply=True,
)
DEAD_LETTERS: Final = QUEUE.op(
    "dead_letters",
    {"limit": (_limit, 100), "after": (_after, 0)},
    reply={"items": _dead_letters},
)
REDRIVE: Final = QUEUE.op(
    "redrive", {"ids": (_redrive_ids, None)}, reply={"count": lambda v: _count(v, "count")}
)
CONFIGURE: Final = QUEUE.op(
    "configure", {"config": (Config.from_wire, REQUIRED)}, validate=_not_own_consumer
)
CONFIG: Final = QUEUE.op("config", {}, reply={"config": Config.from_wire})

#: A push delivery, from a queue to its consumer; the reply holds one outcome per message.
DELIVER: Final = QUEUE.op(
    "deliver",
    {
        "queue": (check_queue_address, REQUIRED),
        "messages": (leases_from_wire, REQUIRED),
    },
    reply={"outcomes": outcomes_from_wire},
    exact_reply=True,
)
