"""A simulation storage backend: every database in memory, on the trio thread.

Each database (a "file") keeps two images:

- the **committed** image: what a process crash keeps. While a connection is open it is the
  connection's own state minus any open transaction; when the connection closes (or its host
  incarnation crashes) it is serialized.
- the **durable** image: what power loss keeps, taken by ``sync()``.

Each host incarnation gets its own ``SimStorageView``. Crashing it fences the view: every
connection it handed out is rolled back, serialized and closed, so a late write of the dead
incarnation raises ``sqlite3.ProgrammingError`` (or ``Fenced``) and changes nothing. Power loss
then chooses, per file, whether the file keeps its committed image or rolls back to its durable
one, so files can be out of step as after a real power cut.
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Awaitable, Callable, Collection, Iterator

import trio

from actorkeep.errors import StorageDamaged

HOST_FILE = "host"


class Fenced(RuntimeError):
    """The host incarnation that opened this database has crashed."""


def _serialize(conn: sqlite3.Connection) -> bytes | None:
    """The database's image; None for a database with no pages yet (SQLite cannot serialize
    one, and a file with nothing written is as good as absent)."""
    if conn.execute("PRAGMA page_count").fetchone()[0] == 0:
        return None
    return conn.serialize()


#: How often a closed connection's sync looks whether the file's open transaction has ended.
_TRANSACTION_POLL = 0.01


def _connect(image: bytes | None) -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:", isolation_level=None, cached_statements=128)
    if image is not None:
        conn.deserialize(image)
    conn.execute("PRAGMA foreign_keys=ON")
    return conn


class SimFile:
    """One database file: its committed and durable images and its open connection."""

    __slots__ = ("committed", "durable", "durable_seq", "key", "live", "sync_seq")

    def __init__(self, key: str) -> None:
        self.key = key
        self.committed: bytes | None = None  # None: the file does not exist (yet)
        self.durable: bytes | None = None
        self.live: SimDatabase | None = None
        self.sync_seq = 0  # snapshots taken by sync(), in order
        self.durable_seq = 0  # the sequence number of the durable image

    def in_transaction(self) -> bool:
        """Whether the open connection is in a transaction (its committed image unknown)."""
        return self.live is not None and self.live.conn.in_transaction

    def image(self) -> bytes | None:
        """The committed image now (an open connection's state without its transaction)."""
        if self.live is not None:
            return self.live.committed_image()
        return self.committed


class SimDatabase:
    """A ``Database`` over an in-memory SQLite connection, fenced when its host crashes."""

    def __init__(self, storage: SimStorage, file: SimFile, view: SimStorageView) -> None:
        self._storage = storage
        self._file = file
        self._view = view
        self.conn = _connect(file.committed)
        self.closed = False
        self.fenced = False

    @property
    def key(self) -> str:
        return self._file.key

    @property
    def where(self) -> str:
        return f"sim:{self._file.key}"

    def committed_image(self) -> bytes | None:
        if self.conn.in_transaction:
            raise RuntimeError(
                f"sim: {self.key} has an open transaction; its committed image is unknown"
            )
        return _serialize(self.conn)

    def _check(self) -> None:
        if self.fenced:
            raise Fenced(f"{self.key}: the host incarnation that opened it has crashed")
        if self.closed:
            raise sqlite3.ProgrammingError(f"{self.key}: the database is closed")

    def start_sync(self, done: Callable[[BaseException | None], None]) -> bool:
        """As the file backend's: the committed state is taken now, and becomes durable when
        the fsync ends, in a task of the incarnation's (``SimStorageView.spawn``; without one,
        False: the gate's task awaits ``sync()``)."""
        spawn = self._view.spawn
        if spawn is None or self.fenced or self._file.in_transaction():
            return False  # sync() says why, or waits (or the gate's task does it the old way)
        image, seq, delay = self._begin()

        async def fsync() -> None:
            try:
                if delay > 0:
                    await trio.sleep(delay)
                self._end(image, seq)
            except Fenced as exc:
                done(exc)
                return
            done(None)

        spawn(fsync)
        return True

    async def sync(self) -> None:
        """Snapshot the committed state now; it becomes durable when the fsync ends. (A sync
        of a connection closed since still syncs the file, as an fsync of its path would.)"""
        while self.closed and not self.fenced and self._file.in_transaction():  # noqa: ASYNC110 (no event to wait on)
            # The file's next connection is in a transaction (a run's, decision 0030) whose
            # committed image the simulator cannot take: wait for its end. An fsync then
            # covers more than was asked, which a real one may do too.
            await trio.sleep(_TRANSACTION_POLL)
        image, seq, delay = self._begin()
        if delay > 0:
            await trio.sleep(delay)
        self._end(image, seq)

    def _begin(self) -> tuple[bytes | None, int, float]:
        """A sync's start: what it will make durable, its number, how long its fsync takes."""
        if self.fenced:
            raise Fenced(f"{self.key}: the host incarnation that opened it has crashed")
        file = self._file
        if self.closed:
            image = file.image()
        else:
            if self.conn.in_transaction:
                # The in-memory image includes the open transaction's pages, so the simulator
                # cannot tell what a real fsync would make durable. Fail loudly, not guess.
                raise RuntimeError(
                    "sim: sync() inside an open transaction is not simulated; end the "
                    "transaction first (exec_durable('COMMIT') does)"
                )
            image = _serialize(self.conn)
        file.sync_seq += 1
        return image, file.sync_seq, self._storage.fsync_delay()

    def _end(self, image: bytes | None, seq: int) -> None:
        """A sync's end: its image durable, unless the host crashed meanwhile (``Fenced``)."""
        if self.fenced:  # crashed while the fsync ran: it did not complete
            raise Fenced(f"{self.key}: the host incarnation that opened it has crashed")
        file = self._file
        if seq > file.durable_seq:
            file.durable, file.durable_seq = image, seq
        self._storage.synced(self)
        if self.fenced:  # the hook may crash the host right after the fsync
            raise Fenced(f"{self.key}: the host incarnation that opened it has crashed")

    look_at = 1 << 62  # never worth asking

    def checkpoint_due(self) -> bool:
        return False  # an image in memory has no log to checkpoint

    async def prepare_checkpoint(self) -> None:
        """Nothing to do (never due)."""

    async def checkpoint(self) -> None:
        """Nothing to do: there is no log."""

    def close(self) -> None:
        """Keep the committed image and close (idempotent; a no-op once fenced)."""
        if self.closed or self.fenced:
            return
        self.closed = True
        if self.conn.in_transaction:
            self.conn.execute("ROLLBACK")
        if self._file.live is self:
            self._file.committed = _serialize(self.conn)
            self._file.live = None
        self._view.opened.discard(self)
        self.conn.close()

    def fence(self) -> None:
        """The crash: drop the open transaction, keep what was committed, refuse all use."""
        if self.closed or self.fenced:
            return
        self.fenced = True
        if self.conn.in_transaction:
            self.conn.execute("ROLLBACK")
        if self._file.live is self:
            self._file.committed = _serialize(self.conn)
            self._file.live = None
        self.conn.close()


class SimStorageView:
    """The ``StorageBackend`` one host incarnation sees."""

    def __init__(self, storage: SimStorage, incarnation: int) -> None:
        self.storage = storage
        self.incarnation = incarnation
        self.opened: set[SimDatabase] = set()
        self.fenced = False
        #: Starts a task of the incarnation's (the world sets it): where the fsyncs that the
        #: output gate starts at a gated write run, as the file backend's run off its loop.
        self.spawn: Callable[[Callable[[], Awaitable[None]]], None] | None = None

    def open_actor(self, class_name: str, name: str, existing: bool = False) -> SimDatabase:
        key = f"actors/{class_name}/{name}"
        if existing and not self._exists(key):
            # Registered actors are durable (registry.py): power loss cannot do this.
            raise StorageDamaged("its database file is missing", f"sim:{key}")
        return self._open(key)

    def exists(self, class_name: str, name: str) -> bool:
        return self._exists(f"actors/{class_name}/{name}")

    def _exists(self, key: str) -> bool:
        file = self.storage.files.get(key)
        return file is not None and (file.live is not None or file.committed is not None)

    def actors(self) -> Iterator[tuple[str, str]]:
        for key in sorted(self.storage.files):
            if key.startswith("actors/") and self._exists(key):
                class_name, _, name = key[len("actors/") :].partition("/")
                yield class_name, name

    def has_actors(self) -> bool:
        return any(k.startswith("actors/") and self._exists(k) for k in self.storage.files)

    async def remove_actor(self, class_name: str, name: str) -> int:
        """Delete the file, durably at once (an unlink and the sync of its directory, which
        takes an fsync's time)."""
        if self.fenced:
            raise Fenced(f"host incarnation {self.incarnation} has crashed")
        key = f"actors/{class_name}/{name}"
        file = self.storage.files.pop(key, None)
        if file is None:
            return 0
        if file.live is not None:
            file.live.close()
        await trio.sleep(self.storage.fsync_delay())  # the directory's sync
        if self.fenced:  # crashed meanwhile: the deletion is not answered
            raise Fenced(f"host incarnation {self.incarnation} has crashed")
        if self.storage.on_remove is not None:
            self.storage.on_remove(key)
        return len(file.committed or b"")

    def open_host_db(self) -> SimDatabase:
        return self._open(HOST_FILE)

    def set_aside_host_db(self) -> str:
        files = self.storage.files
        n = 1
        while f"{HOST_FILE}.damaged-{n}" in files:
            n += 1
        target = f"{HOST_FILE}.damaged-{n}"
        old = files.pop(HOST_FILE)
        old.key = target
        files[target] = old
        return target

    closing = 0  # databases close at once

    async def ready(self, class_name: str, name: str) -> None:
        """Nothing to wait for: databases close at once."""

    async def sync_all(self) -> None:
        """Every file's committed image becomes durable (as ``sync(2)``)."""
        if self.fenced:
            raise Fenced(f"host incarnation {self.incarnation} has crashed")
        for key in sorted(self.storage.files):
            file = self.storage.files[key]
            file.sync_seq += 1
            file.durable, file.durable_seq = file.image(), file.sync_seq

    def _open(self, key: str) -> SimDatabase:
        if self.fenced:
            raise Fenced(f"host incarnation {self.incarnation} has crashed; cannot open {key}")
        file = self.storage.file(key)
        if file.live is not None:
            # An evicted activation may not have closed its connection yet when the next one
            # opens: hand the committed state over and retire the old connection.
            old = file.live
            file.committed = old.committed_image()
            file.live = None
            old.close()
        db = SimDatabase(self.storage, file, self)
        file.live = db
        self.opened.add(db)
        return db

    def close(self) -> None:
        """The host closes its backend on exit; files stay in the storage."""

    def fence(self) -> None:
        self.fenced = True
        for db in sorted(self.opened, key=lambda d: d.key):
            db.fence()
        self.opened.clear()


class SimStorage:
    """All files of one simulated machine, across host incarnations.

    ``fsync_delay`` returns the virtual seconds each ``sync()`` takes; ``on_sync`` is called
    after each completed sync and ``on_remove`` after each deleted database (the world uses
    them to crash a host right after a durable write or a deletion).
    """

    def __init__(
        self,
        fsync_delay: Callable[[], float] | None = None,
        on_sync: Callable[[SimDatabase], None] | None = None,
        on_remove: Callable[[str], None] | None = None,
    ) -> None:
        self.files: dict[str, SimFile] = {}
        self._fsync_delay = fsync_delay
        self.on_sync = on_sync
        self.on_remove = on_remove
        self.syncs = 0
        self._views: list[SimStorageView] = []

    def file(self, key: str) -> SimFile:
        file = self.files.get(key)
        if file is None:
            file = self.files[key] = SimFile(key)
        return file

    def fsync_delay(self) -> float:
        return self._fsync_delay() if self._fsync_delay is not None else 0.0

    def synced(self, db: SimDatabase) -> None:
        self.syncs += 1
        if self.on_sync is not None:
            self.on_sync(db)

    def view(self) -> SimStorageView:
        """A backend for a new host incarnation."""
        view = SimStorageView(self, len(self._views) + 1)
        self._views.append(view)
        return view

    def crash(self, view: SimStorageView) -> None:
        """A process crash of the incarnation using ``view``: everything committed is kept."""
        view.fence()

    def power_loss(
        self,
        view: SimStorageView | None,
        rng: random.Random | None,
        p_rollback: float = 0.5,
        files: Collection[str] = (),
    ) -> list[str]:
        """Power loss: fence ``view``, then each file keeps its committed image or (with
        probability ``p_rollback``, drawn from ``rng``) rolls back to its last durable one.
        Without ``rng``, exactly the ``files`` given roll back. Returns the files that
        changed, sorted."""
        if view is not None:
            view.fence()
        for file in self.files.values():
            if file.live is not None:
                raise RuntimeError(f"sim: power loss while {file.key} is open by a live host")
        rolled: list[str] = []
        for key in sorted(self.files):
            file = self.files[key]
            chosen = rng.random() < p_rollback if rng is not None else key in files
            if chosen and file.committed != file.durable:
                file.committed = file.durable
                rolled.append(key)
        return rolled

    def read(self, key: str, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        """Run a query on a copy of a file's committed image (for checkers and tests)."""
        file = self.files.get(key)
        image = file.image() if file is not None else None
        if image is None:
            return []
        conn = _connect(image)
        try:
            return conn.execute(sql, params).fetchall()
        finally:
            conn.close()

    def digest_parts(self) -> list[tuple[str, bytes | None, bytes | None]]:
        """Every file's committed and durable image, by key (for the trace hash)."""
        return [(k, self.files[k].image(), self.files[k].durable) for k in sorted(self.files)]
