"""The storage backend seam (SPEC §3) and the production backend: one SQLite file per actor.

A backend opens databases; a database is a ``sqlite3.Connection`` plus ``sync()``, which makes
every write committed so far survive power loss. The file backend commits with
``synchronous=NORMAL`` in WAL mode (a commit survives a process crash) and ``sync()`` fsyncs the
WAL off the event loop, so durable writes of many actors overlap. The simulator supplies a
backend that keeps SQLite in memory and runs everything on the trio thread.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
from pathlib import Path
from typing import Protocol

import trio

from .address import actor_path

# Memory bound per open actor; pages are only allocated as used (SQLite's default is 2 MiB).
CACHE_KIB = 512


class Database(Protocol):
    """One SQLite database as the host uses it."""

    conn: sqlite3.Connection

    @property
    def where(self) -> str:
        """Where the database lives, for logs and error messages (a file's path)."""

    async def sync(self) -> None:
        """Make every write committed so far durable (survive power loss)."""

    def close(self) -> None:
        """Close the connection; uncommitted work is rolled back."""


class StorageBackend(Protocol):
    """Where databases live. Injected into the host."""

    def open_actor(self, class_name: str, name: str) -> Database:
        """Open (creating if needed) the database of a validated actor address."""

    def exists(self, class_name: str, name: str) -> bool:
        """Whether the actor has a database (without creating one)."""

    def open_host_db(self) -> Database:
        """Open the host's own database (the alarm index)."""

    def close(self) -> None:
        """Release whatever the backend holds."""


def configure_connection(conn: sqlite3.Connection) -> None:
    """The pragmas every actorkeep database runs with."""
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
    conn.execute("PRAGMA foreign_keys=ON")


class FileDatabase:
    """A database in a file, made durable by fsyncing its WAL in a worker thread."""

    def __init__(self, path: Path, new_dirs: list[Path], in_thread: bool = True) -> None:
        self.path = path
        self.where = str(path)
        self._wal = Path(f"{path}-wal")
        # Directories whose entries must be fsynced once for new files to survive power loss:
        # the file's own directory (the WAL is created there) and the parent of every
        # directory created for it.
        self._dirs_to_sync = [path.parent, *new_dirs]
        self._in_thread = in_thread
        self.conn = sqlite3.connect(path, isolation_level=None, cached_statements=128)
        try:
            configure_connection(self.conn)
        except BaseException:
            self.conn.close()
            raise

    async def sync(self) -> None:
        if self._in_thread:
            await trio.to_thread.run_sync(self._fsync)
        else:
            self._fsync()

    def _fsync(self) -> None:
        target = self._wal if self._wal.exists() else self.path
        _fsync_path(target, data_only=True)
        if self._dirs_to_sync:
            for d in self._dirs_to_sync:
                _fsync_path(d)
            self._dirs_to_sync = []

    def close(self) -> None:
        self.conn.close()


# fdatasync flushes the data and the metadata needed to read it back (the size of a growing
# WAL) but not timestamps: what SQLite itself uses for its syncs. macOS has no fdatasync.
_datasync = getattr(os, "fdatasync", os.fsync)


def _fsync_path(path: Path, data_only: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        (_datasync if data_only else os.fsync)(fd)
    finally:
        os.close(fd)


class DataDirInUse(OSError):
    """Another host holds the data directory."""


class FileStorage:
    """The production backend: ``<root>/actors/<class>/<aa>/<bb>/<name>.sqlite``.

    While a host has it open, ``<root>/host/lock`` holds an exclusive lock, so that two hosts
    never run the same actors (and fire the same alarms) from one directory.
    """

    def __init__(self, root: str | os.PathLike[str], in_thread: bool = True) -> None:
        self.root = Path(root).resolve()
        self._actors = self.root / "actors"
        self._in_thread = in_thread
        self._lock_fd: int | None = None

    def open_actor(self, class_name: str, name: str) -> Database:
        return self._open(actor_path(self._actors, class_name, name))

    def exists(self, class_name: str, name: str) -> bool:
        return actor_path(self._actors, class_name, name).exists()

    def open_host_db(self) -> Database:
        db = self._open(self.root / "host" / "host.sqlite")
        try:
            self._lock()
        except BaseException:
            db.close()
            raise
        return db

    def _lock(self) -> None:
        if self._lock_fd is not None:
            return
        fd = os.open(self.root / "host" / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DataDirInUse(
                f"data directory {str(self.root)!r} is in use by another host"
            ) from None
        self._lock_fd = fd

    def _open(self, path: Path) -> FileDatabase:
        new_dirs: list[Path] = []
        d = path.parent
        while not d.exists():
            new_dirs.append(d.parent)
            d = d.parent
        if new_dirs:
            path.parent.mkdir(parents=True, exist_ok=True)
        return FileDatabase(path, new_dirs, self._in_thread)

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the lock
            self._lock_fd = None
