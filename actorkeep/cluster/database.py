"""One actor's database on a cluster host (decision 0016): the local file, synced to the store
under the epoch it was opened with; what a close does with what it had not shipped
(decision 0017). ``ClusterStorage`` (``backend.py``) opens them."""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Protocol

import outcome
import structlog
import trio

from ..errors import HostClosed, OutcomeUnknown, Overloaded
from ..runtime.storage import FileDatabase
from .committer import NOTHING, Committer, Nothing, Ticket
from .connections import NotSent
from .keeper import LeaseKeeper
from .records import Fenced, Store, Write
from .replica import Replica
from .syncs import SyncsInFlight

log = structlog.get_logger("actorkeep")


class NotServedHere(Overloaded):
    """503: this host does not hold the actor's partition (now); try again shortly."""

    def __init__(self, address: str) -> None:
        super().__init__(f"{address} is not served by this host now", retry_after=1.0)


class StoreUnreachable(Overloaded):
    """503: the actor could not be restored, the cluster's store did not answer."""

    def __init__(self, address: str) -> None:
        super().__init__(f"{address} cannot be restored now: the store is unreachable", 1.0)


class WritesNotSent(Overloaded):
    """503: the cluster's store could not be reached, so the actor's writes were never sent:
    none of them is durable; try again."""

    def __init__(self, address: str) -> None:
        super().__init__(f"the writes of {address} could not reach the cluster's store", 1.0)


def _unknown(address: str) -> OutcomeUnknown:
    return OutcomeUnknown(
        f"the commit of {address}'s writes to the cluster's store did not end: they may be durable"
    )


def _sync_error(address: str, exc: BaseException) -> BaseException:
    """What the callers of a failed sync hear: 503 ``NotServedHere`` if nothing it covered
    can be durable (fenced: the statement committed nothing; or the lease was gone before it
    shipped), 503 ``WritesNotSent`` if the store could not be reached (nothing was sent),
    ``OutcomeUnknown`` if the store's answer did not come (it may have committed)."""
    if isinstance(exc, Fenced):
        return NotServedHere(address)
    if isinstance(exc, NotSent):
        return WritesNotSent(address)
    if isinstance(exc, Exception) and not isinstance(exc, Overloaded | OutcomeUnknown):
        return _unknown(address)
    return exc


class Owner(Protocol):
    """What a ``ClusterDatabase`` needs of the storage that opened it (``ClusterStorage``)."""

    keeper: LeaseKeeper
    store: Store
    syncs: SyncsInFlight

    @property
    def committer(self) -> Committer: ...

    def in_thread(self, fn: Callable[[], Any]) -> Awaitable[Any]: ...

    def until_renewed(self, partition: int) -> Awaitable[None]: ...

    def commit_soon(self, db: ClusterDatabase) -> bool: ...

    def spawn(self, fn: Callable[[], Awaitable[None]]) -> None: ...

    def forget(self, address: str) -> None: ...

    def committed(self, db: ClusterDatabase) -> None: ...

    def hold_until_ended(self, address: str, partition: int, ticket: Ticket) -> None: ...

    def database_closed(self, db: ClusterDatabase) -> None: ...

    def commit_after_close(self, db: ClusterDatabase, write: Write | None) -> None: ...

    def shipped(self, address: str, seq: int) -> None: ...


class ClusterDatabase:
    """One actor's database in cluster mode: the local file, synced to the store."""

    def __init__(
        self,
        storage: Owner,
        inner: FileDatabase,
        address: str,
        partition: int,
        epoch: int,
        replica: Replica,
        image: bytes | None,
    ) -> None:
        self._storage = storage
        self._inner = inner
        self.conn: sqlite3.Connection = inner.conn
        self.address = address
        self.partition = partition
        self.epoch = epoch
        self._replica = replica
        self._image = image  # the first image of an actor new to the cluster, not sent yet
        # A semaphore, not a lock: a sync the committer runs (``start_sync``) ends in its task.
        self._one_at_a_time = trio.Semaphore(1, max_value=1)
        self._done: Callable[[BaseException | None], None] | None = None  # of ``start_sync``
        self._again = False  # ``take`` left the sync to ``sync``
        self._wrote = False  # ``take`` shipped frames
        self._failed: BaseException | None = None
        self._shut = False  # close() has run
        self._close_commit = trio.Event()  # what close() shipped is committed, or failed
        self._close_error: BaseException | None = None
        self.closed = trio.Event()

    @property
    def where(self) -> str:
        return self._inner.where

    @property
    def look_at(self) -> int:
        return self._inner.look_at

    @look_at.setter
    def look_at(self, value: int) -> None:
        self._inner.look_at = value

    def checkpoint_due(self) -> bool:
        return self._inner.checkpoint_due()

    async def prepare_checkpoint(self) -> None:
        await self._inner.prepare_checkpoint()

    async def checkpoint(self) -> None:
        # The whole checkpoint under the sync lock: SQLite, starting the log afresh (in the
        # checkpoint's thread), resets the log's index before it rewrites the log's header,
        # and a sync reading the log in between saw the old log with no frames in it ("the log
        # went back"): the sync failed, and its held replies with it.
        async with self._one_at_a_time:
            if not self._shut:
                await self._ship()  # the frames reach the store before the log starts afresh
                self._replica.expect_restart()
                await self._inner.checkpoint()
                return
        await self._after_close()

    def start_sync(self, done: Callable[[BaseException | None], None]) -> bool:
        """The gate's sync, without a task of its own where it can: the committer takes the
        frames as its next batch starts and ends the sync (``done``) in the step the batch
        ends, so that the sync asked for meanwhile joins the batch after at once. Not when a
        sync or checkpoint runs, the first image is not sent, or the lease needs a renewal
        or is gone: the gate's task then awaits ``sync``, which waits, or says why not."""
        if self._shut or self._failed is not None or self._image is not None:
            return False
        lease = self._storage.keeper.lease_for(self.partition)
        if lease is None or lease.epoch != self.epoch:
            return False
        try:
            self._one_at_a_time.acquire_nowait()
        except trio.WouldBlock:
            return False
        self._done, self._again, self._wrote = done, False, False
        if not self._storage.commit_soon(self):
            self._done = None
            self._one_at_a_time.release()
            return False
        return True

    def take(self) -> Write | Nothing:
        """The committer's batch starts: the frames committed since the last ship. None
        new (what the sync covers is in the store already, since one write of the database
        is in the committer at a time), closed meanwhile, or the lease not good now:
        ``NOTHING``, and the committer ends the sync at once, out of the batch; in the last
        two cases it is done again by ``sync`` (which waits for the close's commit or the
        renewal, or says why not)."""
        lease = self._storage.keeper.lease_for(self.partition)
        if self._shut or self._failed is not None or lease is None or lease.epoch != self.epoch:
            self._again = True
            return NOTHING
        write = self._replica.ship(self.epoch)
        self._wrote = write is not None
        return NOTHING if write is None else write

    def ended(self, result: outcome.Outcome[None]) -> None:
        """The sync ended: its batch, or at once if ``take`` found nothing to commit."""
        storage, done = self._storage, self._done
        self._done = None
        error = result.error if isinstance(result, outcome.Error) else None
        if done is not None and error is None and not self._again:
            lease = storage.keeper.lease_for(self.partition)
            if lease is None or lease.epoch != self.epoch:  # no reply may leave now
                if self._wrote:
                    error = self._outlasted()
                else:
                    self._again = True  # nothing was sent: ``sync`` waits for the renewal
        if done is not None and error is not None:
            self._failed = error
            storage.forget(self.address)  # the local file is unknown: restore it next time
        self._one_at_a_time.release()
        storage.syncs.sent(self)
        if done is None:  # ended already: the lease ran out first (``lease_ran_out``)
            return
        if error is not None:
            done(_sync_error(self.address, error))
        elif self._again:
            try:
                storage.spawn(partial(self._sync_then, done))
            except RuntimeError:  # the storage stops: nobody runs the sync now
                done(HostClosed("the host closed during a sync"))
        else:
            if self._wrote:
                storage.committed(self)
            done(None)

    def lease_ran_out(self) -> None:
        """The lease ran out by this host's clock with the committer's batch in flight: the
        sync fails now (its outcome unknown), not at the connection's timeout; the actor's
        next open waits for the batch's end all the same."""
        done, self._done = self._done, None
        if done is None:
            return
        self._failed = error = self._outlasted()
        self._storage.forget(self.address)
        done(error)

    def _outlasted(self) -> OutcomeUnknown:
        log.warning("a commit to the cluster's store outlasted the lease",
                    address=self.address, partition=self.partition)  # fmt: skip
        return _unknown(self.address)

    async def _sync_then(self, done: Callable[[BaseException | None], None]) -> None:
        try:
            await self.sync()
        except Exception as exc:
            done(exc)
            return
        except BaseException:
            done(HostClosed("the host closed during a sync"))
            raise
        done(None)

    async def sync(self) -> None:
        # One at a time (the gate's and a checkpoint's), so that batches land in order; and
        # after one failed, none: a batch that may be missing would leave a hole under the
        # next ones. The actor is reset and restored instead.
        async with self._one_at_a_time:
            if not self._shut:
                await self._ship()
                return
        await self._after_close()

    async def _after_close(self) -> None:
        # Closed meanwhile (evicted with a sync still asked for): what it had not shipped went
        # with the close's own commit (which takes the lock): durable when that ends.
        await self._close_commit.wait()
        if self._close_error is not None:
            raise _sync_error(self.address, self._close_error) from self._close_error

    async def _ship(self) -> None:
        storage = self._storage
        if self._failed is not None:
            raise NotServedHere(self.address) from self._failed
        storage.syncs.change(self.address, self.partition, +1)
        try:
            await storage.until_renewed(self.partition)
            lease = storage.keeper.lease_for(self.partition)
            if lease is None or lease.epoch != self.epoch:
                raise NotServedHere(self.address)
            write = self._replica.ship(self.epoch)
            await self._send_first_image()
            if write is not None:
                # Not past the lease: if the store does not answer before it runs out (a
                # host cut off), the write fails then and its callers hear 503, instead of
                # waiting for the connection's timeout. Its outcome is unknown.
                ticket = storage.committer.submit(write)
                with trio.move_on_after(storage.keeper.remaining(self.partition)) as scope:
                    await ticket.wait()
                if scope.cancelled_caught:
                    # Still queued or in flight: the actor's next open waits for its end
                    # all the same (a restore before it would number its batches again).
                    storage.hold_until_ended(self.address, self.partition, ticket)
                    log.warning("a commit to the cluster's store outlasted the lease",
                                address=self.address, partition=self.partition)  # fmt: skip
                    raise _unknown(self.address)
                storage.committed(self)
        except BaseException as exc:
            self._failed = exc
            storage.forget(self.address)  # the local file is unknown: restore it next time
            error = _sync_error(self.address, exc)
            if error is exc:
                raise
            raise error from exc
        finally:
            storage.syncs.change(self.address, self.partition, -1)

    async def _send_first_image(self) -> None:
        """An actor new to the cluster: its image goes first, as batch 0 (fenced)."""
        if self._image is None:
            return
        image, self._image = self._image, None
        store = self._storage.store
        await self._storage.in_thread(
            lambda: store.compact(self.partition, self.epoch, self.address, 0, image)
        )

    async def commit_closed(self, write: Write | None) -> None:
        """After ``close``: commit what it had not shipped (and its first image, if it never
        synced), once a sync still running has ended; nothing if a sync failed, since a batch
        after a missing one would leave a hole in what the store holds."""
        try:
            async with self._one_at_a_time:
                if self._failed is not None:
                    raise NotServedHere(self.address) from self._failed
                await self._send_first_image()
                await self._storage.committer.commit(write)
        except BaseException as exc:
            self.close_commit_ended(exc)
            raise
        self.close_commit_ended(None)

    def close_commit_ended(self, error: BaseException | None) -> None:
        """The commit of what ``close`` shipped has ended (``error`` if it failed, or never
        ran): a sync asked for after the close ends with it."""
        self._close_error = error
        self._close_commit.set()

    def close(self) -> None:
        # Plain writes since the last sync are only in the local file: read them out of the
        # log before SQLite folds it away, and commit them after (a planned close keeps them,
        # as on a single host; the actor's next open waits for that commit). After a failed
        # sync, or with the lease gone, the local file is not to be trusted: the next open
        # restores from the store.
        storage = self._storage
        write, trusted = None, False
        lease = storage.keeper.lease_for(self.partition)
        if self._failed is None and lease is not None and lease.epoch == self.epoch:
            try:
                write = self._replica.ship(self.epoch)
                trusted = True
            except Exception as exc:
                log.warning("could not read a closing actor's log", address=self.address,
                            error=repr(exc))  # fmt: skip
        self._shut = True
        storage.database_closed(self)
        self._inner.close()
        self._replica.close()  # its own descriptor is of -wal only, which SQLite never locks
        if not trusted:
            storage.forget(self.address)
            self.close_commit_ended(NotServedHere(self.address))
        elif write is not None or self._image is not None:
            storage.commit_after_close(self, write)
        else:
            storage.shipped(self.address, self._replica.seq)
            self.close_commit_ended(None)
        self.closed.set()
