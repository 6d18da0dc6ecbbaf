"""Message groups as chains. Each grouped message names the live message before it in its
group (``prev``; none for the group's head, the only one that may be leased: ``blocked = 0``),
and ``actorkeep_queue_groups`` names each group's last live message (``tail``).

A send appends to its groups' tails; a message leaving hands its place to the one after it.
Both touch rows near the ids they add or remove, whatever the groups are called: an index of
(group, id) took an entry out at the group's place in name order at every ack, so a settle of
100 acks of groups named at random wrote about 100 of its pages (decision 0024).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from actorkeep import Sql

#: Groups (or removed messages) per statement (SQLite binds at most 32,766 parameters).
CHUNK = 500

#: One past the larger of the highest id ever used and the highest id in the table: the id an
#: INSERT into the AUTOINCREMENT table gives its first row (SQLite's documented rule).
_NEXT_ID = (
    "SELECT MAX(COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'actorkeep_queue'), 0), "
    "COALESCE((SELECT MAX(id) FROM actorkeep_queue), 0)) + 1"
)


def next_id(sql: Sql) -> int:
    """The id the next message inserted takes."""
    (first,) = sql.exec(_NEXT_ID).fetchone()
    return int(first)


def check_ids(written: Iterable[int], first: int, count: int) -> None:
    """Raise unless ``written`` are ``first``, ``first + 1``, ... ``count`` ids, those an
    insert was linked with (the send then fails whole, its transaction rolled back)."""
    if sorted(written) != list(range(first, first + count)):
        raise RuntimeError(f"queue ids were not the {count} from {first} on")


def tails(sql: Sql, names: Iterable[str]) -> dict[str, int]:
    """The last live message of each of ``names`` that has one."""
    found: dict[str, int] = {}
    ordered = sorted(set(names))
    for at in range(0, len(ordered), CHUNK):
        chunk = ordered[at : at + CHUNK]
        found.update(
            sql.exec(
                "SELECT grp, tail FROM actorkeep_queue_groups "
                f"WHERE grp IN ({','.join('?' * len(chunk))})",
                chunk,
            ).fetchall()
        )
    return found


def link(
    sql: Sql, groups: Sequence[str | None], first: int
) -> tuple[list[int | None], dict[str, int]]:
    """For messages about to be inserted with ids ``first``, ``first + 1``, ... in the order
    of ``groups``: the ``prev`` of each, and the new tail of each group among them."""
    last = tails(sql, (g for g in groups if g is not None))
    prevs: list[int | None] = []
    new: dict[str, int] = {}
    for offset, group in enumerate(groups):
        if group is None:
            prevs.append(None)
            continue
        prevs.append(last.get(group))
        last[group] = new[group] = first + offset
    return prevs, new


def set_tails(sql: Sql, new: dict[str, int]) -> None:
    """Record the groups' new tails, after the messages that are the tails were inserted."""
    items = list(new.items())
    for at in range(0, len(items), CHUNK):
        chunk = items[at : at + CHUNK]
        sql.exec(
            "INSERT OR REPLACE INTO actorkeep_queue_groups (grp, tail) VALUES "
            + ",".join(["(?, ?)"] * len(chunk)),
            [v for item in chunk for v in item],
        )


def unlink(sql: Sql, now: float, removed: Iterable[tuple[int, str | None, int | None]]) -> None:
    """After messages left the queue (``(id, group, prev)`` each, as they were deleted): the
    message after each run of them in a group now follows the live message before the run,
    or becomes its group's head, leasable from now (or from its own delay) behind the heads
    ready before it; a group whose tail left names the live message before it, or is gone."""
    grouped = [(i, g, p) for i, g, p in removed if g is not None]
    if not grouped:
        return
    if all(prev is None for _, _, prev in grouped):
        _unlink_heads(sql, now, grouped)
        return
    prev_of: dict[int, int | None] = {}
    group_of: dict[int, str] = {}
    highest: dict[str, int] = {}
    for id_, group, prev in grouped:
        prev_of[id_] = prev
        group_of[id_] = group
        highest[group] = max(id_, highest.get(group, id_))

    def live_before(id_: int) -> int | None:
        prev = prev_of[id_]
        while prev is not None and prev in prev_of:
            prev = prev_of[prev]
        return prev

    # A run of removed messages ends in one no removed message follows: the one after it
    # (if any: else the run ended at the group's tail) now follows the run's live prev.
    followed = set(prev_of.values())
    ends = [i for i in prev_of if i not in followed]
    successors: Counter[str] = Counter()
    for at in range(0, len(ends), CHUNK):
        chunk = ends[at : at + CHUNK]
        params: list[object] = [now]
        for i in chunk:
            params += (i, live_before(i))
        moved = sql.exec(
            "UPDATE actorkeep_queue SET prev = v.column2, blocked = v.column2 IS NOT NULL, "
            "visible_at = CASE WHEN v.column2 IS NULL THEN MAX(visible_at, ?) "
            "ELSE visible_at END "
            f"FROM (VALUES {','.join(['(?, ?)'] * len(chunk))}) AS v "
            "WHERE actorkeep_queue.prev = v.column1 RETURNING grp",
            params,
        ).fetchall()
        successors.update(g for (g,) in moved)
    runs = Counter(group_of[i] for i in ends)
    gone: list[str] = []
    for group, n in runs.items():
        if successors[group] < n:  # one run ended at the tail, the group's highest id
            before = live_before(highest[group])
            if before is None:
                gone.append(group)
            else:
                sql.exec(
                    "UPDATE actorkeep_queue_groups SET tail = ? WHERE grp = ?", (before, group)
                )
    _forget(sql, gone)


def _unlink_heads(sql: Sql, now: float, heads: list[tuple[int, str, int | None]]) -> None:
    """``unlink`` of heads only (what acks remove), one of a group at most: the message after
    each is its group's new head; a group with none after its head is gone."""
    moved = 0
    for at in range(0, len(heads), CHUNK):
        chunk = heads[at : at + CHUNK]
        moved += sql.exec(
            "UPDATE actorkeep_queue SET prev = NULL, blocked = 0, "
            f"visible_at = MAX(visible_at, ?) WHERE prev IN ({','.join('?' * len(chunk))})",
            [now, *[id_ for id_, _, _ in chunk]],
        ).rowcount
    if moved == len(heads):
        return  # (RETURNING which moved cost each ack about half a microsecond)
    # A head nothing followed was its group's tail. A tail is a message of its own group,
    # so matching names and ids apart finds exactly those.
    for at in range(0, len(heads), CHUNK):
        chunk = heads[at : at + CHUNK]
        marks = ",".join("?" * len(chunk))
        sql.exec(
            f"DELETE FROM actorkeep_queue_groups WHERE grp IN ({marks}) AND tail IN ({marks})",
            [*[g for _, g, _ in chunk], *[id_ for id_, _, _ in chunk]],
        )


def _forget(sql: Sql, gone: list[str]) -> None:
    """The groups ``gone`` have no live message left."""
    for at in range(0, len(gone), CHUNK):
        names = gone[at : at + CHUNK]
        sql.exec(
            f"DELETE FROM actorkeep_queue_groups WHERE grp IN ({','.join('?' * len(names))})",
            names,
        )


__all__ = ["CHUNK", "check_ids", "link", "next_id", "set_tails", "tails", "unlink"]
