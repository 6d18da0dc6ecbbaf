"""The cluster's storage backend (decision 0016): actors' SQLite files on this host are working
copies; what is durable is what the store holds.

- An actor opens here only while this host holds its partition's lease; before its first open
  under an epoch, its file is restored from the store (``ready``).
- A sync is the actor's frames committed to the store under the lease's epoch, through the
  group commit (``Committer``): the output gate's durable point. Nothing is fsynced locally.
- A checkpoint ships the log first: once SQLite starts its log afresh, the old frames are only
  in the local file.
- A sync that fails (fenced, the lease lost, the store unreachable) leaves the local file
  unknown: the actor's next open restores it from the store.
- A database that closes (its actor leaves memory, the host stops) ships what it had not: its
  plain writes survive that, as on a single host. They are lost when the host dies before a
  sync or a close ships them (for plain writes a host's death is what power loss is to a
  single host).

``run()`` must run beside the host (it keeps the leases and runs the commits). After each tick
it loads the alarm index of the partitions taken and drops that of the partitions lost
(``alarms``, the host's ``AlarmIndex``: ``Host(..., alarm_index=lambda _: storage.alarms)``).
Before each tick it hands over the partitions the keeper marked leaving: once no event or
commit of one is in flight, its open actors are taken out of memory (``evict``, which the
router gives: their closes ship what they had not), and once those closes are committed the
tick releases it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Awaitable, Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import structlog
import trio

from ..address import actor_path
from ..errors import RemoteError, StorageDamaged
from ..runtime.storage import FileDatabase, FileStorage
from ..runtime.syncer import Syncer
from .alarms import ClusterAlarmIndex
from .committer import Committer, Ticket
from .database import ClusterDatabase, NotServedHere, StoreUnreachable
from .frames import LogFormatError
from .keeper import LeaseKeeper
from .nonblocking import NonblockingCommits
from .partitions import partition_of
from .records import AlarmChange, Fenced, Store, StoreError, Write
from .replica import Replica, compact, held
from .store import ClusterStore
from .syncs import SyncsInFlight

__all__ = ["ClusterDatabase", "ClusterStorage", "NotServedHere", "StoreUnreachable"]

log = structlog.get_logger("actorkeep")

#: Batches of an actor in the store past its image before they are folded into a new image.
COMPACT_AFTER = 64


class ClusterStorage:
    """The ``StorageBackend`` of a cluster host: local files under ``root`` (as
    ``FileStorage``), the store and this host's leases. ``run_store(fn)`` runs a call of the
    store (``fn()``, which blocks) and awaits its result: in a sync thread of the storage's own
    by default; the simulator runs it on the trio thread, with its latencies and faults. The
    commits of a ``ClusterStore`` run on the trio thread (``commit_now``) unless ``run_store``
    is given.
    ``files_in_thread=False``: the local files' closes and checkpoints run where they are
    awaited (the simulator: no threads)."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        store: Store,
        keeper: LeaseKeeper,
        run_store: Callable[[Callable[[], Any]], Awaitable[Any]] | None = None,
        files_in_thread: bool = True,
    ) -> None:
        #: What runs the group commits (a test's or the simulator's subclass may stand in).
        self.committer_class: type[Committer] = Committer
        self.files = FileStorage(root, in_thread=files_in_thread)
        self.store = store
        self.keeper = keeper
        #: The alarm index of the partitions this host holds.
        self.alarms = ClusterAlarmIndex(keeper, store.partitions)
        self._actors = self.files.root / "actors"
        self._restored: dict[str, int] = {}  # address: the epoch its local file is current for
        # address: (the last batch the store has of it, whether it has anything), at restore
        self._loaded: dict[str, tuple[int, bool]] = {}
        # address: batches the store holds of it past its image (compacted past COMPACT_AFTER)
        self._batches: dict[str, int] = {}
        self._compacting: set[str] = set()
        #: ``COMPACT_AFTER`` unless a test says otherwise.
        self.compact_after = COMPACT_AFTER
        self._committer: Committer | None = None
        self._nursery: trio.Nursery | None = None
        self._refreshing = False
        self._open: dict[str, ClusterDatabase] = {}  # by address
        #: The commits running, by address (of open or closed databases).
        self.syncs = SyncsInFlight(keeper)
        # The store's own threads: the host closes its storage (and so the files' threads)
        # before run() hands the leases over. The commits have one of their own, so that they
        # never queue behind control calls that wait (restores' loads, a renewal's lock).
        self._syncer = Syncer()
        self._commit_thread = Syncer(threads=1, ring=False)
        self._run_store = run_store
        self._nonblocking = (
            NonblockingCommits(store.commits, self.in_commit_thread)
            if run_store is None and isinstance(store, ClusterStore)
            else None
        )
        self._ticked = trio.Event()
        #: Takes an actor out of memory if it is idle (whether it is out now): the host's,
        #: given by its router. Without it, a partition handed over with actors open goes
        #: only at the hand-over's limit.
        self.evict: Callable[[str], bool] = lambda address: False

    @property
    def committer(self) -> Committer:
        if self._committer is None:
            raise RuntimeError("ClusterStorage.run() is not running")
        return self._committer

    async def in_thread(self, fn: Callable[[], Any]) -> Any:
        """``fn()``, a call of the store, run by ``run_store`` (a sync thread by default)."""
        if self._run_store is not None:
            return await self._run_store(fn)
        return await self._syncer.run(fn, "cluster store")

    async def commit_now(self, writes: Sequence[Write], alarms: Sequence[AlarmChange]) -> None:
        """One commit of the committer's (``Store.commit``): on the trio thread for a
        ``ClusterStore`` (``NonblockingCommits``), else run by ``run_store``."""
        if self._nonblocking is not None:
            await self._nonblocking.commit(writes, alarms)
        else:
            await self.in_commit_thread(partial(self.store.commit, writes, alarms))

    async def in_commit_thread(self, fn: Callable[[], Any]) -> Any:
        """``fn()``, a commit of the store, run by ``run_store`` or the commits' own thread."""
        if self._run_store is not None:
            return await self._run_store(fn)
        return await self._commit_thread.run(fn, "cluster commit")

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Keep the leases (a tick every ``ttl / 3``) and run the group commits, until
        cancelled; a planned stop hands the partitions over."""
        async with trio.open_nursery() as nursery:
            committer = self.committer_class(self.commit_now, nursery.start_soon, self.alarms)
            self._committer = committer
            self._nursery = nursery
            nursery.start_soon(self.syncs.end_those_past_their_lease)
            await self.in_thread(self.keeper.tick)
            await self._follow_leases(nursery)
            task_status.started()
            failing = False
            try:
                while True:
                    await trio.sleep(self.keeper.settings.every)
                    try:
                        self._hand_over()
                        await self.in_thread(self.keeper.tick)
                        if failing:
                            failing = False
                            self.alarms.answered()
                        await self._follow_leases(nursery)
                    except Exception as exc:  # the store unreachable: the leases run out by
                        # this host's clock, and it stops serving them; it tries again
                        failing = True
                        log.warning("could not renew the cluster's leases", error=repr(exc))
                    finally:
                        ticked, self._ticked = self._ticked, trio.Event()
                        ticked.set()
            finally:
                self._nursery = None
                with trio.CancelScope(shield=True):
                    try:
                        await self.in_thread(self.keeper.release_all)
                    except Exception as exc:  # they expire instead
                        log.warning("could not hand the partitions over", error=repr(exc))
                    self._syncer.close()
                    self._commit_thread.close()
                    self.store.close()

    def _hand_over(self) -> None:
        """Before a tick: a partition being handed over is done with once no event or commit
        of it is in flight and none of its actors is open here: the idle ones are taken out
        of memory (their closes commit what they had not shipped, plain writes included);
        the tick releases what is done with."""
        keeper = self.keeper
        idle = {p for p in keeper.leaving if keeper.idle(p)}
        for db in [db for db in self._open.values() if db.partition in idle]:
            self.evict(db.address)  # busy (an alarm event): the next tick looks again
        still_open = {db.partition for db in self._open.values()}
        keeper.handed(frozenset(p for p in idle if keeper.idle(p) and p not in still_open))

    async def until_renewed(self, partition: int) -> None:
        """If the lease of ``partition`` lapsed by this host's clock with its renewal late,
        until the next tick, or one tick's interval: what waits to leave (a reply, a call, a
        commit) goes on if the renewal came, since no other host can have taken the partition
        meanwhile (a renewal needs the lease live and unchanged in the store)."""
        keeper = self.keeper
        if not keeper.lapsed(partition):
            return
        with trio.move_on_after(keeper.settings.every):
            while keeper.lapsed(partition):
                await self._ticked.wait()

    def committed(self, db: ClusterDatabase) -> None:
        """A batch of ``db`` is in the store: past ``compact_after`` batches since its image,
        fold them into a new image in the background, so that a restore stays one read of
        an image and a few batches."""
        address = db.address
        n = self._batches[address] = self._batches.get(address, 0) + 1
        if n < self.compact_after or address in self._compacting or self._nursery is None:
            return
        self._compacting.add(address)

        async def fold() -> None:
            try:
                while True:  # again if as many were committed meanwhile: they stay counted
                    folded = await self.in_thread(
                        lambda: compact(self.store, address, db.partition, db.epoch)
                    )
                    left = max(0, self._batches.get(address, 0) - folded)
                    self._batches[address] = left
                    if not folded or left < self.compact_after:
                        break
            except Exception as exc:  # fenced, or the store unreachable: the next batch tries
                log.info("could not compact an actor's batches", address=address, error=repr(exc))
            finally:
                self._compacting.discard(address)

        self._nursery.start_soon(fold)

    def refresh_owners_soon(self) -> None:
        """Read the partitions' owners again, in the background (one read at a time)."""
        nursery = self._nursery
        if nursery is None or self._refreshing:
            return
        self._refreshing = True

        async def refresh() -> None:
            try:
                await self.in_thread(self.keeper.refresh_owners)
            except Exception:  # the store unreachable: the next tick or retry reads them
                pass
            finally:
                self._refreshing = False

        nursery.start_soon(refresh)

    def commit_after_close(self, db: ClusterDatabase, write: Write | None) -> None:
        """Commit what a closed database had not shipped, in the background
        (``ClusterDatabase.commit_closed``); the actor's next open waits for it (``ready``)
        and restores from the store if it failed."""
        address, nursery = db.address, self._nursery
        if nursery is None:
            self.forget(address)
            db.close_commit_ended(NotServedHere(address))
            return
        self.syncs.change(address, db.partition, +1)

        async def commit() -> None:
            try:
                await db.commit_closed(write)
                self.shipped(address, write.seq if write is not None else 0)
            except BaseException as exc:
                self.forget(address)
                if not isinstance(exc, Exception):
                    raise
                log.warning("a closed actor's last writes were not committed",
                            address=address, error=repr(exc))  # fmt: skip
            finally:
                self.syncs.change(address, db.partition, -1)

        nursery.start_soon(commit)

    def hold_until_ended(self, address: str, partition: int, ticket: Ticket) -> None:
        """A commit no one waits for any more still counts as running for ``address`` (its
        next open waits for it) until it ends, whatever its outcome."""
        nursery = self._nursery
        if nursery is None:
            return
        self.syncs.change(address, partition, +1)

        async def wait() -> None:
            try:
                await ticket.wait()
            except Exception:  # its outcome no longer matters: the actor is restored after
                pass
            finally:
                self.syncs.change(address, partition, -1)

        nursery.start_soon(wait)

    def shipped(self, address: str, seq: int) -> None:
        """The store holds the actor up to batch ``seq``, as its local file does."""
        if address in self._restored:
            self._loaded[address] = (seq, True)

    async def settle(self, timeout: float = 10.0) -> None:
        """Until the commits of closed databases have ended (a planned stop waits for them
        before it hands the partitions over), or ``timeout``."""
        with trio.move_on_after(timeout):
            await self.syncs.all_ended()

    async def _follow_leases(self, nursery: trio.Nursery) -> None:
        """After a tick: the alarm index of partitions taken is loaded (their due alarms fire),
        that of partitions lost dropped; changes that no write carried are committed."""
        held, index = self.keeper.held, self.alarms
        for partition, epoch in list(index.loaded.items()):
            lease = held.get(partition)
            if lease is None or lease.epoch != epoch:
                index.drop(partition)
        taken = {p: x.epoch for p, x in held.items() if index.loaded.get(p) != x.epoch}
        if taken:
            parts = sorted(taken)
            index.loading(parts)  # changes made while the entries are read win over them
            rows = await self.in_thread(lambda: self.store.alarms_of(parts))
            entries: dict[int, list[tuple[str, float]]] = {p: [] for p in parts}
            for partition, address, at in rows:
                entries[partition].append((address, at))
            for partition, epoch in taken.items():
                lease = self.keeper.lease_for(partition)
                if lease is not None and lease.epoch == epoch:
                    index.load(partition, epoch, entries[partition])
        index.ticked()
        if index.pending:
            nursery.start_soon(self._commit_alarms)

    async def _commit_alarms(self) -> None:
        try:
            await self.committer.commit(None)
        except Exception as exc:  # they wait for the next commit
            log.info("could not commit the alarm index's changes yet", error=repr(exc))

    def forget(self, address: str) -> None:
        """The local file of ``address`` is not to be trusted (a sync failed, or the lease
        moved): its next open restores it from the store, without the plain writes the store
        did not have."""
        self._restored.pop(address, None)

    def commit_soon(self, db: ClusterDatabase) -> bool:
        """``db``'s sync goes in the committer's next batch (``ClusterDatabase.start_sync``)
        until ``syncs.sent(db)``; False if the commits do not run."""
        committer = self._committer
        if committer is None or self._nursery is None:
            return False
        self.syncs.sending(db)
        committer.submit_source(db)
        return True

    def spawn(self, fn: Callable[[], Awaitable[None]]) -> None:
        """Start ``fn()`` beside the commits (``run``'s nursery)."""
        if self._nursery is None:
            raise RuntimeError("ClusterStorage.run() is not running")
        self._nursery.start_soon(fn)

    def database_closed(self, db: ClusterDatabase) -> None:
        if self._open.get(db.address) is db:
            del self._open[db.address]

    def opened_under(self, address: str) -> int | None:
        """The epoch the actor's open database was opened under (None: not open)."""
        db = self._open.get(address)
        return None if db is None else db.epoch

    def _lease(self, class_name: str, name: str) -> tuple[str, int, int]:
        address = f"{class_name}/{name}"
        partition = partition_of(address, self.store.partitions)
        lease = self.keeper.lease_for(partition)
        if lease is None:
            raise NotServedHere(address)
        return address, partition, lease.epoch

    # -- StorageBackend -----------------------------------------------------------------
    async def ready(self, class_name: str, name: str) -> None:
        address = f"{class_name}/{name}"
        # An earlier activation's database still open (taken out of memory, its worker not
        # ended yet): a restore must not replace the file under it, and its close must not
        # take the new log with it. Wait for its close, then for the close's end.
        while (old := self._open.get(address)) is not None:
            await old.closed.wait()
        await self.files.ready(class_name, name)
        await self.syncs.ended(address)  # a closed database's commit: restore after its end
        address, _, epoch = self._lease(class_name, name)
        if self._restored.get(address) == epoch:
            return
        path = actor_path(self._actors, class_name, name)
        try:
            last, known = await self.in_thread(lambda: self._restore(path, address))
        except (psycopg.Error, StoreError) as exc:  # nothing of the event ran: try again
            raise StoreUnreachable(address) from exc
        except LogFormatError as exc:  # what the store holds of it does not add up
            raise StorageDamaged(str(exc), where=address) from exc
        self._loaded[address] = (last, known)
        self._restored[address] = epoch

    def _restore(self, path: Path, address: str) -> tuple[int, bool]:
        """In a thread: the actor's file as the store holds it; the store's last batch of it,
        and whether the store holds anything of it."""
        found = held(self.store, address)
        last, known, image = found.last, found.known, found.image
        self._batches[address] = found.batches
        for suffix in ("-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                Path(f"{path}{suffix}").unlink()
        if not image:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # nothing durable of it: it starts afresh
            return last, known
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".restore")
        tmp.write_bytes(image)
        tmp.replace(path)
        return last, known

    def open_actor(self, class_name: str, name: str, existing: bool = False) -> ClusterDatabase:
        address, partition, epoch = self._lease(class_name, name)
        if self._restored.get(address) != epoch:
            raise NotServedHere(address)  # not restored under this epoch: ready() first
        # What the store holds decides, not the local registry (restored files are new here).
        inner = self.files.open_actor(class_name, name, existing=False)
        try:
            inner.conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # log and index
            last, known = self._loaded[address]
            # An actor new to the cluster: its first image goes with its first sync.
            image = None if known else inner.conn.serialize()
            replica = Replica(self.store, address, partition)
            replica.resume(inner.where, last, inner.wal_index_header)
        except BaseException:
            inner.close()
            raise
        db = ClusterDatabase(self, inner, address, partition, epoch, replica, image)
        self._open[address] = db
        return db

    def exists(self, class_name: str, name: str) -> bool:
        return self.files.exists(class_name, name)

    def actors(self) -> Iterator[tuple[str, str]]:
        return self.files.actors()

    def has_actors(self) -> bool:
        return self.files.has_actors()

    async def remove_actor(self, class_name: str, name: str) -> int:
        """Delete all the store holds of the actor, fenced by its partition's epoch, then its
        local file. The host has closed it: the commit of what the close shipped ends first
        (it would bring the actor back)."""
        address = f"{class_name}/{name}"
        while (old := self._open.get(address)) is not None:
            await old.closed.wait()
        await self.files.ready(class_name, name)
        await self.syncs.ended(address)
        if address in self._compacting:  # its image is being written: it would come back
            raise RemoteError(409, "Busy", f"{address} is being compacted: try again")
        try:
            address, partition, epoch = self._lease(class_name, name)
            await self.in_thread(lambda: self.store.forget_actor(partition, epoch, address))
        except (NotServedHere, Fenced):
            raise RemoteError(409, "NotHere", f"{address} is not served by this host now") from None
        except (psycopg.Error, StoreError) as exc:
            # It may or may not be gone: the next open restores it from the store, whatever
            # the store holds now (its local file may be all that is left of a deleted one).
            self._forget_actor(address)
            raise StoreUnreachable(address) from exc
        self._forget_actor(address)
        return await self.files.remove_actor(class_name, name)

    def _forget_actor(self, address: str) -> None:
        for known in (self._restored, self._loaded, self._batches):
            known.pop(address, None)

    def open_host_db(self) -> FileDatabase:
        return self.files.open_host_db()

    def set_aside_host_db(self) -> str:
        return self.files.set_aside_host_db()

    @property
    def closing(self) -> int:
        return self.files.closing

    async def sync_all(self) -> None:
        await self.files.sync_all()

    def close(self) -> None:
        """The host's end: the local files. The store and the leases stay until ``run()``
        ends."""
        self.files.close()
