"""Which actors exist, and which are quarantined: two tables of the host database.

The registry tells an actor that existed from a new one, so that a database that vanished or
was emptied is reported as damage instead of being taken for a fresh actor (a KV shard would
hand out versions again). An actor is registered only once its database is durable, so power
loss cannot leave a registered actor without one. A quarantined actor takes no events until an
operator releases it (``actorkeep quarantine --release``).
"""

from __future__ import annotations

from .hostdb import HostDb


class Registry:
    """The ``actors`` and ``quarantine`` tables."""

    def __init__(self, host_db: HostDb) -> None:
        self._host_db = host_db
        self._conn = host_db.conn
        #: The ``actors`` table is new: the host database is new, or from before it existed.
        self.new = not host_db.has_table("actors")
        with host_db.errors():
            self._conn.execute(
                "CREATE TABLE IF NOT EXISTS actors "
                "(address TEXT PRIMARY KEY, created_at REAL NOT NULL) WITHOUT ROWID"
            )
            self._conn.execute(
                "CREATE TABLE IF NOT EXISTS quarantine "
                "(address TEXT PRIMARY KEY, reason TEXT NOT NULL, since REAL NOT NULL)"
            )

    def has(self, address: str) -> bool:
        with self._host_db.errors():
            return (
                self._conn.execute("SELECT 1 FROM actors WHERE address = ?", (address,)).fetchone()
                is not None
            )

    def add(self, address: str, created_at: float) -> None:
        with self._host_db.errors():
            self._conn.execute(
                "INSERT OR IGNORE INTO actors (address, created_at) VALUES (?, ?)",
                (address, created_at),
            )
        self._host_db.wrote()

    def forget(self, address: str) -> None:
        with self._host_db.errors():
            self._conn.execute("DELETE FROM actors WHERE address = ?", (address,))
        self._host_db.wrote()

    def quarantine(self, address: str, reason: str, since: float) -> None:
        with self._host_db.errors():
            self._conn.execute(
                "INSERT OR REPLACE INTO quarantine (address, reason, since) VALUES (?, ?, ?)",
                (address, reason, since),
            )
        self._host_db.wrote()

    def release(self, address: str) -> bool:
        """Take ``address`` out of quarantine; False if it was not in it."""
        with self._host_db.errors():
            cur = self._conn.execute("DELETE FROM quarantine WHERE address = ?", (address,))
        self._host_db.wrote()
        return cur.rowcount > 0

    def quarantined(self) -> dict[str, tuple[str, float]]:
        """``address -> (reason, since)`` of every quarantined actor."""
        with self._host_db.errors():
            rows = self._conn.execute("SELECT address, reason, since FROM quarantine").fetchall()
        return {address: (reason, since) for address, reason, since in rows}
