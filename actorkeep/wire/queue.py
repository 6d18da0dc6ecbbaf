"""The protocol between ``ak.queue.Client`` and ``queues.Queue``, and push delivery's frames.

``POST /actorkeep-queue/v1/<op>``. Its limits, the values its frames carry and the checks of
each field live here, once; a bad frame is a 400 (docs/reference.md lists every operation).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from ..address import split_address
from . import REQUIRED, Protocol

# -- limits ------------------------------------------------------------------------------------

MAX_BATCH: Final = 1_000  # messages per send_batch, leases per lease(), outcomes per settle()
MAX_BODY: Final = 1 << 20  # bytes per message body
MAX_BATCH_BYTES: Final = 16 << 20  # bytes of bodies per send_batch
MAX_SECONDS: Final = 1e9  # longest delay, visibility, backoff or retention (about 31 years)
MAX_ERROR: Final = 4096  # characters of a recorded error
MIN_PRIORITY: Final = -(2**31)
MAX_PRIORITY: Final = 2**31 - 1
MAX_ID: Final = 2**63 - 1
MAX_ATTEMPTS: Final = 1_000_000
#: The shortest visibility or backoff: shorter spans vanish in ``now + span`` (a subnormal
#: visibility would make a lease visible again at once).
MIN_SPAN: Final = 0.001

State = Literal["ready", "delayed", "leased", "dead"]

# -- field checks ------------------------------------------------------------------------------


def _is_number(v: object) -> bool:
    return (type(v) is int or type(v) is float) and math.isfinite(v)


def check_int(v: object, name: str, lo: int, hi: int) -> int:
    if type(v) is not int:
        raise ValueError(f"{name} must be an int, not {type(v).__name__}")
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
    if isinstance(v, bytes | bytearray | str) or not isinstance(v, Sequence):
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
    v: object, name: str, allowed: Iterable[str], required: Iterable[str] = ()
) -> dict[str, Any]:
    """A map with string keys, only ``allowed`` ones, all ``required`` ones present."""
    if not isinstance(v, dict):
        raise ValueError(f"{name} must be a map, not {type(v).__name__}")
    allowed = frozenset(allowed)
    extra = [k for k in v if k not in allowed]
    if extra:
        raise ValueError(f"{name}: unexpected field(s): {', '.join(sorted(map(repr, extra)))}")
    missing = [k for k in required if k not in v]
    if missing:
        raise ValueError(f"{name}: missing field(s): {', '.join(missing)}")
    return v


def check_ids(v: object) -> list[int]:
    return [check_id(i, "each id") for i in check_list(v, "ids", 1, MAX_BATCH)]


def check_queue_address(v: object) -> str:
    address = check_str(v, "queue", 300)
    split_address(address)
    return address


# -- the values frames carry -------------------------------------------------------------------


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
    raise ValueError(f"outcome: op must be 'ack' or 'retry', not {op!r}")


def outcomes_from_wire(v: object, least: int = 0) -> list[Outcome]:
    return [outcome_from_wire(o) for o in check_list(v, "outcomes", least, MAX_BATCH)]


def lease_to_wire(lease: Lease) -> list[Any]:
    return [lease.id, lease.attempt, lease.body, lease.enqueued_at]


def lease_from_wire(v: object) -> Lease:
    if not isinstance(v, list) or len(v) != 4:
        raise ValueError("a lease is [id, attempt, body, enqueued_at]")
    i, attempt, body, enqueued_at = v
    if not isinstance(body, bytes) or not _is_number(enqueued_at):
        raise ValueError("a lease is [id, attempt, body, enqueued_at]")
    return Lease(check_id(i), check_attempt(attempt), body, float(enqueued_at))


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
    },
    reply={"ids": check_ids},
)
LEASE: Final = QUEUE.op(
    "lease",
    {"max": (_max, REQUIRED), "visibility": (_visibility, REQUIRED)},
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
