"""``KVShard``: one shard of a key-value store, mounted with ``app.mount(KVShard, "kv")``.

Keys are spread over ``kv/shard-0 .. kv/shard-<n-1>`` by ``actorkeep.kv.shard_for``. A shard
answers only other actors (``callers_only``), one event at a time, so an expectation is checked
and the write made with nothing in between. See docs/kv.md and docs/decisions/0007-kv.md.
"""

from __future__ import annotations

import math
import struct
import zlib
from typing import Any, ClassVar

import actorkeep as ak
from actorkeep.wire import kv as wire

#: Versions are reserved durably in blocks, so that no version is ever handed out twice, even
#: when a local write and the counter's update are lost to power loss. A reservation is a
#: gated write: the replies after it wait for one fsync, once per block (decision 0015).
VERSION_BLOCK = 100_000
#: Expired rows deleted by one alarm event.
EXPIRY_BATCH = 500

_ROW_NUMBERS = struct.Struct("<qq")
_INSERT = (
    "INSERT OR REPLACE INTO actorkeep_kv (key, value, version, expires_at, sum) "
    "VALUES (?, ?, ?, ?, ?)"
)


def row_sum(key: bytes, value: bytes, version: int, expires_at: int | None) -> int:
    """The CRC-32 a row is stored with: SQLite checks its pages' structure, not their bytes,
    so a value overwritten on disk would otherwise be served as if it had been written."""
    numbers = _ROW_NUMBERS.pack(version, -1 if expires_at is None else expires_at)
    return zlib.crc32(numbers, zlib.crc32(value, zlib.crc32(key)))


def _checked(key: bytes, value: bytes, version: int, expires_at: int | None, stored: Any) -> None:
    # Rows written before the sum existed have none (NULL): nothing to check them against.
    if stored is not None and stored != row_sum(key, value, version, expires_at):
        raise ak.StorageDamaged(f"the KV row of key {key[:64]!r} fails its checksum")


def list_query(
    prefix: bytes, after: bytes | None, limit: int, now_ms: int
) -> tuple[str, list[Any]]:
    """The statement of a ``list`` page: live rows of ``prefix`` above ``after``, in key
    order, one more than ``limit`` (to tell whether there are more)."""
    # One lower bound, the higher of the two: given both, SQLite seeks to one and scans from
    # there, so that a page deep into a prefix cost as many rows as lay before it.
    clauses = ["(expires_at IS NULL OR expires_at > ?)"]
    params: list[Any] = [now_ms]
    if after is not None and after >= prefix:
        clauses.append("key > ?")
        params.append(after)
    else:  # every key of the prefix is greater than an ``after`` below it
        clauses.append("key >= ?")
        params.append(prefix)
    end = prefix_end(prefix)
    if end is not None:
        clauses.append("key < ?")
        params.append(end)
    params.append(min(limit, wire.MAX_LIMIT) + 1)
    where = " AND ".join(clauses)
    return (
        f"SELECT key, value, version, expires_at, sum FROM actorkeep_kv WHERE {where} "
        "ORDER BY key LIMIT ?",
        params,
    )


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key that starts with ``prefix`` (None: no bound)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


class KVShard(ak.Actor):
    """One shard: ``actorkeep_kv`` rows and the ``actorkeep_kv_meta`` version counter."""

    callers_only: ClassVar[bool] = True
    #: Puts queued together commit as one SQLite transaction (decision 0030).
    coalesce_writes: ClassVar[bool] = True

    async def setup(self) -> None:
        sql = self.sql
        sql.exec(
            "CREATE TABLE IF NOT EXISTS actorkeep_kv (key BLOB PRIMARY KEY, value BLOB NOT NULL, "
            "version INTEGER NOT NULL, expires_at INTEGER, sum INTEGER) WITHOUT ROWID"
        )
        columns = {row[1] for row in sql.exec("PRAGMA table_info(actorkeep_kv)")}
        if "sum" not in columns:  # a shard from before rows carried their checksum
            sql.exec("ALTER TABLE actorkeep_kv ADD COLUMN sum INTEGER")
        sql.exec(
            "CREATE INDEX IF NOT EXISTS actorkeep_kv_expiry ON actorkeep_kv (expires_at) "
            "WHERE expires_at IS NOT NULL"
        )
        sql.exec(
            "CREATE TABLE IF NOT EXISTS actorkeep_kv_meta "
            "(id INTEGER PRIMARY KEY CHECK (id = 0), seq INTEGER NOT NULL)"
        )
        sql.exec("INSERT OR IGNORE INTO actorkeep_kv_meta VALUES (0, 0)")
        (seq,) = sql.exec("SELECT seq FROM actorkeep_kv_meta").fetchone()
        # Every version up to seq may have been handed out: start after it.
        self._next_version = int(seq) + 1
        self._reserved = int(seq)

    def _new_version(self) -> int:
        version = self._next_version
        if version > self._reserved:
            # Under the simulator, tiny blocks make reservations happen all the time. A gated
            # write: no reply with a version of the block leaves before it is durable.
            block = 2 if self.buggify("kv.short-reservation") else VERSION_BLOCK
            reserved = version + block - 1
            self.sql.exec(
                "UPDATE actorkeep_kv_meta SET seq = ? WHERE id = 0", (reserved,), durable=True
            )
            self._reserved = reserved
        self._next_version = version + 1
        return version

    def _now_ms(self) -> int:
        return math.floor(self.now() * 1000)

    def _live(self, key: bytes, now_ms: int) -> tuple[int, bytes, int | None] | None:
        row = self.sql.exec(
            "SELECT version, value, expires_at, sum FROM actorkeep_kv WHERE key = ?", (key,)
        ).fetchone()
        if row is None:
            return None
        version, value, expires_at, stored = row
        if stored is not None and stored != zlib.crc32(
            _ROW_NUMBERS.pack(version, -1 if expires_at is None else expires_at),
            zlib.crc32(value, zlib.crc32(key)),
        ):
            _checked(key, value, version, expires_at, stored)  # raises
        if expires_at is not None and expires_at <= now_ms:
            return None  # an expired row reads as absent everywhere
        return version, value, expires_at

    @staticmethod
    def conflict(expect: int | None, live: int | None) -> ak.Response | None:
        """The 409 when the expectation ``expect`` (wire form) does not hold for the live
        version ``live``; None when it holds."""
        if expect is None or (live is None if expect == wire.EXPECT_ABSENT else live == expect):
            return None
        want = "absent" if expect == wire.EXPECT_ABSENT else f"version {expect}"
        return ak.Response.json(
            {
                "error": "Conflict",
                "message": f"expected {want}, found {'absent' if live is None else live}",
                "current_version": live,
            },
            status=409,
        )

    # One handler per operation (actorkeep.wire.kv). Reads are plain functions, so the host
    # can run them in the caller's task when the shard is idle (decision 0001); writes may
    # wait for an fsync.
    @wire.GET.handler
    def get(self, frame: dict[str, Any]) -> dict[str, Any]:
        self.count_metric("kv.ops", label="get")
        live = self._live(frame["key"], self._now_ms())
        if live is None:
            return {"entry": None}
        version, value, expires_at = live
        return {"entry": [value, version, expires_at]}

    @wire.LIST.handler
    def list(self, frame: dict[str, Any]) -> dict[str, Any]:
        prefix: bytes = frame["prefix"]
        after: bytes | None = frame["after"]
        limit: int = frame["limit"]
        self.count_metric("kv.ops", label="list")
        sql, params = list_query(prefix, after, limit, self._now_ms())
        rows = self.sql.exec(sql, params).fetchall()
        more = len(rows) > limit
        entries = []
        crc32, pack = zlib.crc32, _ROW_NUMBERS.pack  # row_sum, inlined: it runs per row
        for key, value, version, expires_at, stored in rows[:limit]:
            if stored is not None and stored != crc32(
                pack(version, -1 if expires_at is None else expires_at),
                crc32(value, crc32(key)),
            ):
                _checked(key, value, version, expires_at, stored)  # raises
            entries.append([key, value, version, expires_at])
        return {"entries": entries, "more": more}

    @wire.PUT.handler
    async def put(self, frame: dict[str, Any]) -> dict[str, Any] | ak.Response:
        """A put with a TTL (or any put): the row, then the expiry alarm."""
        done = self.write(frame)
        if isinstance(done, ak.Response):
            return done
        version, expires_at = done
        if expires_at is not None:
            await self._arm_expiry(expires_at)
        return {"version": version, "expires_at": expires_at}

    @wire.PUT_NOW.handler
    def put_now(self, frame: dict[str, Any]) -> dict[str, Any] | ak.Response:
        """A put without TTL. Its handler never suspends, so the host may run it in the
        caller's task (decision 0001); a durable one answers through the output gate."""
        done = self.write(frame)
        if isinstance(done, ak.Response):
            return done
        return {"version": done[0], "expires_at": None}

    @wire.DELETE.handler
    async def delete(self, frame: dict[str, Any]) -> dict[str, Any] | ak.Response:
        key: bytes = frame["key"]
        self.count_metric("kv.ops", label="delete")
        live = self._live(key, self._now_ms())
        refused = self.conflict(frame["expect"], live[0] if live else None)
        if refused is not None:
            self.count_metric("kv.conflicts", label="delete")
            return refused
        if live is None:
            self.sql.exec("DELETE FROM actorkeep_kv WHERE key = ?", (key,))  # an expired row
            return {"deleted": False}
        self.sql.exec("DELETE FROM actorkeep_kv WHERE key = ?", (key,), durable=True)
        return {"deleted": True}

    def write(self, frame: dict[str, Any]) -> tuple[int, int | None] | ak.Response:
        """A put's row: check the expectation, take the next version, write (a gated write
        unless ``local``); the version and expiry, or the refusal."""
        key: bytes = frame["key"]
        if frame["expect"] is not None:  # an expectation: check it against the live version
            self.count_metric("kv.ops", label="cas")
            live = self._live(key, self._now_ms())
            refused = self.conflict(frame["expect"], live[0] if live else None)
            if refused is not None:
                self.count_metric("kv.conflicts", label="cas")
                return refused
        else:
            self.count_metric("kv.ops", label="put")
        version = self._new_version()
        ttl: float | None = frame["ttl"]
        expires_at = self._now_ms() + max(1, math.ceil(ttl * 1000)) if ttl is not None else None
        value = frame["value"]
        params = (key, value, version, expires_at, row_sum(key, value, version, expires_at))
        self.insert(params, durable=not frame["local"])
        return version, expires_at

    def insert(self, params: tuple[Any, ...], durable: bool) -> None:
        """Write one row; ``durable``: a gated write, whose reply leaves once it is durable
        (decision 0015)."""
        if durable:
            self.sql.exec(_INSERT, params, durable=True)
        else:
            self.sql.exec(_INSERT, params)

    async def _arm_expiry(self, expires_at_ms: int) -> None:
        # One millisecond late, so that floor(now * 1000) >= expires_at when it fires.
        at = (expires_at_ms + 1) / 1000
        current = self.get_alarm()
        if current is None or at < current:
            await self.set_alarm(at)

    async def alarm(self, info: ak.AlarmInfo) -> None:
        """Delete expired rows, 500 per event, then wait for the next expiry."""
        now_ms = self._now_ms()
        deleted = self.sql.exec(
            "DELETE FROM actorkeep_kv WHERE key IN (SELECT key FROM actorkeep_kv "
            "WHERE expires_at <= ? LIMIT ?)",
            (now_ms, EXPIRY_BATCH),
        ).rowcount
        if deleted >= EXPIRY_BATCH:
            await self.set_alarm(self.now())  # more to do: a separate event, so others get a turn
            return
        (nxt,) = self.sql.exec(
            "SELECT MIN(expires_at) FROM actorkeep_kv WHERE expires_at IS NOT NULL"
        ).fetchone()
        if nxt is not None:
            await self.set_alarm((nxt + 1) / 1000)
