"""Sends: plain ones in one multi-row INSERT; keyed or grouped ones one message at a time in
one transaction, so that a batch is all or nothing and a key is checked against the messages
of the same batch too (docs/queues.md)."""

from __future__ import annotations

import contextlib
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
    if opts.keys is None and opts.groups is None:
        params: list[Any] = []
        for body in bodies:
            params += (body, now, visible_at, priority, None, None, 0, expires_at)
            params += (opts.max_attempts, None)
        written = sql.exec(
            f"INSERT INTO actorkeep_queue ({_COLUMNS}) VALUES "
            + ",".join([_ROW] * len(bodies))
            + " RETURNING id",
            params,
            durable=True,
        )
        # One statement by one writer: the ids are consecutive, in the order of the rows.
        return Sent(sorted(r[0] for r in written.rows), len(bodies))
    exec_ = sql.exec
    keys = opts.keys or [None] * len(bodies)
    groups = opts.groups or [None] * len(bodies)
    live_groups: set[str] = set()
    extra = (opts.max_attempts, opts.remember)
    sent = Sent([], 0)
    with contextlib.nullcontext() if sql.in_transaction else sql.transaction(durable=True):
        for body, key, group in zip(bodies, keys, groups, strict=True):
            if key is not None:
                found = _existing(sql, now, key, body, visible_at, opts.on_duplicate, expire)
                if found is not None:
                    sent.ids.append(found)
                    continue
            blocked = 0
            if group is not None:
                if (
                    group in live_groups
                    or exec_(
                        "SELECT 1 FROM actorkeep_queue WHERE grp = ? LIMIT 1", (group,)
                    ).fetchone()
                ):
                    blocked = 1
                live_groups.add(group)
            (id_,) = exec_(
                f"INSERT INTO actorkeep_queue ({_COLUMNS}) VALUES {_ROW} RETURNING id",
                (body, now, visible_at, priority, key, group, blocked, expires_at, *extra),
            ).fetchone()
            sent.ids.append(id_)
            sent.new += 1
    return sent


def _existing(
    sql: Sql,
    now: float,
    key: str,
    body: bytes,
    visible_at: float,
    on_duplicate: OnDuplicate,
    expire: Callable[[int], None] | None,
) -> int | None:
    """The id a send with ``key`` answers without queueing a message: the live message with
    that key (its body replaced and its due time pushed back to ``visible_at`` if asked, and
    it is not leased), or the acked one whose key is still remembered. None: queue it."""
    row = sql.exec(
        "SELECT id, leased, visible_at, expires_at FROM actorkeep_queue WHERE key = ?", (key,)
    ).fetchone()
    if row is not None and row[3] is not None and row[3] <= now and expire is not None:
        expire(row[0])  # expired, not swept yet: it holds its key no longer
        row = None
    if row is not None:
        id_, leased, current, _ = row
        if on_duplicate == "replace" and not (leased and current > now):
            sql.exec(
                "UPDATE actorkeep_queue SET body = ?, visible_at = MAX(visible_at, ?) WHERE id = ?",
                (body, visible_at, id_),
            )
        return int(id_)
    remembered = sql.exec(
        "SELECT id FROM actorkeep_queue_keys WHERE key = ? AND until > ?", (key, now)
    ).fetchone()
    return None if remembered is None else int(remembered[0])


def promote(sql: Sql, now: float, groups: set[str]) -> None:
    """After messages of ``groups`` left the queue: each group's lowest id becomes its head,
    leasable from now (or from its own delay), behind the heads that were ready before it."""
    for group in groups:
        sql.exec(
            "UPDATE actorkeep_queue SET blocked = 0, visible_at = MAX(visible_at, ?) "
            "WHERE id = (SELECT MIN(id) FROM actorkeep_queue WHERE grp = ?) AND blocked = 1",
            (now, group),
        )


__all__ = ["PLAIN", "SendOptions", "Sent", "insert", "promote"]
