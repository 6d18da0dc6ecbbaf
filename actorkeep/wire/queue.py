"""The protocol between ``ak.queue.Client`` and ``queues.Queue``, and push delivery's frames.

``POST /actorkeep-queue/v1/<op>``. Each operation's fields and their checks are declared here,
once; its limits and field checks are in ``queue_checks``, the values its frames carry in
``queue_values``. A bad frame is a 400 (docs/reference.md lists every operation).
"""

from __future__ import annotations

from typing import Any, Final

from . import REQUIRED, Protocol
from .queue_checks import (
    MAX_ATTEMPTS,
    MAX_BATCH,
    MAX_ID,
    MAX_NAME,
    check_attempt,
    check_bodies,
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
from .queue_values import (
    CONFIG_FIELDS,
    Ack,
    Bury,
    Config,
    DeadLetter,
    Job,
    Lease,
    OnDuplicate,
    Outcome,
    Retry,
    State,
    Stats,
)
from .queue_values import RECURRING_PREFIX as RECURRING_PREFIX

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


_OUTCOME_FIELDS = frozenset(("id", "attempt", "op", "delay", "error"))
_OUTCOME_REQUIRED = ("id", "attempt", "op")


def outcome_from_wire(v: object) -> Outcome:
    # An ack, the common case, without the general checks (Ack checks its own fields).
    if type(v) is dict and len(v) == 3 and v.get("op") == "ack" and "id" in v and "attempt" in v:
        return Ack(v["id"], v["attempt"])
    m = check_map(v, "outcome", _OUTCOME_FIELDS, _OUTCOME_REQUIRED)
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
        names = check_list(v, f"{what}s", 1, MAX_BATCH)
        for k in names:
            # the common case without a call (a key is checked on both sides of every send)
            if k is not None and not (type(k) is str and 0 < len(k) <= MAX_NAME and k.isascii()):
                check_message_key(k, what)
        return names

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

__all__ = [
    "CANCEL",
    "CONFIG",
    "CONFIGURE",
    "CONFIG_FIELDS",
    "DEAD_LETTERS",
    "DELIVER",
    "EXTEND",
    "GET",
    "LEASE",
    "QUEUE",
    "RECURRING_PREFIX",
    "REDRIVE",
    "SEND",
    "SETTLE",
    "STATS",
    "Ack",
    "Bury",
    "Config",
    "DeadLetter",
    "Job",
    "Lease",
    "OnDuplicate",
    "Outcome",
    "Retry",
    "State",
    "Stats",
    "lease_from_wire",
    "lease_to_wire",
    "leases_from_wire",
    "outcome_from_wire",
    "outcome_to_wire",
    "outcomes_from_wire",
]
