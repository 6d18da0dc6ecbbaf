"""Which actors exist, and which are quarantined: two tables of the host database.

The registry tells an actor that existed from a new one, so that a database that vanished or
was emptied is reported as damage instead of being taken for a fresh actor (a KV shard would
hand out versions again). An actor is registered only once its database is durable, so power
loss cannot leave a registered actor without one. A quarantined actor takes no events until an
operator releases it (``actorkeep quarantine --release``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import structlog

from .hostdb import HostDb

log = structlog.get_logger("actorkeep")


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

    def page(self, prefix: str, after: str | None, limit: int) -> list[tuple[str, float]]:
        """Up to ``limit`` ``(address, created_at)`` of the actors whose address starts with
        ``prefix``, in address order, after ``after``: a range of the primary key, so the
        cost grows with the page, not with the registry."""
        where, args = ["address >= ?"], [prefix]
        if after is not None:
            where.append("address > ?")
            args.append(after)
        end = _prefix_end(prefix)
        if end is not None:
            where.append("address < ?")
            args.append(end)
        sql = f"SELECT address, created_at FROM actors WHERE {' AND '.join(where)} "
        with self._host_db.errors():
            return self._conn.execute(sql + "ORDER BY address LIMIT ?", (*args, limit)).fetchall()

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


class Quarantine:
    """The actors taken out of service because their storage is damaged: ``address -> why``
    in memory (checked on every new activation and alarm), kept in the registry."""

    def __init__(self, registry: Registry, now: Callable[[], float]) -> None:
        self._registry = registry
        self._now = now
        self.reasons: dict[str, str] = {a: why for a, (why, _) in registry.quarantined().items()}

    def __contains__(self, address: object) -> bool:
        return address in self.reasons

    def add(self, address: str, reason: str) -> None:
        """Quarantine ``address`` (recorded with a plain write; the host syncs it soon)."""
        self.reasons[address] = reason
        self._registry.quarantine(address, reason, self._now())

    def discard(self, address: str) -> None:
        """Release ``address`` (a plain write, as ``add``'s)."""
        self.reasons.pop(address, None)
        self._registry.release(address)


class Registrar:
    """Registers new actors in the background, each once its own database is durable (so
    power loss cannot leave a registered actor without its file)."""

    def __init__(
        self,
        registry: Registry,
        now: Callable[[], float],
        sync_registry: Callable[[], Awaitable[None]],
        spawn: Callable[..., None],
    ) -> None:
        self._registry = registry
        self._now = now
        self._sync_registry = sync_registry
        self._spawn = spawn
        self._pending: set[str] = set()

    def soon(self, address: str, sync: Callable[[], Awaitable[None]]) -> None:
        """Register ``address`` once ``sync()`` (its database's) has made it durable."""
        if address not in self._pending:
            self._pending.add(address)
            self._spawn(self._register, address, sync)

    def pending(self, address: str) -> bool:
        """Whether ``address`` waits for its registration."""
        return address in self._pending

    async def _register(self, address: str, sync: Callable[[], Awaitable[None]]) -> None:
        try:
            await sync()  # the file and its directory entries survive power loss now
            self._registry.add(address, self._now())
            await self._sync_registry()
        except Exception as exc:  # evicted before its sync: it is registered when next opened
            log.debug("actor not registered yet", address=address, error=repr(exc))
        finally:
            self._pending.discard(address)


def _prefix_end(prefix: str) -> str | None:
    """The least string greater than every string that starts with ``prefix`` (None: there
    is none, every string does)."""
    prefix = prefix.rstrip("\U0010ffff")
    return prefix[:-1] + chr(ord(prefix[-1]) + 1) if prefix else None
