"""The production storage backend (the seam is backend.py): one SQLite file per actor.

A backend opens databases; a database is a ``sqlite3.Connection`` plus ``sync()``, which makes
every write committed so far survive power loss. The file backend commits in WAL mode (a commit
survives a process crash) and never fsyncs or checkpoints on the event loop: ``sync()`` fsyncs
the WAL in a sync thread (syncer.py), SQLite's automatic checkpoints are off, and an actor's
log is checkpointed by a sync thread while the actor takes no event (decision 0015). The
simulator supplies a backend that keeps SQLite in memory and runs everything on the trio
thread.

Damage is reported as ``StorageDamaged`` (docs/reliability.md, "Damaged storage"): an actor the
host knows existed whose file is gone or empty, whose write-ahead log is gone while commits in
it were never copied into the database, or whose file fails SQLite's ``quick_check``.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import trio

from ..address import actor_path
from ..errors import StorageDamaged
from .backend import Database, StorageBackend
from .damage import (
    IDENTITY_TABLE,
    check_database,
    is_damage,
    lost_wal_frames,
    out_of_descriptors,
    read_address,
    read_ahead,
)
from .dirlock import DataDirInUse, lock_data_dir
from .files import actor_files, delete_database
from .syncer import Done, Syncer, started_and_ended

__all__ = [
    "IDENTITY_TABLE",
    "DataDirInUse",
    "Database",
    "FileDatabase",
    "FileStorage",
    "StorageBackend",
    "check_database",
    "configure_connection",
    "is_damage",
    "lost_wal_frames",
    "out_of_descriptors",
    "read_address",
]

# Memory bound per open actor; pages are only allocated as used (SQLite's default is 2 MiB).
CACHE_KIB = 512
#: Files up to this size are checked with ``PRAGMA quick_check`` when opened (about 1 ms per
#: MiB on the event loop); larger ones only by SQLite's own checks as pages are read.
QUICK_CHECK_MAX_BYTES = 4 << 20
#: An actor's write-ahead log past this size is checkpointed into its database (and when the
#: actor leaves memory). Each checkpoint holds the actor's events for its last step; larger
#: logs mean fewer of those pauses, and more disk per busy actor.
WAL_CHECKPOINT_BYTES = 16 << 20
#: Copies of the log while the actor goes on, before the last step that holds it, and how
#: many frames (pages) may be left for that step.
PRECOPY_ROUNDS = 3
PRECOPY_LEFT_FRAMES = 256
#: Rows changed between two looks at the size of an actor's log (a ``stat`` each).
CHECKPOINT_LOOK_EVERY = 256


def configure_connection(conn: sqlite3.Connection, synchronous: str = "NORMAL") -> None:
    """The pragmas every actorkeep database runs with (``synchronous`` first: switching a new
    file to WAL is a commit, which it governs)."""
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
    conn.execute("PRAGMA foreign_keys=ON")
    # Extra sanity checks of each b-tree cell as it is read: damage is reported, not served.
    conn.execute("PRAGMA cell_size_check=ON")


class FileDatabase:
    """A database in a file. Its syncs, checkpoints and close run in sync threads.

    An actor's connection runs with ``synchronous=OFF``: SQLite itself never fsyncs on the
    event loop. That is safe because nothing else differs from ``NORMAL`` in WAL mode once
    SQLite never checkpoints on that connection: commits do not sync under ``NORMAL`` either,
    ``sync()`` fsyncs the log, and the log only ever starts afresh in ``checkpoint()``, which
    syncs what it copies and writes the new log's header under ``NORMAL`` (synced) before the
    connection writes frames over the old ones.
    The host database (``host_db``) is written from the event loop at any time, so nothing
    can keep it still for a checkpoint: a second connection copies its log in the background
    (PASSIVE) and its own connection runs with ``NORMAL`` after the first sync, so that SQLite
    syncs the header of its log itself when it starts the log afresh. That header sync, once
    per ``WAL_CHECKPOINT_BYTES`` of host database log, is the one fsync left on the event loop.
    """

    def __init__(
        self,
        path: Path,
        new_dirs: list[Path],
        syncer: Syncer | None,
        host_db: bool = False,
        closes: dict[Path, trio.Event] | None = None,
    ) -> None:
        self.path = path
        self.where = str(path)
        self._wal = Path(f"{path}-wal")
        self._wal_path = str(self._wal)
        # Synced once for a new file: the file itself (switching it to WAL wrote its header
        # without a sync), its directory (the WAL is created there) and the parent of every
        # directory created for it.
        self._first_sync: list[Path] | None = [path.parent, *new_dirs]
        self._new_file = not path.exists()
        self._syncer = syncer
        self._host_db = host_db
        self._closes: dict[Path, trio.Event] = {} if closes is None else closes
        self.conn = sqlite3.connect(
            path, isolation_level=None, cached_statements=128, check_same_thread=False
        )
        try:
            # OFF while the file is set up: a new file's switch to WAL syncs nothing on the
            # event loop (its first sync() makes the file durable).
            configure_connection(self.conn, "OFF")
            self.conn.execute("PRAGMA wal_autocheckpoint=0")
            # Closing any descriptor of a file drops every POSIX lock the process holds on it,
            # SQLite's too: then another process that opens the database thinks it is alone,
            # rebuilds the -shm index under us or deletes the log we write to. So the files
            # SQLite locks (the database and its -shm) are opened once here, or when -shm
            # first exists, and closed only after the connection (_close).
            self._fd: int | None = os.open(path, os.O_RDONLY)
        except BaseException:
            self.conn.close()
            raise
        self._shm_fd: int | None = None
        # Each descriptor's lock: held while it is used, so that _close never closes it in
        # use. Two, so that the event loop's reads of -shm never wait for a file's fsync.
        self._fd_lock = threading.Lock()
        self._shm_lock = threading.Lock()
        self.look_at = CHECKPOINT_LOOK_EVERY
        self._normal = False  # the host database runs with NORMAL after its first sync
        self._pin: sqlite3.Connection | None = None  # a snapshot held between checkpoint steps
        # Checkpoint steps and the close run in sync threads, perhaps two at once: in turn.
        self._steps = threading.Lock()
        self._closed = False

    async def _run(self, fn: Callable[[], None], what: str) -> None:
        if self._syncer is None:
            fn()
        else:
            await self._syncer.run(fn, what)

    def start_sync(self, done: Done) -> bool:
        """Start a sync of every write committed so far, now, and call ``done(None)`` or
        ``done(error)`` on the trio thread once it ended; False (nothing started) for the
        host database and without sync threads, whose syncs are awaited (``sync``)."""
        syncer = self._syncer
        if syncer is None or self._host_db:
            return False
        ring = syncer.ring
        if ring is None or self._first_sync is not None:
            syncer.start(self._fsync, done)
            return True

        # The common case, a log's fdatasync, goes through the ring: no thread (0026).
        def ended(error: OSError | None) -> None:
            if isinstance(error, FileNotFoundError):  # no log: all is in the database file
                syncer.start(self._sync_file, done)
            else:
                done(error)

        syncer.start_datasync(ring, self._wal_path, ended)
        return True

    async def sync(self) -> None:
        if not await started_and_ended(self.start_sync):
            await self._run(self._fsync, "sync")
        if self._host_db and not self._normal and not self._closed and not self.conn.in_transaction:
            # From the first sync on (the log it writes at open needs no synced header: a log
            # SQLite found valid is appended to, not restarted), the host database's own log
            # restarts after a background checkpoint sync their header (see the class).
            self.conn.execute("PRAGMA synchronous=NORMAL")
            self._normal = True

    def _fsync(self) -> None:
        try:
            _fsync_path(self._wal, data_only=True)  # SQLite locks nothing in the log itself
        except FileNotFoundError:  # no log: all is in the database file
            self._sync_file()
        first, self._first_sync = self._first_sync, None
        if first is not None:
            if self._new_file:
                self._sync_file()
            for d in first:
                _fsync_path(d)
        # Only once the host database's connection is NORMAL: a complete copy lets that
        # connection start the log afresh, and only NORMAL syncs the new header.
        if self._host_db and self._normal and self._log_bytes() > WAL_CHECKPOINT_BYTES:
            self._checkpoint_host_db()

    def _sync_file(self) -> None:
        with self._fd_lock:
            if self._fd is not None:
                _datasync(self._fd)
            # else closed: the close checkpointed under NORMAL, which synced the file

    def checkpoint_due(self) -> bool:
        self.look_at = self.conn.total_changes + CHECKPOINT_LOOK_EVERY
        return not self._host_db and self._log_bytes() > WAL_CHECKPOINT_BYTES

    def _log_bytes(self) -> int:
        """The bytes of the log's frames since it last started afresh (the file itself keeps
        its size), read off the shared wal-index header SQLite keeps in ``-shm``."""
        header = self.wal_index_header(24)
        if len(header) < 24:
            return 0
        # In the machine's byte order: szPage (u16, 1 for 65536) at 14, mxFrame (u32) at 16.
        page, frames = struct.unpack_from("=HI", header, 14)
        return int(frames) * ((65536 if page == 1 else int(page)) + 24)

    def wal_index_header(self, size: int = 96) -> bytes:
        """The first ``size`` bytes of ``-shm`` (SQLite's wal-index: its header, twice), read
        through the descriptor this database keeps; empty if there is none (yet, or closed).
        Never open ``-shm`` yourself while the database is open: closing that descriptor would
        drop SQLite's locks on it."""
        with self._shm_lock:
            if self._shm_fd is None:
                if self._closed:
                    return b""
                try:
                    self._shm_fd = os.open(f"{self.path}-shm", os.O_RDONLY)
                except FileNotFoundError:
                    return b""
            return os.pread(self._shm_fd, size, 0)

    async def prepare_checkpoint(self) -> None:
        await self._run(self._prepare_checkpoint, "checkpoint, first step")

    def _prepare_checkpoint(self) -> None:
        # In a sync thread, while the actor goes on writing. A reader connection pins a
        # snapshot first: while it holds one, SQLite never starts the log afresh (which, with
        # OFF, would not sync the new header). Then a second connection copies the log up to
        # that snapshot (PASSIVE: it never blocks the writer) and syncs the database. The
        # pin stays until checkpoint().
        with self._steps:
            if not self._closed:
                self._copy_log()

    def _copy_log(self) -> None:
        # While the copy runs the actor writes on: copy again (a new pin taken before the old
        # one goes) until what is left for checkpoint() is small.
        copier = sqlite3.connect(self.path, isolation_level=None)
        try:
            copier.execute("PRAGMA synchronous=NORMAL")
            for _ in range(PRECOPY_ROUNDS):
                pin = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
                try:
                    pin.execute("BEGIN")
                    pin.execute("SELECT count(*) FROM sqlite_master").fetchone()
                except BaseException:
                    pin.close()
                    raise
                self._unpin()
                self._pin = pin
                _, frames, copied = copier.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                if frames - copied <= PRECOPY_LEFT_FRAMES:
                    break
        finally:
            copier.close()

    def _unpin(self) -> None:
        pin, self._pin = self._pin, None
        if pin is not None:
            pin.close()  # ends its read transaction

    async def checkpoint(self) -> None:
        await self._run(self._checkpoint, "checkpoint")

    def _checkpoint(self) -> None:
        # In a sync thread, while the trio thread leaves the connection alone (the actor takes
        # no event): what prepare_checkpoint left is little. With NORMAL the checkpoint syncs
        # the log before copying it and the database after.
        with self._steps:
            if not self._closed:
                self._restart_log()

    def _restart_log(self) -> None:
        self._unpin()
        conn = self.conn
        conn.execute("PRAGMA synchronous=NORMAL")
        busy = conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()[0]
        if busy:
            # A reader outside the host holds a snapshot. The connection stays NORMAL, under
            # which SQLite syncs the log's header itself if it restarts the log; try later.
            return
        # The log is all copied: the next write starts it afresh from its first frame, over
        # the old ones. Make that write here, under NORMAL, which syncs the new header before
        # any frame is written. (Setting user_version to itself writes one page and changes
        # nothing.) The file keeps its size: later fdatasyncs rewrite blocks in place, about
        # half the cost of syncing a log that grows.
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        conn.execute(f"PRAGMA user_version={int(version)}")
        conn.execute("PRAGMA synchronous=OFF")

    def _checkpoint_host_db(self) -> None:
        # The host database is written from the trio thread at any time: a second connection
        # copies its log without blocking it (PASSIVE); the host's connection (NORMAL) resets
        # the log when it next writes.
        conn = sqlite3.connect(self.path, isolation_level=None)
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        finally:
            conn.close()

    def close(self) -> None:
        if self._syncer is None:
            self._close()
            return
        # SQLite checkpoints when the last connection closes, holding the file exclusively:
        # the actor's next database waits for that (FileStorage.ready), or it would find the
        # file locked.
        closes, path, event = self._closes, self.path, trio.Event()
        closes[path] = event

        def closed() -> None:
            event.set()
            if closes.get(path) is event:
                del closes[path]

        self._syncer.submit(self._close, f"close {self.where}", closed)

    def _close(self) -> None:
        # The last connection to close checkpoints the log into the database: with NORMAL,
        # that checkpoint syncs before the log is deleted.
        with self._steps:
            self._closed = True
            try:
                self._unpin()
                self.conn.execute("PRAGMA synchronous=NORMAL")
            finally:
                self.conn.close()
                with self._fd_lock:
                    if self._fd is not None:
                        os.close(self._fd)
                        self._fd = None
                with self._shm_lock:
                    if self._shm_fd is not None:
                        os.close(self._shm_fd)
                        self._shm_fd = None


# fdatasync flushes the data and the metadata needed to read it back (the size of a growing
# WAL) but not timestamps: what SQLite itself uses for its syncs. macOS has no fdatasync.
_datasync = getattr(os, "fdatasync", os.fsync)


def _fsync_path(path: Path, data_only: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        (_datasync if data_only else os.fsync)(fd)
    finally:
        os.close(fd)


class FileStorage:
    """The production backend: ``<root>/actors/<class>/<aa>/<bb>/<name>.sqlite``.

    While a host has it open, ``<root>/host/lock`` holds an exclusive lock, so that two hosts
    never run the same actors (and fire the same alarms) from one directory.
    """

    def __init__(self, root: str | os.PathLike[str], in_thread: bool = True) -> None:
        self.root = Path(root).resolve()
        self._actors = self.root / "actors"
        self._host_db = self.root / "host" / "host.sqlite"
        #: The sync threads; None (``in_thread=False``): syncs run where they are awaited.
        self.syncer: Syncer | None = Syncer() if in_thread else None
        self._closes: dict[Path, trio.Event] = {}  # databases whose close runs in a sync thread
        self._lock_fd: int | None = None

    def open_actor(self, class_name: str, name: str, existing: bool = False) -> FileDatabase:
        path = actor_path(self._actors, class_name, name)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            if existing:
                raise StorageDamaged("its database file is missing", str(path)) from None
            return self._open(path)
        if size == 0 and existing:
            raise StorageDamaged("its database file is empty", str(path))
        lost = lost_wal_frames(path) if existing else 0
        if lost:
            raise StorageDamaged(
                f"its write-ahead log (-wal) is missing with {lost} frames that were never "
                "copied into the database: opening it would lose those commits",
                str(path),
            )
        db = self._open(path)
        if 0 < size <= QUICK_CHECK_MAX_BYTES:
            problem = check_database(db.conn)
            if problem is not None:
                db.close()
                raise StorageDamaged(f"it fails SQLite's quick_check: {problem}", str(path))
        return db

    def exists(self, class_name: str, name: str) -> bool:
        return actor_path(self._actors, class_name, name).exists()

    def actors(self) -> Iterator[tuple[str, str]]:
        return actor_files(self._actors)

    async def remove_actor(self, class_name: str, name: str) -> int:
        path = actor_path(self._actors, class_name, name)
        await self.ready(class_name, name)  # its last close has run
        if self.syncer is None:
            return delete_database(path)
        return await self.syncer.run(lambda: delete_database(path), f"delete {path}")

    def has_actors(self) -> bool:
        try:
            with os.scandir(self._actors) as entries:
                return any(True for _ in entries)
        except FileNotFoundError:
            return False

    def open_host_db(self) -> FileDatabase:
        self._host_db.parent.mkdir(parents=True, exist_ok=True)
        self._lock()  # before the file is touched: it may be set aside and rebuilt
        lost = lost_wal_frames(self._host_db)
        if lost:
            raise StorageDamaged(
                f"its write-ahead log (-wal) is missing with {lost} frames that were never "
                "copied into the database",
                str(self._host_db),
            )
        read_ahead(self._host_db)
        return self._open(self._host_db, host_db=True)

    def set_aside_host_db(self) -> str:
        n = 1
        while Path(f"{self._host_db}.damaged-{n}").exists():
            n += 1
        target = f"{self._host_db}.damaged-{n}"
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.replace(f"{self._host_db}{suffix}", f"{target}{suffix}")
        _fsync_path(self._host_db.parent)
        return target

    @property
    def closing(self) -> int:
        return len(self._closes)

    async def ready(self, class_name: str, name: str) -> None:
        if self._closes:
            event = self._closes.get(actor_path(self._actors, class_name, name))
            if event is not None:
                await event.wait()

    async def sync_all(self) -> None:
        # syncfs(2) of the data directory's file system would do; os.sync is what Python has.
        if self.syncer is None:
            os.sync()
        else:
            await self.syncer.run(os.sync, "sync all")

    def _lock(self) -> None:
        if self._lock_fd is None:
            self._lock_fd = lock_data_dir(self.root)

    def _open(self, path: Path, host_db: bool = False) -> FileDatabase:
        new_dirs: list[Path] = []
        d = path.parent
        while not d.exists():
            new_dirs.append(d.parent)
            d = d.parent
        if new_dirs:
            path.parent.mkdir(parents=True, exist_ok=True)
        return FileDatabase(path, new_dirs, self.syncer, host_db, self._closes)

    def close(self) -> None:
        if self.syncer is not None:
            self.syncer.close()  # every close given to it has run: the files are consistent
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the lock
            self._lock_fd = None
