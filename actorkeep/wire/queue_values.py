"""The values the queue protocol's frames carry (``actorkeep.wire.queue``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

from ..address import split_address
from .queue_checks import (
    MAX_ATTEMPTS,
    MAX_BATCH,
    MAX_ERROR,
    MAX_ID,
    MAX_RATE,
    check_attempt,
    check_error,
    check_id,
    check_int,
    check_map,
    check_positive_seconds,
    check_seconds,
    check_str,
    is_number,
)

State = Literal["ready", "delayed", "leased", "dead"]
#: What a send with the key of a live message does: keep that message (and answer its id), or
#: replace its body and push its due time back (debounce), unless it is leased.
OnDuplicate = Literal["keep", "replace"]
#: The prefix of the keys of a queue actor's schedules that stand for its recurring sends.
RECURRING_PREFIX: Final = "recurring:"

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
    ``max_in_flight``: messages leased at once at most, push and pull together (None: no
    limit). ``rate``: messages leased per second at most, an exact token bucket holding
    ``burst`` messages (by default one second's worth, at least 1); None: no limit.
    """

    consumer: str | None = None
    batch_size: int = 10
    visibility: float = 30.0
    max_attempts: int = 5
    backoff_base: float = 1.0
    backoff_max: float = 300.0
    dead_retention: float | None = None
    max_in_flight: int | None = None
    rate: float | None = None
    burst: int | None = None

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
        if self.max_in_flight is not None:
            check_int(self.max_in_flight, "max_in_flight", 1, MAX_ID)
        if self.rate is not None and not (is_number(self.rate) and 0 < self.rate <= MAX_RATE):
            raise ValueError(f"rate must be a number of messages per second in (0, {MAX_RATE:g}]")
        if self.burst is not None:
            if self.rate is None:
                raise ValueError("burst goes with rate")
            check_int(self.burst, "burst", 1, MAX_ID)

    @property
    def bucket(self) -> int:
        """The token bucket's size (with ``rate``)."""
        if self.burst is not None:
            return self.burst
        return max(1, int(self.rate or 1))

    def to_wire(self) -> dict[str, Any]:
        return {
            "consumer": self.consumer,
            "batch_size": self.batch_size,
            "visibility": float(self.visibility),
            "max_attempts": self.max_attempts,
            "backoff_base": float(self.backoff_base),
            "backoff_max": float(self.backoff_max),
            "dead_retention": None if self.dead_retention is None else float(self.dead_retention),
            "max_in_flight": self.max_in_flight,
            "rate": None if self.rate is None else float(self.rate),
            "burst": self.burst,
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
    "max_in_flight",
    "rate",
    "burst",
)
