"""One actor's alarm as its database stores it (``actorkeep_alarm``, one row), and the retry
delays of a failing alarm handler."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .storage import Database

ACTOR_TABLE = "actorkeep_alarm"
MAX_RETRIES = 6
FIRST_RETRY_DELAY = 2.0
#: An alarm event that fails before its handler runs (storage) is tried again after 2 s,
#: doubling up to this.
MAX_STORAGE_RETRY_DELAY = 300.0


def retry_delay(retry_count: int) -> float:
    """Delay before retry number ``retry_count + 1``: 2 s, doubling."""
    return FIRST_RETRY_DELAY * 2.0**retry_count


#: An alarm event refused for a while (``Overloaded``: in a cluster, the store unreachable or
#: the actor not served here yet; ``OutcomeUnknown``: a commit's answer lost) is tried again
#: after 0.1 s, doubling up to the refusal's ``retry_after``.
FIRST_TRANSIENT_RETRY_DELAY = 0.1


def storage_retry_delay(failures: int) -> float:
    """Delay after the ``failures``-th failure in a row of an alarm event outside its handler."""
    return min(MAX_STORAGE_RETRY_DELAY, FIRST_RETRY_DELAY * 2.0 ** min(failures - 1, 16))


def transient_retry_delay(failures: int, retry_after: float) -> float:
    """Delay after the ``failures``-th refusal in a row of an alarm event outside its handler,
    the refusal asking to come back after ``retry_after`` seconds."""
    return min(retry_after, FIRST_TRANSIENT_RETRY_DELAY * 2.0 ** min(failures - 1, 16))


@dataclass(frozen=True, slots=True)
class AlarmState:
    """An actor's alarm as stored in its database."""

    at: float
    scheduled_at: float
    retry_count: int


def read_alarm(conn: Any) -> AlarmState | None:
    """The alarm row of an actor's database, if it has one."""
    has_table = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (ACTOR_TABLE,)
    ).fetchone()
    if not has_table:
        return None
    row = conn.execute(
        f"SELECT at, scheduled_at, retry_count FROM {ACTOR_TABLE} WHERE id = 0"
    ).fetchone()
    return AlarmState(*row) if row is not None else None


def write_alarm_row(db: Database, state: AlarmState) -> None:
    db.conn.execute(
        f"CREATE TABLE IF NOT EXISTS {ACTOR_TABLE} (id INTEGER PRIMARY KEY CHECK (id = 0), "
        "at REAL NOT NULL, scheduled_at REAL NOT NULL, retry_count INTEGER NOT NULL)"
    )
    db.conn.execute(
        f"INSERT OR REPLACE INTO {ACTOR_TABLE} (id, at, scheduled_at, retry_count) "
        "VALUES (0, ?, ?, ?)",
        (state.at, state.scheduled_at, state.retry_count),
    )
