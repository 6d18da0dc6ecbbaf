"""The lease order: which visible messages a lease takes (highest ``priority`` first, then
oldest ``visible_at``, then id, among those that may be leased: ``blocked = 0``), and when the
first one is or will be visible (push delivery's next due time).

Both walk the lease index (``actorkeep_queue_heads``: priority DESC, visible_at, id) with
seeks, one or two per priority present. Read in its order instead, the index puts every entry
not yet visible (a delayed message, a lease running) before the next priority's, so a lease
that found fewer visible messages than it asked for passed all of them: 6 ms per lease with
100,000 delayed messages and none ready (decision 0024).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from actorkeep import Sql
from actorkeep.wire.queue_checks import MAX_PRIORITY, MIN_PRIORITY

#: The first entry of the lease index at or below a priority: that priority's first message.
_FIRST = (
    "SELECT priority, visible_at FROM actorkeep_queue INDEXED BY actorkeep_queue_heads "
    "WHERE blocked = 0 AND priority <= ? ORDER BY priority DESC, visible_at LIMIT 1"
)
#: What a lease reads of each message it takes.
_COLUMNS = "id, attempts, body, enqueued_at, key, grp"
#: Never leased: a message past its expiry or out of attempts (the queue's, ``?``, or its
#: own), which a sweep capped at ``SWEEP_BATCH`` may have left for the next.
_LIVE = "AND (expires_at IS NULL OR expires_at > ?) AND attempts < COALESCE(max_attempts, ?)"
#: The visible messages of one priority, in lease order: a range of the index. (With an index
#: on (blocked, visible_at) beside it, SQLite's planner once took that one and sorted every
#: visible message at each lease; tests/test_queue_features.py checks the plan.)
LEASE_SQL = (
    f"SELECT {_COLUMNS} FROM actorkeep_queue INDEXED BY actorkeep_queue_heads "
    f"WHERE blocked = 0 AND priority = ? AND visible_at <= ? {_LIVE} "
    "ORDER BY visible_at, id LIMIT ?"
)
#: Past ``SEEKS`` priorities: the rest of the index, read in its order.
_LEASE_BELOW = (
    f"SELECT {_COLUMNS} FROM actorkeep_queue INDEXED BY actorkeep_queue_heads "
    f"WHERE blocked = 0 AND priority <= ? AND visible_at <= ? {_LIVE} "
    "ORDER BY priority DESC, visible_at, id LIMIT ?"
)
#: Priorities sought one by one; past them, the index is read in order.
SEEKS = 64


def _first_of_each_priority(sql: Sql) -> Iterator[tuple[int, float | None]]:
    """``(priority, visible_at of its first message)`` for each priority present, highest
    first, one seek each; past ``SEEKS`` of them, one last ``(priority, None)``: the priorities
    at or below it, not sought."""
    priority = MAX_PRIORITY
    for _ in range(SEEKS):
        row = sql.exec(_FIRST, (priority,)).fetchone()
        if row is None:
            return
        priority, visible_at = row
        yield priority, visible_at
        if priority == MIN_PRIORITY:
            return
        priority -= 1
    yield priority, None


def leasable(sql: Sql, now: float, n: int, max_attempts: int) -> list[Any]:
    """Up to ``n`` messages a lease at ``now`` takes, in lease order, none expired or out of
    attempts (``max_attempts``: the queue's): ``(id, attempts, body, enqueued_at, key, grp)``
    each."""
    rows: list[Any] = []
    if n <= 0:
        return rows
    for priority, first in _first_of_each_priority(sql):
        params = (priority, now, now, max_attempts, n - len(rows))
        if first is None:
            rows += sql.exec(_LEASE_BELOW, params).fetchall()
        elif first <= now:
            rows += sql.exec(LEASE_SQL, params).fetchall()
        if len(rows) >= n:
            break
    return rows


def earliest_head(sql: Sql) -> float | None:
    """The earliest ``visible_at`` of a message that may be leased: the first of each priority
    in the lease index. (An index of its own would cost every send, lease, ack and group
    promotion one more entry to write.)"""
    best: float | None = None
    for priority, first in _first_of_each_priority(sql):
        if first is None:
            (first,) = sql.exec(
                "SELECT MIN(visible_at) FROM actorkeep_queue INDEXED BY actorkeep_queue_heads "
                "WHERE blocked = 0 AND priority <= ?",
                (priority,),
            ).fetchone()
            if first is None:
                break
        best = first if best is None else min(best, first)
    return best


__all__ = ["LEASE_SQL", "SEEKS", "earliest_head", "leasable"]
