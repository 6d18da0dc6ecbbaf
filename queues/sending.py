"""Sends: one multi-row INSERT. A keyed batch is tried first as new messages (the unique index
of live keys refuses a duplicate, and the failed INSERT changes nothing); otherwise the batch's
keys are looked up in the same transaction, so that a batch is all or nothing and a key is
checked against the messages of the same batch too (docs/queues.md). Grouped messages join
the ends of their groups (groups.py)."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from actorkeep import Sql
from actorkeep.wire.queue import OnDuplicate

from .groups import check_ids, link, next_id, set_tails


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
    "body, enqueued_at, visible_at, priority, key, grp, blocked, prev, expires_at, max_attempts, "
    "remember"
)
_ROW = "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"

#: A message to insert: its body, key and group.
Row = tuple[bytes, str | None, str | None]


@dataclass(slots=True)
class Sent:
    """The ids of a send in the order of its bodies, and how many were new messages."""

    ids: list[int]
    new: int


class Sweeper(Protocol):
    """How a send dead-letters a message holding a key it matched whose time or attempts are
    up (the queue's sweep moves at most ``SWEEP_BATCH`` an event)."""

    @property
    def max_attempts(self) -> int:
        """The queue's: a message without its own is out of attempts past it."""

    def expired(self, id_: int) -> None: ...

    def out_of_attempts(self, id_: int) -> None: ...


def insert(
    sql: Sql,
    now: float,
    bodies: list[bytes],
    delay: float,
    priority: int,
    opts: SendOptions,
    sweeper: Sweeper | None = None,
) -> Sent:
    """Queue ``bodies`` in a gated write (the caller's transaction, if one is open).
    ``sweeper`` dead-letters a message whose key a send matched but whose time or attempts are
    up, which a sweep has not reached yet."""
    visible_at = now + delay
    expires_at = None if opts.expires is None else now + opts.expires
    extra = (expires_at, opts.max_attempts, opts.remember)
    if opts.keys is None and opts.groups is None:
        rows: list[Row] = [(b, None, None) for b in bodies]
        ids = _insert_rows(sql, rows, now, visible_at, priority, extra, durable=True)
        return Sent(ids, len(bodies))
    keys = opts.keys or [None] * len(bodies)
    groups = opts.groups or [None] * len(bodies)
    grouped = opts.groups is not None
    # Most keyed sends find no message with their key: try them as new messages first, and let
    # the unique index say otherwise (the failed INSERT changes nothing).
    try_new = opts.keys is not None and not _remembering(sql)
    tried = list(zip(bodies, keys, groups, strict=True)) if try_new else []
    if try_new and not grouped and not sql.in_transaction:
        # One statement that commits by itself, as a plain send (no transaction around it).
        new = _unless_refused(
            lambda: _insert_rows(sql, tried, now, visible_at, priority, extra, durable=True)
        )
        if new is not None:
            return Sent(new, len(tried))
        try_new = False  # refused: the general way
    with contextlib.nullcontext() if sql.in_transaction else sql.transaction(durable=True):
        if try_new:
            new = _unless_refused(
                lambda: _insert_rows(sql, tried, now, visible_at, priority, extra, grouped=grouped)
            )
            if new is not None:
                return Sent(new, len(tried))
        # One lookup of the batch's keys, then one INSERT.
        found = _existing(sql, now, {k for k in keys if k is not None}, sweeper)
        answers: list[int] = []  # per body: the id it answers, or -1 - i for new row i
        rows = []
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
            answers.append(-1 - len(rows))
            rows.append((body, key, group))
        ids = (
            _insert_rows(sql, rows, now, visible_at, priority, extra, grouped=grouped)
            if rows
            else []
        )
    # a new row's answer is ``-1 - its index``
    return Sent([a if a >= 0 else ids[-1 - a] for a in answers], len(rows))


def _unless_refused(insert: Callable[[], list[int]]) -> list[int] | None:
    """``insert()``'s ids, or None if the unique index of live keys refused it (a key is live,
    or twice in the batch): the failed INSERT changes nothing."""
    try:
        return insert()
    except sqlite3.IntegrityError:
        return None


def _insert_rows(
    sql: Sql,
    rows: list[Row],
    now: float,
    visible_at: float,
    priority: int,
    extra: tuple[float | None, int | None, float | None],
    durable: bool = False,
    grouped: bool = False,
) -> list[int]:
    """One multi-row INSERT of ``rows``, each grouped one at the end of its group (inside a
    transaction if ``grouped``); their ids in row order."""
    params: list[Any] = []
    if grouped:
        first = next_id(sql)
        prevs, new_tails = link(sql, [group for _, _, group in rows], first)
        for (body, key, group), prev in zip(rows, prevs, strict=True):
            params += (body, now, visible_at, priority, key, group, prev is not None, prev, *extra)
    else:
        for body, key, group in rows:
            params += (body, now, visible_at, priority, key, group, 0, None, *extra)
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
    ids = sorted(r[0] for r in written)
    if grouped:
        check_ids(ids, first, len(rows))
        set_tails(sql, new_tails)
    return ids


def _existing(
    sql: Sql, now: float, keys: set[str], sweeper: Sweeper | None
) -> dict[str, tuple[int, bool]]:
    """For each of ``keys`` a send answers without queueing a message: the id of the live
    message with that key and whether a replace may rewrite it (it is not leased), or the id
    of the acked one whose key is still remembered (not replaceable)."""
    if not keys:
        return {}
    marks = ",".join("?" * len(keys))
    found: dict[str, tuple[int, bool]] = {}
    for key, id_, leased, current, expires_at, attempts, own_max in sql.exec(
        "SELECT key, id, leased, visible_at, expires_at, attempts, max_attempts "
        f"FROM actorkeep_queue WHERE key IN ({marks})",
        tuple(keys),
    ).fetchall():
        if sweeper is not None:
            # Not swept yet, it holds its key no longer.
            if expires_at is not None and expires_at <= now:
                sweeper.expired(id_)
                continue
            if current <= now and attempts >= (own_max or sweeper.max_attempts):
                sweeper.out_of_attempts(id_)
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


__all__ = ["PLAIN", "Row", "SendOptions", "Sent", "Sweeper", "insert"]
