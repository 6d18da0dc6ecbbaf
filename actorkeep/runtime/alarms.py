"""Alarms: the scheduler that fires them, and the one invariant between an actor's alarm row
(alarm_store.py) and the host's index (alarm_index.py) that every change keeps.

Each actor's alarm lives in its own database (``actorkeep_alarm``), which is the truth. The host
keeps an index ``address -> at`` in its own database, so that it can wake actors that are not
in memory and, after a restart, find due alarms with an indexed query: startup cost grows with
the number of due alarms, not with the number of actors.

**The invariant.** Whenever an actor's database holds an alarm row that power loss could bring
back, the index holds an entry for that address that power loss keeps too, at a time no later
than the row's. Everything below follows from it:

- a new alarm's entry is written and made durable *before* its row (``set``), and never moved
  later than the alarm it replaces until the new row is durable;
- an entry is removed only once the row's absence is durable (``forget_cleared``, ``delete``);
- an entry that wakes and finds its alarm moved later moves only once that row is durable;
- an entry that wakes and finds no row is dropped only once the absence is durable.

An entry may therefore be early, or stale: firing then finds nothing due and fixes the entry.
An alarm is never early and never lost; it may fire more than once (at least once).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Awaitable, Callable, Container
from typing import Any, Protocol

import structlog
import trio

from ..actor import Actor
from ..errors import OutcomeUnknown, Overloaded
from ..schedules import AlarmInfo, run_alarm, timetable_of
from .activation import Activation
from .alarm_index import DUE_BATCH, AlarmIndex, LocalAlarmIndex
from .alarm_store import (
    ACTOR_TABLE,
    MAX_RETRIES,
    AlarmState,
    retry_delay,
    storage_retry_delay,
    transient_retry_delay,
    write_alarm_row,
)
from .clock import Clock
from .stats import HostStats
from .storage import Database, is_damage

__all__ = ["AlarmIndex", "AlarmRunner", "AlarmScheduler", "LocalAlarmIndex"]

log = structlog.get_logger("actorkeep")


class AlarmRunner(Protocol):
    """What the scheduler needs of the host to run an alarm event."""

    async def open_instance(self, act: Activation) -> Actor:
        """The actor's instance, its database opened and ``setup()`` run if needed."""

    def fail(self, act: Activation, exc: Exception) -> None:
        """A failed event: roll back, discard the instance, log (quarantine if damaged)."""

    def serves(self, address: str) -> bool:
        """Whether this host may run the actor's events now (``Router.serves``)."""


# -- the scheduler -------------------------------------------------------------------------------


class AlarmScheduler:
    """Fires due alarms, and keeps the invariant above for every change of an alarm.

    ``fire(address, early)`` hands an alarm event to the actor (the host finds or creates its
    activation); ``quarantined`` holds the addresses whose alarms must wait. Start ``loop``
    and give ``start_soon`` (a nursery's) before anything fires.
    """

    def __init__(
        self,
        index: AlarmIndex,
        clock: Clock,
        runner: AlarmRunner,
        fire: Callable[[str, bool], None],
        quarantined: Container[str],
        buggify: Callable[[str], bool],
    ) -> None:
        self.index = index
        self.clock = clock
        self._runner = runner
        self._fire = fire
        self._quarantined = quarantined
        self._buggify = buggify
        self.start_soon: Callable[..., None] | None = None
        #: Addresses whose alarm event is queued, running, cooling down after a failure, or
        #: waiting for a cleared alarm's deletion to be durable: kept out of the scans.
        self.running: set[str] = set()
        self._clearing: dict[str, object] = {}  # address -> token of its forget_cleared
        self._failures: dict[str, int] = {}  # address -> failures in a row, outside the handler
        self._poked = math.inf  # the earliest time poked since the last scan
        self._scope: trio.CancelScope | None = None
        self._answered = trio.Event()  # set (and replaced) when failed storage answers again
        self.stats = HostStats()  # the host gives its own
        index.watch(self.poke, self.retry_failed)

    # -- waking up -------------------------------------------------------------------------
    def poke(self, at: float) -> None:
        """Wake the scheduler if ``at`` is earlier than it planned to wake."""
        self._poked = min(self._poked, at)  # remembered while the scheduler is scanning
        scope = self._scope
        if scope is not None:
            deadline = self.clock.trio_time(at)
            if deadline < scope.deadline:
                scope.deadline = deadline

    def retry_failed(self) -> None:
        """The storage answers again after failing: alarm events cooling down after a
        failure outside their handler are tried now."""
        answered, self._answered = self._answered, trio.Event()
        answered.set()

    def horizon(self) -> float:
        """Alarms set for this time or earlier are due (a seam for the planted early-alarm bug
        of the simulator)."""
        return self.clock.now()

    async def loop(self) -> None:
        index = self.index
        while True:
            self._poked = math.inf
            now = self.horizon()
            after: tuple[float, str] | None = None
            while True:
                rows = index.due(now, after, DUE_BATCH)
                for address, _ in rows:
                    self._wake(address, early=False)
                if len(rows) < DUE_BATCH:
                    break
                after = (rows[-1][1], rows[-1][0])
                await trio.lowlevel.checkpoint()
            nxt = index.next_after(now)
            if nxt is not None and self._buggify("host.alarm-early-wake"):
                # An early wake-up must be harmless: the event finds the alarm not yet due.
                self._wake(nxt[1], early=True)
            wake = min(math.inf if nxt is None else nxt[0], self._poked)
            if wake <= now:
                continue  # poked while scanning with an alarm already due: scan again
            with trio.CancelScope(deadline=self.clock.trio_time(wake)) as scope:
                self._scope = scope
                await trio.sleep_forever()
            self._scope = None

    def _wake(self, address: str, early: bool) -> None:
        if address in self.running or address in self._quarantined:
            return  # a quarantined actor's alarm stays in the index until it is released
        self.running.add(address)
        self._fire(address, early)

    # -- one actor's alarm -----------------------------------------------------------------
    def opened(self, act: Activation, state: AlarmState) -> None:
        """An actor was opened with ``state`` in its row: heal an index write lost to a crash,
        but only ever move the entry earlier (the row may be committed and not durable; an
        early entry wakes the actor, and the event moves it later once the row is durable)."""
        act.alarm = state
        entry = self.index.get(act.address)
        if entry is None or entry > state.at:
            self.index.put(act.address, state.at)
            self.poke(state.at)

    async def set(
        self,
        act: Activation,
        at: float,
        scheduled_at: float | None = None,
        retries: int = 0,
        durable: bool = True,
        wait: bool = True,
    ) -> None:
        """Set the actor's alarm (from its event: no transaction may be open). ``wait=False``:
        the row is a gated write (the actor's outputs wait for it, the event does not)."""
        db = _writable(act, "set_alarm")
        self._clearing.pop(act.address, None)  # the index entry is this alarm's now
        state = AlarmState(at, at if scheduled_at is None else scheduled_at, retries)
        index = self.index
        if self._rearm_at_once(act, at) or (not durable and act.index_durable):
            # Plain writes of the index and the row. Power loss keeps an index entry for this
            # address (entries go only after a durable deletion), so whatever row survives is
            # woken, at worst at a later time set meanwhile.
            index.put(act.address, at)
            self._write(act, db, state)
            return
        # The index first, and never later than the alarm it replaces until the new one is
        # durable: a crash in between must not delay an acknowledged alarm. Nor later than
        # the entry already there: with no alarm in memory, the entry may still guard a
        # cleared row whose deletion is not durable yet (forget_cleared).
        first = at
        if act.alarm is not None:
            first = min(first, act.alarm.at)
        entry = index.get(act.address)
        if entry is not None:
            first = min(first, entry)
        index.put(act.address, first)
        await index.sync()
        act.index_durable = True
        self._write(act, db, state)
        if not durable:
            return  # the row becomes durable with the actor's next durable write
        if wait:
            await act.sync()
            if first < at:
                index.put(act.address, at)  # an early wake-up is harmless
            return
        gate = act.gate
        assert gate is not None
        gate.write()
        if first < at:
            gate.after(lambda: self._settle(act, gate, state))

    def _settle(self, act: Activation, gate: object, state: AlarmState) -> None:
        """A gated alarm row is durable: its index entry may move up to it, if it is still
        the alarm of the actor in memory (not of an activation evicted or closed since)."""
        if act.gate is gate and not act.closed and act.alarm is state:
            self.index.put(act.address, state.at)

    def _rearm_at_once(self, act: Activation, at: float) -> bool:
        """Whether this is the alarm's own event setting it again for now or earlier.

        Then no fsync is needed: until this event ends, the stored alarm is the one that fired,
        which is due, so power loss brings back that alarm (or, if it was set with
        ``durable=False``, what that allows), which fires at once; and ``at`` is not later than
        now, so nothing can fire early. (A push queue re-arms this way after every batch while
        messages are ready.)
        """
        ev = act.current
        return (
            ev is not None
            and ev.kind == "alarm"
            and not act.alarm_touched
            and act.alarm is not None
            and at <= self.clock.now()
        )

    def _write(self, act: Activation, db: Database, state: AlarmState) -> None:
        write_alarm_row(db, state)
        act.alarm = state
        act.alarm_touched = True
        self.poke(state.at)

    def clear(self, act: Activation) -> None:
        """Delete the row with a plain write (a crash may bring it back: at least once). The
        index entry stays until the deletion is durable (``forget_cleared``)."""
        assert act.db is not None
        if act.alarm is not None:
            act.db.conn.execute(f"DELETE FROM {ACTOR_TABLE}")
            act.alarm = None
        act.alarm_touched = True

    async def delete(self, act: Activation, wait: bool = True) -> None:
        """``delete_alarm``: durable when it returns; ``wait=False``: a gated write (the
        entry goes once the deletion is durable)."""
        db = _writable(act, "delete_alarm")
        address = act.address
        self._clearing.pop(address, None)
        act.alarm_touched = True
        index = self.index
        if act.alarm is None and index.get(address) is None:
            return  # no entry: the row's absence is durable (an entry goes only after it is)
        # With an entry left, the row may be gone only until power loss (a fired alarm whose
        # deletion is not durable yet, or a crash since): make its absence durable too.
        if act.alarm is not None:
            db.conn.execute(f"DELETE FROM {ACTOR_TABLE}")
            act.alarm = None
        if wait:
            await act.sync()
            index.remove(address)
            act.index_durable = False
            return
        gate = act.gate
        assert gate is not None
        gate.write()
        token = self._clearing[address] = object()
        gate.after(lambda: self._forget_deleted(act, token))

    def busy(self, address: str) -> bool:
        """Whether an alarm event of ``address`` is queued, running or cooling down, or a
        deletion of its alarm waits to be durable."""
        return address in self.running or address in self._clearing

    def hold(self, address: str) -> None:
        """Fire no alarm of ``address`` until ``release`` (an actor being deleted: ``busy``
        is False)."""
        self.running.add(address)

    def release(self, address: str, forget: bool) -> None:
        """End ``hold``; ``forget``: drop the entry too (a plain write of the host database,
        which the caller syncs)."""
        self.running.discard(address)
        if forget:
            self._failures.pop(address, None)
            self.index.remove(address)
        else:
            self.poke(self.clock.now())  # it may have come due meanwhile, unseen by the scans

    def _forget_deleted(self, act: Activation, token: object) -> None:
        """A gated deletion is durable: drop the entry unless the alarm was set since."""
        if self._clearing.get(act.address) is token:
            del self._clearing[act.address]
            self.index.remove(act.address)
            act.index_durable = False

    # -- the alarm event ---------------------------------------------------------------------
    async def run(self, act: Activation) -> None:
        """One alarm event. Nothing but cancellation escapes it: when storage fails, the alarm
        stays due and the event is tried again 2 s later, doubling up to 5 minutes, with one
        log line each time; damaged storage quarantines the actor instead."""
        address = act.address
        try:
            if self._buggify("host.alarm-event-fails"):
                raise OSError("buggify: the alarm event hit a storage error")
            if act.db is None:
                await act.open()
            if not self._runner.serves(address):
                # Handed to the actor while this host served it, run after it stopped (a
                # cluster's partition moved meanwhile): the owner's index fires it. Or it
                # came back under a new owner's epoch while the actor stayed in memory: the
                # database is opened afresh once this event ends, and the alarm fires again.
                act.reset_pending = True
                self.running.discard(address)
                self.poke(self.clock.now())
                return
            state = act.alarm
            cleared = False
            assert act.db is not None
            if state is None:
                # An entry that outlived its alarm: drop it once the row's absence is durable.
                await act.sync()
                if act.alarm is None:
                    self.index.remove(address)
                    act.index_durable = False
            elif state.at > self.horizon():
                # Moved later by an earlier event: move the entry once that row is durable.
                await act.sync()
                self.index.put(address, state.at)
            else:
                cleared = await self._handle(act, state)
        except Exception as exc:
            if is_damage(exc):
                self._runner.fail(act, exc)  # quarantined: its alarm waits in the index
                self.running.discard(address)
            else:
                self._storage_failed(act, exc)
            return
        self._failures.pop(address, None)
        if cleared:
            # Registered now, before the actor's next event can set the alarm again.
            token = self._clearing[address] = object()
            self._spawn(self.forget_cleared, act, token)
            return
        self.running.discard(address)
        if act.alarm is not None:
            self.poke(act.alarm.at)

    async def _handle(self, act: Activation, state: AlarmState) -> bool:
        """Run the handler; True if the alarm is now cleared (its row deleted)."""
        act.alarm_touched = False
        try:
            inst = await self._runner.open_instance(act)
            self.stats.alarms_fired += 1
            info = AlarmInfo(state.scheduled_at, state.retry_count)
            last_try = state.retry_count >= MAX_RETRIES
            await run_alarm(inst, timetable_of(inst), info, last_try, is_damage)
            assert act.db is not None
            if act.db.conn.in_transaction:
                raise RuntimeError(
                    "the alarm event ended with a transaction still open: commit it before "
                    "returning (or use `with self.sql.transaction():`)"
                )
        except Exception as exc:
            self._runner.fail(act, exc)  # rolls back
            if act.address in self._quarantined:
                return False  # its storage is damaged: the alarm stays as it was
            return await self._retry(act, state)
        if not act.alarm_touched:
            self.clear(act)
            return True
        return False

    async def _retry(self, act: Activation, state: AlarmState) -> bool:
        """After a failed handler: the retry replaces any alarm the event set. True if the
        alarm was dropped (cleared) instead."""
        if state.retry_count < MAX_RETRIES:
            retry_at = self.clock.now() + retry_delay(state.retry_count)
            await self.set(act, retry_at, state.scheduled_at, state.retry_count + 1)
            self.stats.alarms_retried += 1
            return False
        self.clear(act)
        self.stats.alarms_dropped += 1
        log.error(
            "alarm dropped after its last retry",
            address=act.address,
            scheduled_at=state.scheduled_at,
            retries=state.retry_count,
        )
        return True

    async def forget_cleared(self, act: Activation, token: object) -> None:
        """After an alarm was cleared: make the row's deletion durable, then drop the index
        entry, unless the alarm was set again meanwhile. The actor goes on taking events; its
        address stays out of the scans until this ends. (A seam for the simulator's planted
        plain-clear bug.)"""
        address = act.address
        try:
            await act.sync()
            if self.still_cleared(address, token):
                self.index.remove(address)
                act.index_durable = False
        except Exception as exc:
            # Closed (evicted) or failing storage: keep the entry. Its next wake-up finds no
            # alarm and drops it then. Nothing escapes into the host.
            log.info("kept a cleared alarm's index entry", address=address, error=repr(exc))
        finally:
            self.cleared(address, token)
        self._recheck(address)  # an alarm set meanwhile may be due

    def _recheck(self, address: str) -> None:
        """``address`` left ``running``: wake it now if its entry is due (the scans skipped it
        meanwhile), or by its time. One read of its own entry: a scan of every due entry here,
        after each of many alarms due at once, made them cost the square of their number."""
        at = self.index.get(address)
        if at is None:
            return
        if at <= self.horizon():
            self._wake(address, early=False)
        else:
            self.poke(at)

    def still_cleared(self, address: str, token: object) -> bool:
        """Whether the alarm cleared under ``token`` was not set again since."""
        return self._clearing.get(address) is token

    def cleared(self, address: str, token: object) -> None:
        """``forget_cleared`` of ``token`` is over, whatever it did."""
        if self._clearing.get(address) is token:
            del self._clearing[address]
        self.running.discard(address)

    def _storage_failed(self, act: Activation, exc: Exception) -> None:
        """The event failed outside its handler (storage): roll back, and try again later,
        backing off (or sooner, once the storage answers again); one log line per try, the
        traceback with the first. A refusal for a while (``Overloaded``, ``OutcomeUnknown``)
        backs off from 0.1 s up to the refusal's ``retry_after``, as a warning."""
        address = act.address
        failures = self._failures.get(address, 0) + 1
        self._failures[address] = failures
        if isinstance(exc, Overloaded | OutcomeUnknown):
            transient, delay = True, transient_retry_delay(failures, exc.retry_after)
        else:
            transient, delay = False, storage_retry_delay(failures)
        # The storage that failed may fail the rollback too; the next try starts afresh.
        with contextlib.suppress(Exception):
            act.rollback()
        act.discard_instance()
        (log.warning if transient else log.error)(
            "alarm event failed before its handler ran; trying again later",
            address=address,
            error=repr(exc),
            failures=failures,
            retry_in=delay,
            **({"file": act.where} if act.where is not None else {}),
            exc_info=exc if failures == 1 and not transient else None,
        )
        self._spawn(self._cooldown, address, delay)

    async def _cooldown(self, address: str, delay: float) -> None:
        answered = self._answered
        with trio.move_on_after(delay):
            await answered.wait()
        self.running.discard(address)
        self.poke(self.clock.now())

    def _spawn(self, fn: Callable[..., Awaitable[None]], *args: Any) -> None:
        assert self.start_soon is not None, "the scheduler runs inside an open host"
        self.start_soon(fn, *args)


def _writable(act: Activation, what: str) -> Database:
    db = act.db
    assert db is not None and act.sql is not None
    act.sql.settle()  # a run's transaction commits first (decision 0030)
    if db.conn.in_transaction:
        raise RuntimeError(f"{what} inside a transaction: end the transaction first")
    return db
