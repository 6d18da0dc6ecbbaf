"""The host's own database (``host.sqlite``): the alarm index, the actor registry, quarantine.

Everything in it can be rebuilt from the actors' own databases (``rebuild.py``): when it is
missing while actors exist, or damaged, the host rebuilds it at start. Its writes are plain;
``sync()`` makes them durable, one fsync for every write made before it started.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

import structlog
import trio

from ..errors import ActorkeepError, StorageDamaged
from .storage import Database, StorageBackend, check_database, is_damage

log = structlog.get_logger("actorkeep")


class HostDbError(ActorkeepError):
    """A statement on the host's own database failed (the message names the file)."""


class HostDb:
    """The host database's connection, its group-committed syncs and its health."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.conn = db.conn
        self.where = db.where
        #: It held no tables when opened: new, or set aside and started afresh.
        self.fresh = not self.has_table("alarms")
        with self.errors():
            self.conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value)")
        self._written = 0
        self._synced = 0
        self._sync_running: trio.Event | None = None

    def has_table(self, name: str) -> bool:
        row = self.conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
        ).fetchone()
        return row is not None

    @contextmanager
    def errors(self) -> Iterator[None]:
        """Re-raise a failing statement as ``HostDbError`` naming the host database, so that
        an event failing on it is not blamed on its actor alone."""
        try:
            yield
        except sqlite3.Error as exc:
            raise HostDbError(f"host database {self.where}: {exc}") from exc

    def get_meta(self, key: str) -> object:
        """A value the host keeps about itself (e.g. the latest host time), or None."""
        with self.errors():
            row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: object) -> None:
        with self.errors():
            self.conn.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value)
            )
        self.wrote()

    def delete_meta(self, key: str) -> bool:
        """Forget a value; False if there was none."""
        with self.errors():
            cur = self.conn.execute("DELETE FROM meta WHERE key = ?", (key,))
        self.wrote()
        return cur.rowcount > 0

    def wrote(self) -> None:
        """Count a write that the next ``sync()`` must cover."""
        self._written += 1

    async def sync(self) -> None:
        """Make every write so far durable. Concurrent callers share one fsync."""
        target = self._written
        while self._synced < target:
            running = self._sync_running
            if running is not None:
                await running.wait()
                continue
            running = self._sync_running = trio.Event()
            upto = self._written
            try:
                with self.errors():
                    await self.db.sync()
                self._synced = max(self._synced, upto)
            finally:
                self._sync_running = None
                running.set()

    @property
    def dirty(self) -> bool:
        """Whether some write is not durable yet."""
        return self._synced < self._written

    def close(self) -> None:
        self.db.close()


def open_host_db(storage: StorageBackend) -> tuple[HostDb, str | None]:
    """Open the host database, checked with ``quick_check``. A damaged one is set aside and a
    fresh one opened: returns it and where the damaged one went (None if it was sound)."""
    try:
        db = storage.open_host_db()
    except (sqlite3.DatabaseError, StorageDamaged) as exc:  # not a database, or a lost WAL
        if not is_damage(exc):
            raise
        problem: str | None = str(exc)
    else:
        problem = check_database(db.conn)
        if problem is None:
            return HostDb(db), None
        db.close()
    moved = storage.set_aside_host_db()
    log.error(
        "the host database is damaged: set aside, rebuilding it from the actors' files",
        problem=problem,
        moved_to=moved,
    )
    return HostDb(storage.open_host_db()), moved
