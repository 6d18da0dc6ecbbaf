"""Group commit to the cluster's store (decision 0016): the writes of every actor that asks while
a commit is in flight go together in the next one, one PostgreSQL transaction for all.

A write whose partition has a newer owner fails alone: the batch is committed again without the
fenced partitions' writes, so one stale actor never fails the others. Each batch also takes the
alarm index's pending changes (``alarms.py``), in the same transaction.

A write comes ready (``submit``), or from a ``Source`` asked for it as its batch starts
(``submit_source``): an actor's output gate takes the frames its log has at that moment, and
hears the batch's end in the same step, where its next sync can join the next batch at once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import outcome
import structlog
import trio

from ..errors import HostClosed
from .connections import NotSent
from .records import AlarmChange, Fenced, Write

log = structlog.get_logger("actorkeep")

#: ``spawn(fn)``: start the task ``fn()`` (the host's nursery).
Spawn = Callable[[Callable[[], Awaitable[None]]], None]
#: ``commit(writes, alarms)``: ``Store.commit``, awaited (``ClusterStorage.commit_now``: on the
#: event loop, or in a thread, or the simulator's store).
CommitNow = Callable[[Sequence[Write], Sequence[AlarmChange]], Awaitable[None]]


class AlarmChanges(Protocol):
    """Where a batch takes the alarm index's pending changes from (``ClusterAlarmIndex``)."""

    def take(self) -> list[AlarmChange]: ...

    def failed(self, changes: Sequence[AlarmChange], fenced: set[int]) -> None: ...


class Nothing:
    """What a ``Source`` takes when it has nothing to commit and waits for no batch: the
    committer ends it at once (``NOTHING``)."""


NOTHING = Nothing()


class Source(Protocol):
    """Where a batch takes a write from as it starts (``Committer.submit_source``)."""

    def take(self) -> Write | Nothing | None:
        """The write to commit in this batch; None: nothing, but end after the batch (its
        alarm changes); ``NOTHING``: nothing, end now. Raising fails it alone."""
        ...

    def ended(self, result: outcome.Outcome[None]) -> None:
        """The batch ended: ``result`` is the write's outcome (or the error ``take`` raised).
        Called on the trio thread, in the committer's task: it must not block."""
        ...


class Ticket:
    """One ready write in the committer: ``wait()`` until its batch ended; its outcome, once."""

    __slots__ = ("box", "done", "write")

    def __init__(self, write: Write | None = None) -> None:
        self.write = write
        self.done = trio.Event()
        self.box: list[outcome.Outcome[None]] = []

    def take(self) -> Write | None:
        return self.write

    def ended(self, result: outcome.Outcome[None]) -> None:
        self.box.append(result)
        self.done.set()

    async def wait(self) -> None:
        await self.done.wait()
        self.box[0].unwrap()


class _NoAlarms:
    def take(self) -> list[AlarmChange]:
        return []

    def failed(self, changes: Sequence[AlarmChange], fenced: set[int]) -> None:
        pass


class Committer:
    """Commits writes for many actors with ``commit``, one transaction per batch, one batch at
    a time."""

    def __init__(
        self,
        commit: CommitNow,
        spawn: Spawn,
        alarms: AlarmChanges | None = None,
    ) -> None:
        self._commit_now = commit
        self._spawn = spawn
        self._alarms: AlarmChanges = _NoAlarms() if alarms is None else alarms
        self._pending: list[Source] = []
        self._busy = False
        #: Transactions committed, and writes in them (for measurements).
        self.transactions = 0
        self.writes = 0

    async def commit(self, write: Write | None) -> None:
        """Until ``write`` is committed (``Fenced`` if its partition has a newer owner; the
        store's error if the commit failed, when its outcome is unknown). None: only the
        alarm index's pending changes, in the next batch."""
        await self.submit(write).wait()

    def submit(self, write: Write | None) -> Ticket:
        """Queue ``write`` for the next batch; its ``Ticket`` tells when it ended, and how."""
        ticket = Ticket(write)
        self.submit_source(ticket)
        return ticket

    def submit_source(self, source: Source) -> None:
        """Ask ``source`` for its write when the next batch starts; tell it the end."""
        self._pending.append(source)
        if not self._busy:
            self._busy = True
            self._spawn(self._drain)

    async def _drain(self) -> None:
        try:
            while self._pending:
                asked, self._pending = self._pending, []
                batch: list[Source] = []
                taken: list[Write | Exception | None] = []
                ended_now: list[Source] = []
                for source in asked:
                    write: Write | Nothing | Exception | None
                    try:
                        write = source.take()
                    except Exception as exc:
                        write = exc
                    if isinstance(write, Nothing):
                        ended_now.append(source)
                    else:
                        batch.append(source)
                        taken.append(write)
                for source in ended_now:  # may ask again: for the next batch
                    _end(source, outcome.Value(None))
                if not batch:
                    continue
                writes = [w for w in taken if isinstance(w, Write)]
                changes = self._alarms.take()
                try:
                    results, unknown = await self._commit(writes, changes)
                except BaseException as exc:
                    # Cancelled (the host closes; a nonblocking commit is cancelled only
                    # before it is sent), or a bug: the outcome is unknown, for every write.
                    self._alarms.failed(changes, set())
                    for source in batch:  # an outcome is unwrapped once: one each
                        _end(source, outcome.Error(_as_error(exc)))
                    if isinstance(exc, Exception):
                        continue
                    waiting, self._pending = self._pending, []
                    for source in waiting:  # asked for meanwhile: never sent
                        _end(source, outcome.Error(HostClosed("the host closed")))
                    raise
                # Alarm changes alone (a None write) end as their changes did.
                alone: outcome.Outcome[None] = outcome.Value(None)
                if unknown is not None:
                    alarms, fenced, error = unknown
                    self._alarms.failed(alarms, fenced)
                    alone = outcome.Error(error)
                by_write = iter(results)
                for source, w in zip(batch, taken, strict=True):
                    if isinstance(w, Write):
                        _end(source, next(by_write))
                    elif w is None:
                        _end(source, alone)
                    else:
                        _end(source, outcome.Error(w))
        finally:
            self._busy = False

    async def _commit(
        self, writes: Sequence[Write], changes: Sequence[AlarmChange]
    ) -> tuple[list[outcome.Outcome[None]], tuple[list[AlarmChange], set[int], Exception] | None]:
        """Commit ``writes`` and ``changes``, dropping fenced partitions and committing the
        rest again; the outcome of each write, and if the last try failed, the changes whose
        outcome is unknown, the partitions fenced and the error."""
        fenced: set[int] = set()
        while True:
            live = [w for w in writes if w.partition not in fenced]
            alarms = [c for c in changes if c.partition not in fenced]
            try:
                await self._commit_now(live, alarms)
            except Fenced as exc:
                fenced.update(exc.partitions)
                continue
            except Exception as exc:
                # The outcome is unknown, for every write of the batch: the store's call
                # failed, or its runner did (no thread left, or the simulator's store lost
                # the reply).
                log.warning(
                    "a commit could not reach the cluster's store: nothing was sent"
                    if isinstance(exc, NotSent)
                    else "a commit to the cluster's store failed: its outcome is unknown",
                    writes=len(live),
                    alarm_changes=len(alarms),
                    error=repr(exc),
                )
                return [outcome.Error(exc) for _ in writes], (alarms, fenced, exc)
            if live or alarms:
                self.transactions += 1
                self.writes += len(live)
            return [
                outcome.Error(Fenced([w.partition]))
                if w.partition in fenced
                else outcome.Value(None)
                for w in writes
            ], None


def _end(source: Source, result: outcome.Outcome[None]) -> None:
    try:
        source.ended(result)
    except Exception as exc:  # one actor's bookkeeping: never the other writes' end
        log.error("a write's end could not be told", error=repr(exc))


def _as_error(exc: BaseException) -> Exception:
    return exc if isinstance(exc, Exception) else HostClosed("the host closed during a commit")
