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

from .hostdb import HostDb

ACTOR_TABLE = "actorkeep_alarm"
MAX_RETRIES = 6
FIRST_RETRY_DELAY = 2.0


@dataclass(frozen=True, slots=True)
class AlarmState:
    """An actor's alarm as stored in its database."""

    at: float
    scheduled_at: float
    retry_count: int


#: An alarm event that fails before its handler runs (storage) is tried again after 2 s,
#: doubling up to this.
MAX_STORAGE_RETRY_DELAY = 300.0


def retry_delay(retry_count: int) -> float:
    """Delay before retry number ``retry_count + 1``: 2 s, doubling."""
    return FIRST_RETRY_DELAY * 2.0**retry_count


def storage_retry_delay(failures: int) -> float:
    """Delay after the ``failures``-th failure in a row of an alarm event outside its handler."""
    return min(MAX_STORAGE_RETRY_DELAY, FIRST_RETRY_DELAY * 2.0 ** min(failures - 1, 16))


class AlarmIndex:
    """``address -> at`` in the host database; its syncs are the host database's."""

    def __init__(self, host_db: HostDb) -> None:
        self._host_db = host_db
        self._conn = host_db.conn
        with host_db.errors():
            self._conn.execute(
                "CREATE TABLE IF NOT EXISTS alarms (address TEXT PRIMARY KEY, at REAL NOT NULL)"
            )
            self._conn.execute("CREATE INDEX IF NOT EXISTS alarms_due ON alarms (at, address)")

    def put(self, address: str, at: float) -> None:
        with self._host_db.errors():
            self._conn.execute(
                "INSERT INTO alarms (address, at) VALUES (?, ?) "
                "ON CONFLICT(address) DO UPDATE SET at = excluded.at",
                (address, at),
            )
        self._host_db.wrote()

    def remove(self, address: str) -> None:
        with self._host_db.errors():
            self._conn.execute("DELETE FROM alarms WHERE address = ?", (address,))
        self._host_db.wrote()

    def due(
        self, now: float, after: tuple[float, str] | None, limit: int
    ) -> list[tuple[str, float]]:
        """Entries with ``at <= now`` in ``(at, address)`` order, after the entry ``after``.

        It reads only due entries, through the ``(at, address)`` index: the cost of a scan
        grows with the number of due alarms, not with all pending ones.
        """
        with self._host_db.errors():
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
        with self._host_db.errors():
            row = self._conn.execute(
                "SELECT at, address FROM alarms WHERE at > ? ORDER BY at, address LIMIT 1", (now,)
            ).fetchone()
        return (row[0], row[1]) if row else None

    def get(self, address: str) -> float | None:
        with self._host_db.errors():
            row = self._conn.execute(
                "SELECT at FROM alarms WHERE address = ?", (address,)
            ).fetchone()
        return row[0] if row else None

    async def sync(self) -> None:
        """Make every index write so far durable. Concurrent callers share one fsync."""
        await self._host_db.sync()
