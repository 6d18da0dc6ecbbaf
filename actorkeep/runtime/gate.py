"""The output gate of one actor: group commit of its database, and the outputs held until the
writes they could reveal are durable (decision 0015).

A *gated* write commits at once and the actor goes on with its next events. What would let
the outside world learn of it waits: the reply of every event answered after it, and every
call the actor makes after it, leave only once a sync that started after the write has ended.
One sync covers every write committed before it started, so the writes of many events share
one fsync; a sync runs at a time per database, and the next starts as soon as it ends if more
is waiting.

If a sync fails, nothing it covered is ever acknowledged: every held reply and every waiter
gets the error, and the actor is reset (its instance discarded, its database closed and
opened again from the disk by its next event). The error is ``SyncFailed`` (the disk failed),
or what the storage raised if it says more: ``Overloaded`` (a cluster host no longer serves
the actor, so nothing the sync covered is durable) or ``OutcomeUnknown`` (a commit to the
cluster's store did not end: the writes may be durable).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import outcome
import structlog
from trio.lowlevel import Abort, Task, current_task, reschedule, wait_task_rescheduled

from ..errors import HostClosed, OutcomeUnknown, Overloaded
from .storage import Database

log = structlog.get_logger("actorkeep")


class SyncFailed(OSError):
    """A sync of the actor's database failed: what it covered was never acknowledged."""


#: ``release(held, result)``: hand a held output on. ``refuse(held, error)``: fail it.
Release = Callable[[Any, outcome.Outcome[Any]], None]
Refuse = Callable[[Any, BaseException], None]


class Gate:
    """Sync points of one database and the outputs that wait for them.

    Points are numbered: each gated write (``write``) and each sync request (``sync``) takes
    the next one. ``gated`` is the point of the last gated write, ``durable`` the last point a
    finished sync covered; while ``gated > durable`` the actor's outputs wait (``closed``).
    ``spawn(fn)`` starts a task (the host's nursery); ``failed(error)`` is told once, when a
    sync fails.
    """

    __slots__ = (
        "_after",
        "_db",
        "_failed_cb",
        "_held",
        "_refuse",
        "_release",
        "_settle",
        "_spawn",
        "_waiters",
        "closed",
        "durable",
        "failed",
        "gated",
        "seq",
        "syncing",
    )

    def __init__(
        self,
        db: Database,
        spawn: Callable[[Callable[[], Any]], None],
        release: Release,
        refuse: Refuse,
        failed: Callable[[BaseException], None],
    ) -> None:
        self._db = db
        self._spawn = spawn
        self._release = release
        self._refuse = refuse
        self._failed_cb = failed
        self.seq = 0
        self.gated = 0
        self.durable = 0
        self.syncing = False
        #: Whether outputs must wait now: a gated write is not durable yet, or a sync failed
        #: (what waits is then refused). An attribute, read on every reply and call.
        self.closed = False
        self.failed: BaseException | None = None
        self._held: list[tuple[int, Any, outcome.Outcome[Any]]] = []
        self._waiters: list[tuple[int, Task]] = []
        self._after: list[tuple[int, Callable[[], None]]] = []
        #: While a run of events shares one transaction (``hold_syncs``): what commits it.
        self._settle: Callable[[], None] | None = None

    @property
    def busy(self) -> bool:
        """Whether a sync runs or something waits for one (never, once one failed)."""
        return self.failed is None and (self.syncing or self.durable < self.seq)

    def write(self) -> None:
        """A gated write has just committed (or, while syncs are held, run in the transaction
        that commits when they are released): every output from now on waits until it is
        durable."""
        self.seq += 1
        self.gated = self.seq
        self.closed = self._closes()
        if not self.syncing and self._settle is None:
            self._start()

    def hold_syncs(self, settle: Callable[[], None]) -> None:
        """A transaction is open whose writes ``write`` counts before they commit: no sync
        starts until ``release_syncs`` (a sync reads only what has committed). Whoever must
        wait for a sync meanwhile calls ``settle``, which commits and releases."""
        self._settle = settle

    def release_syncs(self) -> None:
        """The held transaction has committed (or ended): start the sync that waits."""
        self._settle = None
        if not self.syncing and self.durable < self.seq and self.failed is None:
            self._start()

    def settle(self) -> None:
        """Commit a held transaction now, if one is open (a wait must not wait for it)."""
        if self._settle is not None:
            self._settle()

    def fail(self, exc: BaseException) -> None:
        """Writes counted by ``write`` were lost before a sync could cover them: refuse what
        waits, as for a failed sync."""
        self._settle = None
        if self.failed is None:
            self._fail(exc)

    def _closes(self) -> bool:
        """Whether a gated write closes the gate (always, but for a planted bug)."""
        return True

    def hold(self, held: Any, result: outcome.Outcome[Any]) -> None:
        """Hand ``result`` on (``release``) once every gated write so far is durable; refuse
        it if a sync fails first (or has failed)."""
        if self.failed is not None:
            self._refuse(held, self.error())
        elif self.closed:
            self._held.append((self.gated, held, result))
        else:
            self._release(held, result)

    def after(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` (on the trio thread, without waiting for it) once every write committed
        so far is durable; never, if a sync fails first."""
        self.seq += 1
        self._after.append((self.seq, fn))
        if not self.syncing and self._settle is None:
            self._start()

    def defer(self, output: Callable[[], None]) -> None:
        """Run ``output`` once every gated write so far is durable (now, if none waits), in
        the order deferred; never, if a sync fails first. An actor's WebSocket sends."""
        if self.failed is not None:
            return
        if not self.closed:
            output()
        else:
            self._after.append((self.gated, output))

    def error(self) -> Exception:
        """The error a failed sync gives whoever waits for it (a new one each time)."""
        failed = self.failed
        if isinstance(failed, Overloaded):
            return Overloaded(f"the actor's writes were not made durable: {failed.message}",
                              failed.retry_after)  # fmt: skip
        if isinstance(failed, OutcomeUnknown):
            return OutcomeUnknown(failed.message, failed.retry_after)
        return SyncFailed(
            f"a sync of {self._db.where} failed ({failed!r}): writes it covered may be lost"
        )

    async def wait(self) -> None:
        """Until every gated write so far is durable (``SyncFailed`` if a sync fails)."""
        if self.failed is not None:
            raise self.error()
        if self.closed:
            self.settle()
            await self._wait_for(self.gated)

    async def sync(self) -> None:
        """Until every write committed so far (plain ones too) is durable (``SyncFailed`` if
        a sync fails)."""
        if self.failed is not None:
            raise self.error()
        self.settle()
        self.seq += 1
        point = self.seq
        if not self.syncing:
            self._start()
        await self._wait_for(point)

    async def _wait_for(self, point: int) -> None:
        task = current_task()
        entry = (point, task)
        self._waiters.append(entry)

        def abort(_: Any) -> Abort:
            self._waiters.remove(entry)
            return Abort.SUCCEEDED

        if await wait_task_rescheduled(abort) is not None:
            raise self.error()

    def _start(self) -> None:
        """A sync of every write so far, now: started by the database itself where it can
        (no task: its end calls ``_synced``), else by a task that awaits it."""
        if self.failed is None:
            self.syncing = True
            point = self.seq
            if not self._db.start_sync(lambda error: self._synced(point, error)):
                self._spawn(self._drive)

    def _synced(self, point: int, error: BaseException | None) -> None:
        """A sync the database started ended: what it covered is durable (or refused), and
        the next starts at once if more is waiting."""
        if error is not None:
            self.syncing = False
            self._fail(error)
            return
        self._reach(point)
        if self.durable < self.seq and self.failed is None and self._settle is None:
            self._start()
        else:
            self.syncing = False

    async def _drive(self) -> None:
        try:
            while self.durable < self.seq and self._settle is None:
                point = self.seq
                try:
                    await self._db.sync()
                except Exception as exc:
                    self._fail(exc)
                    return
                self._reach(point)
        except BaseException:  # cancelled: the host is closing with syncs still running
            self._abandon()
            raise
        finally:
            self.syncing = False

    def _reach(self, point: int) -> None:
        self.durable = point
        self.closed = self.gated > point and self._closes()
        self._reached(point)

    def _reached(self, point: int) -> None:
        held = self._held
        if held:
            n = 0
            for need, item, result in held:
                if need > point:
                    break
                self._release(item, result)
                n += 1
            del held[:n]
        if self._waiters:
            waiting = []
            for entry in self._waiters:
                if entry[0] <= point:
                    reschedule(entry[1], outcome.Value(None))  # None: reached
                else:
                    waiting.append(entry)
            self._waiters = waiting
        if self._after:
            due = [fn for need, fn in self._after if need <= point]
            self._after = [(need, fn) for need, fn in self._after if need > point]
            for fn in due:
                try:
                    fn()
                except Exception as exc:  # the host's own bookkeeping: never the host's end
                    log.error("a step after a sync failed", file=self._db.where, error=repr(exc))

    def _abandon(self) -> None:
        held, self._held = self._held, []
        waiters, self._waiters = self._waiters, []
        self._after = []
        for _, item, _ in held:
            self._release(item, outcome.Error(HostClosed("the host closed before it was durable")))
        for _, task in waiters:
            reschedule(task, outcome.Error(HostClosed("the host closed before it was durable")))

    def _fail(self, exc: BaseException) -> None:
        self.failed = exc
        self.closed = True  # whatever is handed to the gate from now on is refused
        held, self._held = self._held, []
        waiters, self._waiters = self._waiters, []
        self._after = []
        for _, item, _ in held:
            self._refuse(item, self.error())
        for _, task in waiters:
            reschedule(task, outcome.Value(exc))  # raised as SyncFailed by each waiter
        self._failed_cb(exc)
