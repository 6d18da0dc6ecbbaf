"""Queues and KV shards as the operator sees them (docs/operations.md).

On a running host (``Ready``) every operation is a call of the queue or shard actor by the
host's operator (``OPERATOR``), with the frames of ``actorkeep.wire``: it runs as one of the
actor's own events, in order with the rest, and a redrive or cancel is durable, with the
queue's alarm set, exactly as from the SDK. On a data directory no host serves, the reads
(``offline_*``) read the stored tables read-only; writes need the host that runs the queue.
"""

from __future__ import annotations

import base64
import dataclasses
import heapq
import math
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from .. import codec, kv
from ..address import OPERATOR, split_address
from ..errors import CallTimeout, RemoteError
from ..http import Response
from ..runtime.host import Host
from ..wire import MSGPACK_HEADERS, Op
from ..wire import kv as kv_wire
from ..wire import queue as queue_wire
from . import inspect
from .inspect import InspectError

#: How long an operator's call may wait for its actor.
CALL_TIMEOUT = 10.0
#: The most queues one listing (and one metrics scrape) asks for their counts.
MAX_QUEUES = 100
DEFAULT_SHARDS = 16
MAX_SHARDS = 4096


def speaks(host: Host, class_name: str, op: Op) -> bool:
    """Whether the actor class ``class_name`` answers the operation ``op``."""
    found = host.classes.get(class_name)
    return found is not None and found.routes.match("POST", op.path) is not None


def queue_classes(host: Host) -> list[str]:
    """The app's classes that are queues (that answer the queue protocol)."""
    return sorted(name for name in host.classes if speaks(host, name, queue_wire.STATS))


def check_shards(shards: int | None) -> int:
    """A KV client's shard count (``--shards``; 16, the client's default, when None)."""
    if shards is None:
        return DEFAULT_SHARDS
    if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= MAX_SHARDS:
        raise InspectError(f"shards must be in 1..{MAX_SHARDS}, got {shards!r}")
    return shards


def _key(text: str) -> bytes:
    try:
        return kv_wire.check_key(text.encode())
    except ValueError as exc:
        raise InspectError(str(exc)) from None


class Ready:
    """The queues and KV shards of a running ``host``, called as its operator. ``known``: in
    a cluster, whether an actor has state anywhere in it (it may be served elsewhere)."""

    def __init__(self, host: Host, known: Callable[[str], Awaitable[bool]] | None = None) -> None:
        self.host = host
        self._known = known

    async def _call(self, address: str, op: Op, **fields: Any) -> dict[str, Any]:
        try:
            frame = op.frame(**fields)
        except ValueError as exc:
            raise InspectError(str(exc)) from None
        try:
            resp = await self.host.call_as(
                OPERATOR, address, "POST", op.path, frame, MSGPACK_HEADERS, CALL_TIMEOUT
            )
            return op.result(resp)
        except RemoteError as exc:
            raise InspectError(f"{address}: {exc.message}", _status(exc.status)) from None
        except CallTimeout:
            raise InspectError(f"{address} did not answer in {CALL_TIMEOUT:g} s", 503) from None

    async def _queue(self, address: str) -> str:
        """``address`` checked: a queue of the app that exists (a call would create it)."""
        try:
            class_name, _ = split_address(address)
        except ValueError as exc:
            raise InspectError(str(exc)) from None
        if not speaks(self.host, class_name, queue_wire.STATS):
            raise InspectError(f"{class_name!r} is not a queue class of this app", 404)
        if not await self._exists(address):
            raise InspectError(f"no queue {address}", 404)
        return address

    async def _exists(self, address: str) -> bool:
        """Whether the actor at ``address`` has been created (a call would create it)."""
        host = self.host
        if address in host.activations or host.registry.has(address):
            return True
        if host.storage.exists(*split_address(address)):  # registered soon
            return True
        return self._known is not None and await self._known(address)

    # -- queues -----------------------------------------------------------------------------
    async def queues(self) -> dict[str, Any]:
        """Every queue of the app (up to ``MAX_QUEUES``), with its counts."""
        found: list[dict[str, Any]] = []
        for class_name in queue_classes(self.host):
            page = inspect.list_actors(self.host.registry, class_name + "/", None, MAX_QUEUES)
            for actor in page["actors"]:
                if len(found) == MAX_QUEUES:
                    return {"queues": found, "truncated": True}
                try:
                    found.append(await self.stats(actor["address"]))
                except InspectError as exc:  # one queue that cannot answer hides no other
                    found.append({"queue": actor["address"], "error": str(exc)})
        return {"queues": found, "truncated": False}

    async def stats(self, address: str) -> dict[str, Any]:
        reply = await self._call(await self._queue(address), queue_wire.STATS)
        return {"queue": address, **{k: reply[k] for k in queue_wire.STATS.reply_fields}}

    async def dead(self, address: str, after: int | None, limit: int) -> dict[str, Any]:
        reply = await self._call(
            await self._queue(address), queue_wire.DEAD_LETTERS, limit=limit + 1, after=after or 0
        )
        items = [dataclasses.asdict(x) for x in reply["items"]]
        return _dead_page(address, items, limit)

    async def get(self, address: str, id: int) -> dict[str, Any]:
        reply = await self._call(await self._queue(address), queue_wire.GET, id=id)
        if reply["job"] is None:
            raise InspectError(f"no message {id} in {address}", 404)
        message = dataclasses.asdict(reply["job"])
        message["body"] = blob(message["body"])
        return {"queue": address, "message": message}

    async def redrive(self, address: str, ids: list[int] | None) -> dict[str, Any]:
        reply = await self._call(await self._queue(address), queue_wire.REDRIVE, ids=ids)
        return {"queue": address, "redriven": reply["count"]}

    async def cancel(self, address: str, id: int) -> dict[str, Any]:
        reply = await self._call(await self._queue(address), queue_wire.CANCEL, id=id)
        return {"queue": address, "id": id, "cancelled": reply["ok"]}

    # -- KV ---------------------------------------------------------------------------------
    def _kv(self, class_name: str, shards: int | None) -> kv.Client:
        if not speaks(self.host, class_name, kv_wire.GET):
            raise InspectError(f"{class_name!r} is not a KV shard class of this app", 404)
        return kv.Client(class_name, check_shards(shards), via=self._via(class_name))

    def _via(self, class_name: str) -> Callable[[str, str, bytes], Awaitable[Response]]:
        async def call(address: str, path: str, frame: bytes) -> Response:
            if not await self._exists(address):  # a shard never written: empty
                return _empty_shard(path)
            return await self.host.call_as(
                OPERATOR, address, "POST", path, frame, MSGPACK_HEADERS, CALL_TIMEOUT
            )

        return call

    async def kv_get(self, class_name: str, shards: int | None, key: str) -> dict[str, Any]:
        client = self._kv(class_name, shards)
        try:
            entry = await client.get(_key(key))
        except RemoteError as exc:
            raise InspectError(exc.message, _status(exc.status)) from None
        return {"class": class_name, "entry": None if entry is None else _entry(entry)}

    async def kv_list(
        self, class_name: str, shards: int | None, prefix: str, after: str | None, limit: int
    ) -> dict[str, Any]:
        client = self._kv(class_name, shards)
        try:
            page = await client.list(prefix.encode(), None if after is None else _key(after), limit)
        except ValueError as exc:
            raise InspectError(str(exc)) from None
        except RemoteError as exc:
            raise InspectError(exc.message, _status(exc.status)) from None
        cursor = None if page.cursor is None else page.cursor.decode("utf-8", "replace")
        return {
            "class": class_name,
            "entries": [_entry(e) for e in page.entries],
            "next": cursor,
        }


def _status(status: int) -> int:
    """The admin API's status for an actor's error reply (its 5xx are the host's 503)."""
    return status if status in (400, 404, 409) else 503


def _empty_shard(path: str) -> Response:
    empty = {kv_wire.LIST.path: {"entries": [], "more": False}, kv_wire.GET.path: {"entry": None}}
    return Response(200, MSGPACK_HEADERS, codec.pack(empty[path]))


def blob(value: bytes) -> dict[str, str]:
    """A body, key or value in JSON: ``{"text": ...}`` if it is UTF-8, else ``{"base64": ...}``."""
    try:
        return {"text": value.decode()}
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(value).decode()}


def _entry(entry: kv.Entry) -> dict[str, Any]:
    return {
        "key": blob(entry.key),
        "value": blob(entry.value),
        "version": entry.version,
        "expires_at": entry.expires_at,
    }


def _dead_page(address: str, items: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    more = len(items) > limit
    items = items[:limit]
    for item in items:
        item["body"] = blob(item["body"])
    return {"queue": address, "items": items, "next": items[-1]["id"] if more else None}


# -- a data directory no host serves ----------------------------------------------------------

# Offline reads never write, so a queue file of the first version (without keys, groups and
# worker names; the queue upgrades it at its next start) is read as it is.
_STATS_SQL = (
    "SELECT COALESCE(SUM(visible_at <= :now AND {unblocked}), 0), "
    "COALESCE(SUM((visible_at > :now AND leased = 0) OR NOT {unblocked}), 0), "
    "COALESCE(SUM(visible_at > :now AND leased = 1), 0), "
    "MIN(CASE WHEN visible_at <= :now AND {unblocked} THEN enqueued_at END), "
    "{keys}, {groups}, (SELECT COUNT(*) FROM actorkeep_queue_dead) FROM actorkeep_queue"
)
_MESSAGE_EXTRAS = ("key", "grp", "expires_at", "max_attempts", "worker", "blocked")


def _queue_file(actors_root: Path, address: str) -> Path:
    path = inspect.database_path(actors_root, address)
    if not path.exists():
        raise InspectError(f"no queue {address}", 404)
    return path


def _queue_read(actors_root: Path, address: str, run: Callable[[Any, bool], Any]) -> Any:
    """``run(conn, upgraded)`` on the queue's file, read-only; ``upgraded``: it has the
    columns of keys, groups and worker names."""

    def read(conn: Any) -> Any:
        if not _has_table(conn, "actorkeep_queue_dead"):
            raise InspectError(f"{address} is not a queue", 404)
        try:  # (the read-only connection allows no PRAGMA)
            conn.execute(f"SELECT {', '.join(_MESSAGE_EXTRAS)} FROM actorkeep_queue LIMIT 0")
        except sqlite3.OperationalError:
            return run(conn, False)
        return run(conn, True)

    return inspect.read(_queue_file(actors_root, address), read)


def _has_table(conn: Any, name: str) -> bool:
    found = conn.execute("SELECT 1 FROM sqlite_schema WHERE name = ?", (name,)).fetchone()
    return found is not None


def offline_stats(actors_root: Path, address: str, now: float) -> dict[str, Any]:
    """A stopped queue's counts as stored (a message out of attempts counts where it is
    until the queue moves it to the dead letters)."""

    def run(conn: Any, upgraded: bool) -> tuple[Any, ...]:
        if upgraded:
            remembered = "(SELECT COUNT(*) FROM actorkeep_queue_keys)"
            sql = _STATS_SQL.format(
                unblocked="blocked = 0",
                keys=f"COUNT(key) + {remembered}",
                groups="COUNT(DISTINCT grp)",
            )
        else:
            sql = _STATS_SQL.format(unblocked="1", keys="0", groups="0")
        counts = tuple(conn.execute(sql, {"now": now}).fetchone())
        schedules = 0
        if _has_table(conn, "actorkeep_schedule"):
            (schedules,) = conn.execute(
                "SELECT COUNT(*) FROM actorkeep_schedule WHERE substr(key, 1, ?) = ?",
                (len(queue_wire.RECURRING_PREFIX), queue_wire.RECURRING_PREFIX),
            ).fetchone()
        return (*counts, schedules)

    ready, delayed, leased, oldest, keys, groups, dead, schedules = _queue_read(
        actors_root, address, run
    )
    return {
        "queue": address,
        "ready": ready,
        "delayed": delayed,
        "leased": leased,
        "dead": dead,
        "oldest_ready_age": None if oldest is None else max(0.0, now - oldest),
        "keys": keys,
        "groups": groups,
        "schedules": schedules,
    }


_DEAD_NAMES = ("id", "body", "enqueued_at", "attempts", "failed_at", "reason")


def offline_dead(actors_root: Path, address: str, after: int | None, limit: int) -> dict[str, Any]:
    def run(conn: Any, upgraded: bool) -> list[dict[str, Any]]:
        extra = ", key, grp, worker" if upgraded else ", NULL, NULL, NULL"
        rows = conn.execute(
            f"SELECT {', '.join(_DEAD_NAMES)}{extra} FROM actorkeep_queue_dead "
            "WHERE id > ? ORDER BY id LIMIT ?",
            (after or 0, limit + 1),
        ).fetchall()
        names = (*_DEAD_NAMES, "key", "group", "worker")
        return [dict(zip(names, r, strict=True)) for r in rows]

    return _dead_page(address, _queue_read(actors_root, address, run), limit)


def offline_get(actors_root: Path, address: str, id: int, now: float) -> dict[str, Any]:
    def run(conn: Any, upgraded: bool) -> tuple[list[Any], int | None]:
        stored = None
        if _has_table(conn, "actorkeep_queue_config"):
            stored = conn.execute("SELECT max_attempts FROM actorkeep_queue_config").fetchone()
        live = ", ".join(_MESSAGE_EXTRAS) if upgraded else "NULL, NULL, NULL, NULL, NULL, 0"
        dead = "key, grp, NULL, NULL, worker, 0" if upgraded else "NULL, NULL, NULL, NULL, NULL, 0"
        return list(
            conn.execute(
                "SELECT attempts, visible_at, last_error, priority, enqueued_at, body, leased, "
                f"NULL, {live} FROM actorkeep_queue WHERE id = :id UNION ALL "
                "SELECT attempts, NULL, reason, priority, enqueued_at, body, NULL, failed_at, "
                f"{dead} FROM actorkeep_queue_dead WHERE id = :id",
                {"id": id},
            ).fetchall()
        ), (None if stored is None else stored[0])

    rows, queue_max = _queue_read(actors_root, address, run)
    if not rows:
        raise InspectError(f"no message {id} in {address}", 404)
    attempts, visible_at, last_error, priority, enqueued_at, body, leased, failed_at = rows[0][:8]
    key, group, expires_at, max_attempts, worker, blocked = rows[0][8:]
    if failed_at is not None:
        state = "dead"
    else:
        ready = visible_at <= now and not blocked
        state = "ready" if ready else "leased" if leased else "delayed"
    message = {
        "id": id,
        "state": state,
        "attempts": attempts,
        "visible_at": visible_at,
        "last_error": last_error,
        "priority": priority,
        "enqueued_at": enqueued_at,
        "body": blob(body),
        "failed_at": failed_at,
        "key": key,
        "group": group,
        "expires_at": expires_at,
        # its own, or the queue's if configure() stored one (a mount's is not in the file)
        "max_attempts": max_attempts if max_attempts is not None or failed_at else queue_max,
        "worker": worker,
    }
    return {"queue": address, "message": message}


def _shard_rows(path: Path, sql: str, params: Any) -> list[Any]:
    if not path.exists():
        return []  # a shard never written
    return inspect.read(path, lambda conn: list(conn.execute(sql, params).fetchall()))


def offline_kv_get(
    actors_root: Path, class_name: str, shards: int | None, key: str, now: float
) -> dict[str, Any]:
    k = _key(key)
    address = f"{class_name}/shard-{kv.shard_for(k, check_shards(shards))}"
    rows = _shard_rows(
        inspect.database_path(actors_root, address),
        "SELECT key, value, version, expires_at FROM actorkeep_kv "
        "WHERE key = ? AND (expires_at IS NULL OR expires_at > ?)",
        (k, math.floor(now * 1000)),
    )
    entry = None if not rows else _entry(_row_entry(rows[0]))
    return {"class": class_name, "entry": entry}


def offline_kv_list(
    actors_root: Path,
    class_name: str,
    shards: int | None,
    prefix: str,
    after: str | None,
    limit: int,
    now: float,
) -> dict[str, Any]:
    """The merged page of every shard's file, in key byte order."""
    p = prefix.encode()
    start = max(p, _key(after) + b"\x00") if after is not None else p
    sql = (
        "SELECT key, value, version, expires_at FROM actorkeep_kv WHERE key >= ? "
        "AND (expires_at IS NULL OR expires_at > ?) ORDER BY key LIMIT ?"
    )
    per_shard = []
    for i in range(check_shards(shards)):
        path = inspect.database_path(actors_root, f"{class_name}/shard-{i}")
        rows = _shard_rows(path, sql, (start, math.floor(now * 1000), limit + 1))
        per_shard.append([r for r in rows if r[0].startswith(p)])
    merged = list(heapq.merge(*per_shard, key=lambda r: bytes(r[0])))[: limit + 1]
    entries = [_entry(_row_entry(r)) for r in merged[:limit]]
    more = len(merged) > limit
    cursor = merged[limit - 1][0].decode("utf-8", "replace") if more and limit else None
    return {"class": class_name, "entries": entries, "next": cursor}


def _row_entry(row: Any) -> kv.Entry:
    key, value, version, expires_at = row
    expires = None if expires_at is None else expires_at / 1000
    return kv.Entry(bytes(key), bytes(value), version, expires)
