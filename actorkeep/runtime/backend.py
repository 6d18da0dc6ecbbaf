"""The storage seam (docs/reference.md §3): where an actor's database lives and what makes a
write durable. storage.py has the production backend, sim/storage.py the simulator's."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from typing import Protocol


class Database(Protocol):
    """One SQLite database as the host uses it."""

    conn: sqlite3.Connection

    @property
    def where(self) -> str:
        """Where the database lives, for logs and error messages (a file's path)."""

    async def sync(self) -> None:
        """Make every write committed so far durable (survive power loss)."""

    def start_sync(self, done: Callable[[BaseException | None], None]) -> bool:
        """Start a sync of every write committed so far, now, without a task of its own, and
        call ``done(None)`` or ``done(error)`` on the trio thread once it ended (never from
        inside this call). False: nothing started, the caller awaits ``sync()`` instead."""

    #: ``conn.total_changes`` from which ``checkpoint_due()`` is worth asking (the host
    #: compares after every event).
    look_at: int

    def checkpoint_due(self) -> bool:
        """Whether the write-ahead log has grown enough to be checkpointed."""

    async def prepare_checkpoint(self) -> None:
        """Copy most of the write-ahead log into the database while the actor goes on."""

    async def checkpoint(self) -> None:
        """Copy the rest of the write-ahead log into the database and empty it. The caller
        makes sure nothing uses the connection until it returns."""

    def close(self) -> None:
        """Close the connection; uncommitted work is rolled back."""


class StorageBackend(Protocol):
    """Where databases live. Injected into the host."""

    def open_actor(self, class_name: str, name: str, existing: bool = False) -> Database:
        """Open (creating if needed) the database of a validated actor address.

        ``existing``: the host knows the actor existed; a database that is gone, empty or
        has lost committed writes raises ``StorageDamaged`` instead of starting afresh."""

    def exists(self, class_name: str, name: str) -> bool:
        """Whether the actor has a database (without creating one)."""

    def actors(self) -> Iterator[tuple[str, str]]:
        """``(class_name, name)`` of every actor database, in no particular order."""

    def has_actors(self) -> bool:
        """Whether any actor database may exist (cheap: no full listing)."""

    async def remove_actor(self, class_name: str, name: str) -> int:
        """Delete the actor's database, durably, once its last close has run; how many bytes
        it held (0: there was none). The host has closed it and opens it no more meanwhile."""

    def open_host_db(self) -> Database:
        """Open the host's own database (the alarm index and the actor registry)."""

    def set_aside_host_db(self) -> str:
        """Move a damaged host database out of the way (closed); where it went."""

    @property
    def closing(self) -> int:
        """How many databases are closing in the background (their files still open)."""

    async def ready(self, class_name: str, name: str) -> None:
        """Until the actor's database may be opened here: one of its databases that is being
        closed has closed (a backend may close databases in the background), and a backend
        that keeps actors elsewhere has fetched it."""

    async def sync_all(self) -> None:
        """Make every database's committed writes durable (after a rebuild registered actors
        whose files nobody synced)."""

    def close(self) -> None:
        """Release whatever the backend holds."""
