"""Dispatch: events onto activations, one worker task per active actor, and the inline path.

A caller (an HTTP request task, or another actor's worker) appends an event to the actor's
inbox and parks until the worker hands back the reply (handoff.py); a handler that cannot
suspend runs in its caller's task when the actor is idle (decision 0001). The host starts the
dispatcher with its nursery once open, and every change of the activation table goes
through here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import outcome
import structlog
import trio
from trio.lowlevel import current_task

from ..actor import Actor
from ..address import check_actor_name, split_address
from ..app import ActorClass
from ..errors import HostClosed, OutcomeUnknown, Overloaded, Quarantined
from ..http import Response, error_response
from .activation import Activation, ActivationHost, reset_current_actor, set_current_actor
from .activations import Activations
from .alarms import AlarmScheduler
from .burst import BurstLog
from .failures import Failures, quarantine_message
from .faults import FaultHooks
from .gate import Gate
from .handoff import STOP, CallTimeouts, Event, park, wake
from .migrate import Migrator
from .registry import Quarantine
from .runs import OUTSIDE_RUNS, begin_run, end_run, go_on_with_run
from .sockets import INTERNAL, Sockets
from .stats import HostStats
from .storage import Database, is_damage, out_of_descriptors

log = structlog.get_logger("actorkeep")
#: Refusals for a full inbox are logged at most once per this many seconds.
OVERLOAD_LOG_EVERY = 10.0

#: Inline calls (decision 0001) run without a scheduler pass; one in this many yields anyway.
INLINE_YIELD_EVERY = 32


class Dispatcher:
    """Runs events on the activations of ``host``'s actors.

    ``start(nursery, quarantine, alarms)`` once the host is open; ``closing`` is set when it
    closes (no new activations, no new workers).
    """

    def __init__(
        self,
        host: ActivationHost,
        classes: dict[str, ActorClass],
        idle_timeout: float,
        max_active: int,
        timeouts: CallTimeouts,
        failures: Failures,
        faults: FaultHooks | None,
        max_pending: int,
        gate_class: type[Gate] = Gate,
        stats: HostStats | None = None,
        sockets: Sockets | None = None,
        migrator: Migrator | None = None,
    ) -> None:
        self.host = host
        #: The host's WebSockets (sockets.py).
        self.sockets = sockets if sockets is not None else Sockets(classes)
        self.sockets.runner = self
        self.stats = stats if stats is not None else HostStats()
        self.gate_class = gate_class
        self.migrator = migrator if migrator is not None else Migrator()
        self.classes = classes
        self.activations = Activations(idle_timeout, max_active, self.start_worker, self.stats)
        self.timeouts = timeouts
        self.failures = failures
        self.faults = faults
        self.max_pending = max_pending
        self.quarantine: Quarantine | None = None
        self.alarms: AlarmScheduler | None = None
        #: Addresses being deleted (removal.py): no activation until they are gone.
        self.removing: set[str] = set()
        self.closing = False
        self._nursery: trio.Nursery | None = None
        self._inline_budget = INLINE_YIELD_EVERY
        self.now: Callable[[], float] = trio.current_time
        self._overloads = BurstLog(
            "refusing events: an actor's inbox is full", lambda: self.now(), OVERLOAD_LOG_EVERY
        )

    def start(self, nursery: trio.Nursery, quarantine: Quarantine, alarms: AlarmScheduler) -> None:
        self._nursery = nursery
        # The run's clock, read twice per event: its method, not trio.current_time's chain.
        self.now = self.activations.now = trio.lowlevel.current_clock().current_time
        self.quarantine = quarantine
        self.alarms = alarms

    def start_worker(self, act: Activation) -> None:
        """The activation table's callback for a new activation: its worker task."""
        assert self._nursery is not None
        self._nursery.start_soon(self._worker, act, name=f"actor {act.address}")

    def spawn(self, fn: Callable[[], Awaitable[None]]) -> None:
        """Start ``fn`` in the host's nursery (not once the host closes)."""
        self._spawn(fn)

    def _spawn(self, fn: Any, *args: Any) -> None:
        if self._nursery is not None and not self.closing:
            self._nursery.start_soon(fn, *args)

    async def dispatch(
        self,
        address: str,
        actor_class: ActorClass,
        name: str,
        ev: Event,
        timeout: float | None,
        hooked: bool = False,
    ) -> Response:
        if self.faults is not None and ev.chain and not hooked:
            # Under the simulator: the call may be delayed, refused or lose its reply, and an
            # inline-safe handler may run on the worker instead.
            await self.faults.before_call(ev.chain, address)
            if ev.inline and self.faults.buggify("host.no-inline"):
                ev.inline = False
            resp = await self.dispatch(address, actor_class, name, ev, timeout, hooked=True)
            self.faults.after_call(ev.chain, address)
            return resp
        if ev.inline:
            # Every call can be cancelled here; and the host yields to the scheduler at least
            # once per INLINE_YIELD_EVERY inline calls, so a loop of them cannot starve others.
            await trio.lowlevel.checkpoint_if_cancelled()
            self._inline_budget -= 1
            if self._inline_budget <= 0:
                self._inline_budget = INLINE_YIELD_EVERY
                await trio.lowlevel.cancel_shielded_checkpoint()
            act = self.activations.get(address)
            if act is not None and act.parked and act.instance is not None:
                return await self._run_inline(act, ev, timeout)
        self.enqueue(self.activation(address, actor_class, name), ev, limit=True)
        return await self.timeouts.wait_reply(ev, timeout)

    async def _run_inline(self, act: Activation, ev: Event, timeout: float | None) -> Response:
        """Run a handler that cannot suspend in the caller's task, while its actor is idle.

        Its worker is parked with nothing queued, and the handler has no yield point, so it
        runs from start to end with nothing else running: one event at a time and FIFO hold,
        and no timeout or cancellation can reach it. It is what the worker would do, without
        the two task switches (decision 0001).
        """
        inst = act.instance
        assert inst is not None
        gate = act.gate
        act.current = ev
        started = self.now()
        damaged = False
        token = set_current_actor(inst)
        try:
            result = await ev.call_handler(inst)
            resp = ev.response(result, act.sql is not None and act.sql.in_transaction)
        except Exception as exc:
            resp = self.failures.failed(act, exc, ev.from_outside)
            damaged = is_damage(exc)
        finally:
            reset_current_actor(token)
            self._after_event(act)  # sets act.last_used: now
            act.class_stats.latency[ev.kind].observe(act.last_used - started)
        if damaged:
            raise Quarantined(quarantine_message(act.address))
        if gate is not None and gate.closed:
            if gate.failed is not None:  # refused here: no waiter is registered yet
                return self._refusal(act, ev, gate.error())
            gate.hold(ev, outcome.Value(resp))  # the output gate: wait for the writes
            return await self.timeouts.wait_reply(ev, timeout)
        return resp

    def activation(self, address: str, actor_class: ActorClass, name: str) -> Activation:
        if self.closing or self._nursery is None:
            raise HostClosed("the host is closed")
        act = self.activations.get(address)
        if act is not None:
            self.activations.touch(act)
            return act
        if self.quarantine is not None and address in self.quarantine:
            raise Quarantined(quarantine_message(address))
        if address in self.removing:
            raise Overloaded(f"{address} is being deleted", retry_after=1.0)
        check_actor_name(name)  # the one place a file can come into being: never trust callers
        act = Activation(self.host, actor_class, address, name)
        self.activations.add(act)
        return act

    def evict_idle(self, address: str) -> bool:
        """``Host.evict``: take ``address`` out of memory if it is idle; whether it is out."""
        act = self.activations.get(address)
        if act is None:
            return True
        busy = act.current is not None or act.inbox or (act.gate is not None and act.gate.busy)
        if not act.parked or busy:
            return False
        self.activations.evict(act)
        return True

    def activation_of(self, address: str) -> Activation | None:
        """The activation of ``address`` if it is in memory."""
        return self.activations.get(address)

    def wait_done(self, ev: Event) -> Awaitable[Response]:
        """Until ``ev`` (enqueued) has run: what it answered."""
        return self.timeouts.wait_reply(ev, None)

    def enqueue(self, act: Activation, ev: Event, limit: bool) -> None:
        if limit and len(act.inbox) >= self.max_pending:
            self._note_overload(act.address)
            raise Overloaded(f"{act.address} has {len(act.inbox)} waiting events")
        act.inbox.append(ev)
        if act.parked:
            act.parked = False
            assert act.task is not None
            wake(act.task)

    def _note_overload(self, address: str) -> None:
        """Count an event refused for a full inbox, and log the burst (burst.py)."""
        self.stats.inbox_full += 1
        self._overloads.note(address=address, max_pending=self.max_pending)

    async def _worker(self, act: Activation) -> None:
        act.task = current_task()
        inbox = act.inbox
        coalesce = act.actor_class.cls.coalesce_writes
        run = 0  # events in the run's transaction so far
        try:
            while True:
                if not inbox:
                    if run:  # the events left of it were abandoned: none is queued now
                        run = end_run(act)
                    if act.closed:
                        return  # evicted while its last event ran
                    if act.reset_pending:
                        act.close_db()  # a sync failed: the next event opens the file afresh
                    act.parked = True
                    if await park() is STOP:
                        return
                    continue
                ev = inbox.popleft()
                if ev.abandoned:  # its caller is gone: skip it, but it was activity
                    self.activations.used(act)
                    continue
                if run and ev.kind in OUTSIDE_RUNS:  # behind abandoned events of the run
                    run = end_run(act)
                act.current = ev
                started = self.now()
                try:
                    if ev.kind == "alarm":
                        assert self.alarms is not None
                        await self.alarms.run(act)
                    elif ev.kind == "checkpoint":
                        await self._checkpoint(act)
                    else:
                        if coalesce and inbox and not run:
                            run = begin_run(act)
                        result = await self._run(act, ev)
                        gate = act.gate
                        # A socket's event answers nobody outside: its sends are gated.
                        if gate is not None and gate.closed and ev.kind != "websocket":
                            gate.hold(ev, result)  # the output gate: wait for the writes
                        else:
                            self.timeouts.reply(ev, result)
                except BaseException:  # cancelled: the host is closing; answer the caller
                    closed = HostClosed(f"{act.address} was shut down")
                    self.timeouts.reply(ev, outcome.Error(closed))
                    raise
                finally:
                    if run:
                        run = go_on_with_run(act, run)
                    self._after_event(act)  # sets act.last_used: now
                    if ev.kind != "checkpoint":
                        act.class_stats.latency[ev.kind].observe(act.last_used - started)
        finally:
            self.retire(act)

    def _after_event(self, act: Activation) -> None:
        act.current = None
        self.activations.used(act)
        db = act.db
        if act.reset_pending:
            act.close_db()  # a sync failed: the next event opens the database afresh
        elif (
            db is not None
            and not act.closed  # evicted: its database closes (under the simulator, maybe now)
            and db.conn.total_changes >= db.look_at
            and not act.checkpointing
            and db.checkpoint_due()
        ):
            act.checkpointing = True
            self._start_now(self._prepare_checkpoint, act)
        faults = self.faults
        if (
            faults is not None
            and not act.closed
            and not act.inbox
            and faults.buggify("host.evict-after-event")
        ):
            self.activations.evict(act)

    async def _prepare_checkpoint(self, act: Activation) -> None:
        """The first step of a checkpoint, while the actor goes on; then the last, as an event
        of the actor's own (it takes no other meanwhile)."""
        db = act.db
        if db is None:  # closed before this task started
            act.checkpointing = False
            return
        try:
            await db.prepare_checkpoint()
        except Exception as exc:  # the log keeps growing; the next look tries again
            act.checkpointing = False
            log.warning("checkpoint failed", address=act.address, file=db.where, error=repr(exc))
            return
        if act.db is db and not act.closed:
            self.enqueue(act, Event.checkpoint(), limit=False)
        else:
            act.checkpointing = False

    async def _checkpoint(self, act: Activation) -> None:
        """The last step of a checkpoint (storage.py), while the actor takes no event."""
        db = act.db
        try:
            if db is not None:
                await db.checkpoint()
        except Exception as exc:  # the log keeps growing; the next look tries again
            log.warning("checkpoint failed", address=act.address, file=act.where, error=repr(exc))
        finally:
            act.checkpointing = False

    # -- output gates ------------------------------------------------------------------------
    def new_gate(self, act: Activation, db: Database) -> Gate:
        """The output gate of ``act``'s newly opened database."""

        def refuse(ev: Event, exc: BaseException) -> None:
            self.timeouts.reply(ev, outcome.Value(self._refusal(act, ev, exc)))

        def failed(exc: BaseException) -> None:
            log.error(
                "sync failed: the actor's held replies are refused and its database reopened",
                address=act.address,
                file=db.where,
                error=repr(exc),
                # What the storage said its callers hear (503 "may be durable", say) is often
                # not what went wrong: that is the cause.
                cause=None if exc.__cause__ is None else repr(exc.__cause__),
            )
            # What its sockets were sent may be lost: the clients reconnect and read afresh.
            self.sockets.close_actor(act.address, INTERNAL, "the actor's storage failed")
            if act.gate is not gate:
                return  # that database is closed already
            if act.current is None and act.parked:
                act.close_db()
            else:
                act.reset_pending = True  # once the running event ends

        gate = self.gate_class(db, self._start_now, self.timeouts.reply, refuse, failed)
        return gate

    def _refusal(self, act: Activation, ev: Event, exc: BaseException) -> Response:
        """The reply to an event whose writes a failed sync may have lost: 500, or 503 when
        the storage says the actor is served elsewhere now or the outcome is unknown."""
        assert isinstance(exc, Exception)
        if isinstance(exc, Overloaded | OutcomeUnknown):
            name = "Overloaded" if isinstance(exc, Overloaded) else "OutcomeUnknown"
            retry = {"retry-after": str(max(1, round(exc.retry_after)))}
            return error_response(503, name, exc.message, retry)
        return self.failures.error_reply(
            exc, "a durable write failed: its reply is refused", act.address, ev.from_outside
        )

    async def drain_gates(self) -> None:
        """Until no gate of an actor in memory has a sync running or waiting (a clean close:
        what they hold is answered)."""
        while True:
            busy = [a.gate for a in self.activations if a.gate is not None and a.gate.busy]
            if not busy:
                return
            for gate in busy:
                with contextlib.suppress(Exception):
                    await gate.sync()

    def _start_now(self, fn: Any, *args: Any) -> None:
        """Start a gate's sync task (or a checkpoint's), even while the host closes: a gate
        answers what it holds."""
        assert self._nursery is not None
        self._nursery.start_soon(fn, *args)

    def retire(self, act: Activation) -> None:
        """Forget an activation whose worker has ended; fail the events it will never run."""
        self.activations.forget(act)
        while act.inbox:  # an outcome is unwrapped once: one each
            closed = HostClosed(f"{act.address} was shut down")
            self.timeouts.reply(act.inbox.popleft(), outcome.Error(closed))
        act.close()

    async def open_instance(self, act: Activation) -> Actor:
        """The actor's instance: its database opened and ``setup()`` run if need be."""
        inst = act.instance
        if inst is None:
            if act.db is None:
                await act.open()
            await self.migrator.migrate(act)
            inst = act.new_instance()
            await inst.setup()
        return inst

    async def _run(self, act: Activation, ev: Event) -> outcome.Outcome[Response]:
        try:
            inst = act.instance  # in memory already: no coroutine to open it (the common case)
            if inst is None:
                inst = await self.open_instance(act)
        except Exception as exc:
            # Overloaded: the storage cannot open the actor here now (in a cluster: another
            # host serves its partition, or none yet). Out of descriptors, likewise for now.
            busy = exc if isinstance(exc, Overloaded) else None
            if busy is None and out_of_descriptors(exc, closing=self.host.storage.closing > 0):
                self.failures.out_of_descriptors(act.address)
                busy = Overloaded("the host is out of file descriptors for now", retry_after=1.0)
            if busy is None:
                return self._event_failed(act, ev, exc)
            # Nothing of the event ran: the caller may try again, as for any overload.
            with contextlib.suppress(Exception):
                act.rollback()
            act.discard_instance()
            return outcome.Error(busy)
        try:
            result = await ev.call_handler(inst)
            return outcome.Value(
                ev.response(result, act.sql is not None and act.sql.in_transaction)
            )
        except Exception as exc:
            return self._event_failed(act, ev, exc)

    def _event_failed(
        self, act: Activation, ev: Event, exc: Exception
    ) -> outcome.Outcome[Response]:
        """The reply of an event that raised: a 500, or ``Quarantined`` if its storage is
        damaged (raised to the caller, as for every later event of the actor)."""
        resp = self.failures.failed(act, exc, ev.from_outside)
        if is_damage(exc):
            return outcome.Error(Quarantined(quarantine_message(act.address)))
        return outcome.Value(resp)

    def fail(self, act: Activation, exc: Exception) -> None:
        """A failed alarm event (alarms.AlarmRunner): as any failed event, nobody to answer."""
        self.failures.failed(act, exc)

    def take_out(self, act: Activation, message: str) -> None:
        """A quarantined actor leaves memory; what waits for it is refused."""
        self.activations.evict(act)
        self.sockets.close_actor(act.address, INTERNAL, "the actor is quarantined")
        while act.inbox:  # an outcome is unwrapped once: one each
            self.timeouts.reply(act.inbox.popleft(), outcome.Error(Quarantined(message)))

    def fire_alarm(self, address: str, early: bool) -> None:
        """Hand a due alarm to its actor (the scheduler marked it running)."""
        try:
            class_name, name = split_address(address)
        except ValueError:
            class_name = name = ""
        actor_class = self.classes.get(class_name)
        if actor_class is None:
            # Keep the entry (and it stays marked running): the class may come back with the
            # next deploy of the app.
            log.warning("alarm for an actor class this app does not serve", address=address)
            return
        delay = 0.0 if self.faults is None or early else self.faults.alarm_delay(address)
        if delay > 0:
            self._spawn(self._fire_late, address, actor_class, name, delay)
            return
        self.enqueue(self.activation(address, actor_class, name), Event.alarm(), limit=False)

    async def _fire_late(
        self, address: str, actor_class: ActorClass, name: str, delay: float
    ) -> None:
        await trio.sleep(delay)
        if self.closing:
            return  # the alarm stays in the index: the next host fires it
        act = self.activation(address, actor_class, name)
        self.enqueue(act, Event.alarm(), limit=False)
