"""Sends: one multi-row INSERT. A keyed batch is tried first as new messages (the unique index
of live keys refuses a duplicate, and the failed INSERT changes nothing); otherwise the batch's
keys and groups are looked up in the same transaction, so that a batch is all or nothing and a
key is checked against the messages of the same batch too (docs/queues.md)."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from actorkeep import Sql
from actorkeep.wire.queue import OnDuplicate


@dataclass(frozen=True, slots=True)
class SendOptions:
    """What a send carries besides its bodies, delay and priority (``wire.queue.SEND``)."""

    keys: list[str | None] | None = None
    groups: list[str | None] | None = None
    on_duplicate: OnDuplicate = "keep"
    remember: float | None = None
    expires: float | None = None
    max_attempts: int | None = None

    @classmethod
    def from_frame(cls, a: dict[str, Any]) -> SendOptions:
        return cls(
            a["keys"],
            a["groups"],
            a["on_duplicate"],
            a["remember"],
            a["expires"],
            a["max_attempts"],
        )


PLAIN = SendOptions()

_COLUMNS = (
    "body, enqueued_at, visible_at, priority, key, grp, blocked, expires_at, max_attempts, remember"
)
_ROW = "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"


@dataclass(slots=True)
class Sent:
    """The ids of a send in the order of its bodies, and how many were new messages."""

    ids: list[int]
    new: int


def insert(
    sql: Sql,
    now: float,
    bodies: list[bytes],
    delay: float,
    priority: int,
    opts: SendOptions,
    expire: Callable[[int], None] | None = None,
) -> Sent:
    """Queue ``bodies`` in a gated write (the caller's transaction, if one is open).
    ``expire(id)`` dead-letters a message whose key a send matched but whose time is up."""
    visible_at = now + delay
    expires_at = None if opts.expires is None else now + opts.expires
    extra = (expires_at, opts.max_attempts, opts.remember)
    if opts.keys is None and opts.groups is None:
        return Sent(
            _insert_rows(
                sql, [(b, None, None, 0) for b in bodies], now, visible_at, priority, extra, True
            ),
            len(bodies),
        )
    keys = opts.keys or [None] * len(bodies)
    groups = opts.groups or [None] * len(bodies)
    with contextlib.nullcontext() if sql.in_transaction else sql.transaction(durable=True):
        if opts.keys is not None and not _remembering(sql):
            # Most keyed sends find no message with their key: try them as new messages, and
            # let the unique index say otherwise (the failed INSERT changes nothing).
            seen = _live_groups(sql, {g for g in groups if g is not None})
            fresh = []
            for body, key, group in zip(bodies, keys, groups, strict=True):
                fresh.append((body, key, group, int(group is not None and group in seen)))
                if group is not None:
                    seen.add(group)
            try:
                ids = _insert_rows(sql, fresh, now, visible_at, priority, extra, False)
            except sqlite3.IntegrityError:
                pass  # a key is live, or twice in the batch: the general path
            else:
                return Sent(ids, len(fresh))
        # Two lookups for the whole batch, then one INSERT. (The groups again: an expired
        # message the key lookup dead-letters may have been its group's last.)
        found = _existing(sql, now, {k for k in keys if k is not None}, expire)
        live_groups = _live_groups(sql, {g for g in groups if g is not None})
        answers: list[int] = []  # per body: the id it answers, or -1 - i for new row i
        rows: list[tuple[bytes, str | None, str | None, int]] = []
        pending: dict[str, int] = {}  # key -> its new row in this batch
        for body, key, group in zip(bodies, keys, groups, strict=True):
            if key is not None:
                if key in pending:  # sent earlier in this batch
                    if opts.on_duplicate == "replace":
                        k = pending[key]
                        rows[k] = (body, *rows[k][1:])
                    answers.append(-1 - pending[key])
                    continue
                hit = found.get(key)
                if hit is not None:
                    id_, replaceable = hit
                    if opts.on_duplicate == "replace" and replaceable:
                        sql.exec(
                            "UPDATE actorkeep_queue SET body = ?, "
                            "visible_at = MAX(visible_at, ?) WHERE id = ?",
                            (body, visible_at, id_),
                        )
                    answers.append(id_)
                    continue
                pending[key] = len(rows)
            blocked = 0
            if group is not None:
                blocked = int(group in live_groups)
                live_groups.add(group)
            answers.append(-1 - len(rows))
            rows.append((body, key, group, blocked))
        ids = _insert_rows(sql, rows, now, visible_at, priority, extra, False) if rows else []
    # a new row's answer is ``-1 - its index``
    return Sent([a if a >= 0 else ids[-1 - a] for a in answers], len(rows))


def _insert_rows(
    sql: Sql,
    rows: list[tuple[bytes, str | None, str | None, int]],
    now: float,
    visible_at: float,
    priority: int,
    extra: tuple[float | None, int | None, float | None],
    durable: bool,
) -> list[int]:
    """One multi-row INSERT of ``(body, key, group, blocked)`` rows; their ids in row order."""
    params: list[Any] = []
    for body, key, group, blocked in rows:
        params += (body, now, visible_at, priority, key, group, blocked, *extra)
    statement = (
        f"INSERT INTO actorkeep_queue ({_COLUMNS}) VALUES "
        + ",".join([_ROW] * len(rows))
        + " RETURNING id"
    )
    if durable:
        written = sql.exec(statement, params, durable=True).rows
    else:
        written = sql.exec(statement, params).fetchall()
    # One statement by one writer: the ids are consecutive, in the order of the rows.
    return sorted(r[0] for r in written)


def _existing(
    sql: Sql, now: float, keys: set[str], expire: Callable[[int], None] | None
) -> dict[str, tuple[int, bool]]:
    """For each of ``keys`` a send answers without queueing a message: the id of the live
    message with that key and whether a replace may rewrite it (it is not leased), or the id
    of the acked one whose key is still remembered (not replaceable)."""
    if not keys:
        return {}
    marks = ",".join("?" * len(keys))
    found: dict[str, tuple[int, bool]] = {}
    for key, id_, leased, current, expires_at in sql.exec(
        "SELECT key, id, leased, visible_at, expires_at FROM actorkeep_queue "
        f"WHERE key IN ({marks})",
        tuple(keys),
    ).fetchall():
        if expires_at is not None and expires_at <= now and expire is not None:
            expire(id_)  # expired, not swept yet: it holds its key no longer
            continue
        found[key] = (int(id_), not (leased and current > now))
    rest = tuple(keys - found.keys())
    if rest:
        for key, id_ in sql.exec(
            f"SELECT key, id FROM actorkeep_queue_keys WHERE until > ? AND key IN "
            f"({','.join('?' * len(rest))})",
            (now, *rest),
        ).fetchall():
            found[key] = (int(id_), False)
    return found


def _remembering(sql: Sql) -> bool:
    """Whether the queue remembers keys of acked messages (``send(..., remember=...)``)."""
    return sql.exec("SELECT 1 FROM actorkeep_queue_keys LIMIT 1").fetchone() is not None


def _live_groups(sql: Sql, groups: set[str]) -> set[str]:
    """Those of ``groups`` that have a live message (one index seek each, however many
    messages a group holds)."""
    live: set[str] = set()
    names = sorted(groups)
    for at in range(0, len(names), _CHUNK):
        chunk = names[at : at + _CHUNK]
        rows = sql.exec(
            f"WITH g(name) AS (VALUES {_rows(len(chunk))}) SELECT name FROM g "
            "WHERE EXISTS (SELECT 1 FROM actorkeep_queue WHERE grp = g.name)",
            tuple(chunk),
        ).fetchall()
        live.update(r[0] for r in rows)
    return live


def promote(sql: Sql, now: float, groups: set[str]) -> None:
    """After messages of ``groups`` left the queue: each group's lowest id becomes its head,
    leasable from now (or from its own delay), behind the heads that were ready before it.
    One index seek per group: a ``MIN(id) ... WHERE grp IN (...) GROUP BY grp`` read every
    message of each group, and a group of 100,000 made each ack cost 10 ms."""
    names = sorted(groups)
    for at in range(0, len(names), _CHUNK):
        chunk = names[at : at + _CHUNK]
        sql.exec(
            "UPDATE actorkeep_queue SET blocked = 0, visible_at = MAX(visible_at, ?) "
            # ``+blocked``: find the heads by id, not by scanning every blocked message
            f"WHERE +blocked = 1 AND id IN (WITH g(name) AS (VALUES {_rows(len(chunk))}) "
            "SELECT (SELECT MIN(id) FROM actorkeep_queue WHERE grp = g.name) FROM g)",
            (now, *chunk),
        )


def _rows(n: int) -> str:
    """``(?),(?),...``: ``n`` rows of one parameter, for a ``VALUES`` list."""
    return ",".join(["(?)"] * n)


#: Groups per statement of ``promote`` and ``_live_groups`` (SQLite binds at most 32,766
#: parameters).
_CHUNK = 500


__all__ = ["PLAIN", "SendOptions", "Sent", "insert", "promote"]
