"""Recurring sends declared with a queue: ``app.mount(queues.Queue, "queue",
recurring={"reports": [Recurring("nightly", "0 3 * * *", b"run")]})`` (docs/queues.md).

Each is a schedule of the queue actor (actorkeep.schedules) whose run sends the message and
records the occurrence it sent in the same transaction (``actorkeep_queue_recurring``): a run
repeated after a crash finds its occurrence sent and sends nothing, so each occurrence is sent
exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass

from actorkeep import Missed, next_cron
from actorkeep.wire.queue import RECURRING_PREFIX
from actorkeep.wire.queue_checks import (
    MAX_NAME,
    check_body,
    check_message_key,
    check_priority,
    check_str,
)


@dataclass(frozen=True, slots=True)
class Recurring:
    """A message sent at every occurrence of ``cron`` in ``tz``, named by ``key`` (unique per
    queue). ``missed`` as for schedules; ``group`` and ``priority`` as for a send."""

    key: str
    cron: str
    body: bytes
    tz: str = "UTC"
    missed: Missed = "once"
    priority: int = 0
    group: str | None = None

    def __post_init__(self) -> None:
        if not check_str(self.key, "key", MAX_NAME - len(RECURRING_PREFIX)):
            raise ValueError("a recurring send's key must not be empty")
        next_cron(self.cron, self.tz, 0.0)  # ValueError for a bad expression or zone
        check_body(self.body)
        if self.missed not in ("once", "each", "skip"):
            raise ValueError(f"missed must be 'once', 'each' or 'skip', not {self.missed!r}")
        check_priority(self.priority)
        check_message_key(self.group, "group")


def check_recurring(value: object) -> dict[str, tuple[Recurring, ...]]:
    """The ``recurring`` option of a mount: queue names to lists of ``Recurring``."""
    if not isinstance(value, dict):
        raise TypeError("recurring maps queue names to lists of queues.Recurring")
    out: dict[str, tuple[Recurring, ...]] = {}
    for name, items in value.items():
        if not isinstance(name, str) or not isinstance(items, list | tuple):
            raise TypeError("recurring maps queue names to lists of queues.Recurring")
        if not all(isinstance(r, Recurring) for r in items):
            raise TypeError("recurring maps queue names to lists of queues.Recurring")
        keys = [r.key for r in items]
        if len(set(keys)) != len(keys):
            raise ValueError(f"recurring sends of queue {name!r} repeat a key")
        out[name] = tuple(items)
    return out


__all__ = ["RECURRING_PREFIX", "Recurring", "check_recurring"]
