"""The alarm index: ``address -> at`` for every actor with an alarm, so that the host can wake
actors that are not in memory and find due alarms with an indexed query (the seam a cluster
replaces; ``LocalAlarmIndex`` keeps it in the host database). alarms.py says what it must
promise."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from .hostdb import HostDb

#: Due entries read per query of a scan.
DUE_BATCH = 256


class AlarmIndex(Protocol):
    """``address -> at`` for every actor with an alarm (the seam a cluster replaces)."""

    def put(self, address: str, at: float) -> None:
        """Set the entry (a plain write: ``sync`` makes it durable)."""

    def remove(self, address: str) -> None:
        """Drop the entry (a plain write)."""

    def get(self, address: str) -> float | None:
        """The entry's time, or None."""

    def due(
        self, now: float, after: tuple[float, str] | None, limit: int
    ) -> list[tuple[str, float]]:
        """Up to ``limit`` entries with ``at <= now`` in ``(at, address)`` order, after
        ``after``."""

    def next_after(self, now: float) -> tuple[float, str] | None:
        """The first entry after ``now`` as ``(at, address)``."""

    async def sync(self) -> None:
        """Make every write so far durable (or, for an index whose entries commit with the
        actor's next durable write in one transaction, at the latest with it)."""

    def watch(self, poke: Callable[[float], None], retry: Callable[[], None]) -> None:
        """``poke(at)`` for entries that appear from elsewhere (in a cluster: the alarms of a
        partition this host takes over), so that the scheduler wakes for them; ``retry()``
        when the storage answers again after failing (in a cluster: the store), so that alarm
        events waiting out a storage failure are tried at once."""


class LocalAlarmIndex:
    """The index in the host database; its syncs are the host database's."""

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
        """It reads only due entries, through the ``(at, address)`` index: the cost of a scan
        grows with the number of due alarms, not with all pending ones."""
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
        await self._host_db.sync()

    def watch(self, poke: Callable[[float], None], retry: Callable[[], None]) -> None:
        """Nothing comes from elsewhere: every entry is put by this host's scheduler, and a
        failing disk gives no sign that it works again (the retries back off instead)."""
