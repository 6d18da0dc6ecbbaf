"""The host's alarm index (SPEC §4).

Each actor's alarm lives in its own database (``actorkeep_alarm``), which is the truth. The host
keeps an index ``address -> at`` in its own database so that it can wake hibernated actors and,
after a restart, find due alarms with an indexed query: startup cost grows with the number of due
alarms, not with the number of actors. The index is written before the actor's row when an alarm
is set, so a crash can leave an index entry without a row (the host drops it when it fires) but
never a row without an entry.
"""

from __future__ import annotations

from dataclasses import dataclass

import trio

from .storage import Database

ACTOR_TABLE = "actorkeep_alarm"
MAX_RETRIES = 6
FIRST_RETRY_DELAY = 2.0


@dataclass(frozen=True, slots=True)
class AlarmState:
    """An actor's alarm as stored in its database."""

    at: float
    scheduled_at: float
    retry_count: int


def retry_delay(retry_count: int) -> float:
    """Delay before retry number ``retry_count + 1``: 2 s, doubling."""
    return FIRST_RETRY_DELAY * 2.0**retry_count


class AlarmIndex:
    """``address -> at`` in the host database, with group-committed syncs."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._conn = db.conn
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS alarms (address TEXT PRIMARY KEY, at REAL NOT NULL)"
        )
        self._conn.execute("CREATE INDEX IF NOT EXISTS alarms_due ON alarms (at, address)")
        self._written = 0
        self._synced = 0
        self._sync_running: trio.Event | None = None

    def put(self, address: str, at: float) -> None:
        self._conn.execute(
            "INSERT INTO alarms (address, at) VALUES (?, ?) "
            "ON CONFLICT(address) DO UPDATE SET at = excluded.at",
            (address, at),
        )
        self._written += 1

    def remove(self, address: str) -> None:
        self._conn.execute("DELETE FROM alarms WHERE address = ?", (address,))
        self._written += 1

    def due(
        self, now: float, after: tuple[float, str] | None, limit: int
    ) -> list[tuple[str, float]]:
        """Entries with ``at <= now`` in ``(at, address)`` order, after the entry ``after``.

        It reads only due entries, through the ``(at, address)`` index: the cost of a scan
        grows with the number of due alarms, not with all pending ones.
        """
        if after is None:
            return self._conn.execute(
                "SELECT address, at FROM alarms WHERE at <= ? ORDER BY at, address LIMIT ?",
                (now, limit),
            ).fetchall()
        return self._conn.execute(
            "SELECT address, at FROM alarms WHERE at <= ? AND (at, address) > (?, ?) "
            "ORDER BY at, address LIMIT ?",
            (now, after[0], after[1], limit),
        ).fetchall()

    def next_after(self, now: float) -> tuple[float, str] | None:
        """The first entry after ``now`` as ``(at, address)``, through the index."""
        row = self._conn.execute(
            "SELECT at, address FROM alarms WHERE at > ? ORDER BY at, address LIMIT 1", (now,)
        ).fetchone()
        return (row[0], row[1]) if row else None

    def get(self, address: str) -> float | None:
        row = self._conn.execute("SELECT at FROM alarms WHERE address = ?", (address,)).fetchone()
        return row[0] if row else None

    async def sync(self) -> None:
        """Make every index write so far durable. Concurrent callers share one fsync."""
        target = self._written
        while self._synced < target:
            running = self._sync_running
            if running is not None:
                await running.wait()
                continue
            running = self._sync_running = trio.Event()
            upto = self._written
            try:
                await self._db.sync()
                self._synced = max(self._synced, upto)
            finally:
                self._sync_running = None
                running.set()

    def close(self) -> None:
        self._db.close()
