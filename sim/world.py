"""``World``: run an app's hosts under a seeded scheduler, virtual time and injected faults.

    world = sim.World(app, seed=7)

    async def main(world: sim.World) -> None:
        op = await world.invoke("c1", "counter.incr", {"by": 2},
                                lambda host: world.rpc("counter/a", "incr", by=2))
        world.crash()                 # kill -9: fenced, then cancelled, no graceful close
        await world.restart()
        await world.deploy(app_v2)    # the next version of the app, from the next start on
        ...

    trace = world.run(main)          # trio.run under MockClock and the seeded scheduler

Every random choice comes from ``world.rng(name)`` (one stream per component), so a seed
replays exactly. Calls made through ``invoke`` are recorded in ``world.history`` as invoke ->
ok / fail / unknown: unknown when the host incarnation that served it crashed before the world
saw the reply, or when the call raised instead of answering.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import trio
import trio.lowlevel
import trio.testing

from actorkeep.app import App
from actorkeep.front import Front
from actorkeep.http import Response
from actorkeep.runtime.clock import Clock
from actorkeep.runtime.host import Host

from .determinism import StepCounter, quiet_logs, seeded_scheduler, sub_rng
from .fault_schedule import (
    OP_CRASH_STEPS,
    POWER_LOSSES,
    FaultDecisions,
    FaultEvent,
    FaultSchedule,
)
from .faults import Faults, SimHooks
from .history import History, Op, Status
from .storage import SimDatabase, SimStorage, SimStorageView

T = TypeVar("T")

#: The host clock's epoch at trio time zero: 2023-11-14T22:13:20Z.
ANCHOR = 1_700_000_000.0
#: The caller address the world uses for ``rpc`` calls into the app.
WORLD_CALLER = "sim-world/world"


class Incarnation:
    """One run of the host process, from start to crash or stop."""

    def __init__(self, number: int, host: Host, view: SimStorageView | None) -> None:
        self.number = number
        self.host = host
        self.front = Front(host)
        self.view = view
        self.alive = True
        self.scope = trio.CancelScope()
        self.stop = trio.Event()
        self.done = trio.Event()


class Stuck(Exception):
    """The workload did not end within the world's virtual time limit: a deadlock (nothing
    left to run, nothing to wait for) or a livelock."""


#: Virtual seconds a workload may take before the world calls it stuck (``World.time_limit``).
TIME_LIMIT = 24 * 3600.0


class World:
    """One simulated machine running ``app``, fully determined by ``seed``."""

    #: A workload still running after this many virtual seconds raises ``Stuck``: a deadlock
    #: would otherwise never end (with nothing to wait for, the mock clock has nowhere to jump).
    time_limit = TIME_LIMIT

    def __init__(
        self,
        app: App,
        seed: int,
        *,
        faults: Faults | None = None,
        anchor: float = ANCHOR,
        host_options: Mapping[str, Any] | None = None,
        schedule: FaultSchedule | None = None,
    ) -> None:
        self.app = app
        self.seed = seed
        # A copy: heal() turns the faults off, and the caller may give the same to many worlds.
        self.faults = dataclasses.replace(faults) if faults is not None else Faults()
        #: Where fault decisions come from: the seed, or ``schedule`` (sim/fault_schedule.py).
        self.decisions = FaultDecisions(schedule)
        self.healed = False
        self._fault_sleep: trio.CancelScope | None = None
        self.injecting = False  # a fault of the schedule is crashing the host
        self.clock = Clock(anchor=anchor)
        self.history = History()
        # Tests and checkers read why an outside request failed: show it (actorkeep --debug).
        self.host_options = {"debug": True, **(host_options or {})}
        self._fault_rng = self.rng("world-faults")
        self._op_rng = self.rng("op-faults")
        self._op_crashes = 0
        self.hooks = SimHooks(
            self.faults, self.history, self.now, self.rng("hooks"), WORLD_CALLER, self.decisions
        )
        self.storage = SimStorage(
            fsync_delay=self._fsync_delay, on_sync=self._on_sync, on_remove=self._on_remove
        )
        self.current: Incarnation | None = None
        self.incarnations = 0
        self.crashes = 0
        #: Actors some incarnation quarantined (``address -> reason``); always empty unless
        #: the host mistakes what crashes and power loss leave for damage.
        self.quarantined: dict[str, str] = {}
        self.steps = StepCounter()
        self._up = trio.Event()
        self._nursery: trio.Nursery | None = None

    # -- randomness -------------------------------------------------------------------------
    def rng(self, name: str) -> random.Random:
        """The random stream of component ``name`` (a function of the seed and the name)."""
        return sub_rng(self.seed, name)

    def now(self) -> float:
        """The host clock (epoch seconds)."""
        return self.clock.now()

    # -- running ----------------------------------------------------------------------------
    def run(self, main: Callable[[World], Awaitable[T]]) -> T:
        """``trio.run`` the world: start a host, run ``main(world)``, stop the host."""
        with seeded_scheduler(self.seed), quiet_logs():
            return trio.run(
                self._bounded,
                main,
                clock=trio.testing.MockClock(autojump_threshold=0),
                instruments=[self.steps],
            )

    async def arun(self, main: Callable[[World], Awaitable[T]]) -> T:
        """Run the world inside an existing ``trio.run`` whose clock is a ``MockClock``.

        For tests and examples that already run trio. The scheduler is seeded from here on,
        but the tasks of the enclosing program share it: a seed replays exactly only with the
        same enclosing program. ``run`` is the reference.
        """
        if not isinstance(trio.lowlevel.current_clock(), trio.testing.MockClock):
            raise RuntimeError("World.arun needs trio.run(..., clock=trio.testing.MockClock())")
        trio.lowlevel.add_instrument(self.steps)
        try:
            with seeded_scheduler(self.seed), quiet_logs():
                return await self._bounded(main)
        finally:
            trio.lowlevel.remove_instrument(self.steps)

    async def _bounded(self, main: Callable[[World], Awaitable[T]]) -> T:
        with trio.move_on_after(self.time_limit):
            return await self._main(main)
        raise Stuck(f"the workload did not end within {self.time_limit:g} virtual seconds")

    async def _main(self, main: Callable[[World], Awaitable[T]]) -> T:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await self.start()
            result = await main(self)
            await self.stop()
            nursery.cancel_scope.cancel()
        return result

    async def start(self) -> Incarnation:
        """Start a new host incarnation on the storage as the last one left it."""
        if self.current is not None and self.current.alive:
            raise RuntimeError("a host is already running")
        assert self._nursery is not None, "start() runs inside World.run"
        self.incarnations += 1
        n = self.incarnations
        view = self.storage.view()
        host = Host(
            self.app,
            view,
            clock=self.clock,
            rng=self.rng(f"host/{n}"),
            faults=self.hooks,
            **self.host_options,
        )
        inc = Incarnation(n, host, view)
        await self._nursery.start(self._run_host, inc)
        self.current = inc
        self._up.set()
        return inc

    async def _run_host(self, inc: Incarnation, task_status: trio.TaskStatus[None]) -> None:
        try:
            with inc.scope:
                async with trio.open_nursery() as fsyncs:
                    if inc.view is not None:
                        inc.view.spawn = fsyncs.start_soon  # dies with the incarnation
                    async with inc.host.open():
                        task_status.started()
                        await inc.stop.wait()
        except BaseException:
            # A crashed incarnation dies with whatever its tasks hit after the fence (closed
            # connections, Fenced): that is the crash itself, not an error of the run.
            if inc.alive:
                raise
        finally:
            # The simulator never damages a file: any quarantine is a false alarm of the host.
            self.quarantined.update(inc.host.quarantined)
            inc.done.set()

    async def stop(self) -> None:
        """Stop the current host gracefully (its connections close and keep what they hold)."""
        inc = self.current
        if inc is None or not inc.alive:
            return
        self._down()
        inc.alive = False
        inc.stop.set()
        await inc.done.wait()
        self.history.fault("stop", self.now(), host=inc.number)

    def _down(self) -> None:
        if self._up.is_set():
            self._up = trio.Event()

    # -- faults -----------------------------------------------------------------------------
    def crash(self, power_loss: bool = False, restart_after: float | None = None) -> bool:
        """Crash the current host now (fence its storage, cancel its task), as kill -9 would.

        With ``power_loss`` each file then keeps its committed image or rolls back to its
        durable one (``Faults.rollback_p``; replaying a schedule: the files of its
        ``rollback`` fault for this power loss). ``restart_after``: start the next
        incarnation after that many virtual seconds. False if no host was running.
        """
        return self._crash(power_loss, restart_after) is not None

    def _crash(
        self,
        power_loss: bool,
        restart_after: float | None = None,
        files: tuple[str, ...] | None = None,
    ) -> tuple[str, ...] | None:
        """``crash``, returning the files the power loss rolled back (None: no host was
        running). ``files``: replaying a fault, the ones it rolls back."""
        inc = self.current
        if inc is None or not inc.alive:
            return None
        self._down()
        inc.alive = False
        self.crashes += 1
        assert inc.view is not None
        rolled: list[str] = []
        if power_loss:
            rolled = self._power_loss(inc.view, files)
            self.history.fault("power-loss", self.now(), host=inc.number, rolled_back=rolled)
        else:
            self.storage.crash(inc.view)
            self.history.fault("crash", self.now(), host=inc.number)
        inc.scope.cancel()
        if restart_after is not None:
            assert self._nursery is not None
            self._nursery.start_soon(self.restart, restart_after)
        return tuple(rolled)

    def _power_loss(self, view: SimStorageView, files: tuple[str, ...] | None) -> list[str]:
        if files is not None:
            return self.storage.power_loss(view, None, files=files)
        if self.injecting:  # a fault's power loss draws its rollback, kept with the fault
            return self.storage.power_loss(view, self._fault_rng, self.faults.rollback_p)
        # One the caller asked for (``crash``): its rollback is a decision of its own.
        d = self.decisions
        n = d.reach("power-loss")
        if d.replaying:
            planned = d.planned("rollback", n)
            rolled = self.storage.power_loss(view, None, files=planned.files if planned else ())
        else:
            rolled = self.storage.power_loss(view, self._fault_rng, self.faults.rollback_p)
        if rolled:
            d.take(FaultEvent("rollback", n, files=tuple(rolled)))
        return rolled

    def _inject(self, event: FaultEvent, restart_after: float | None) -> FaultEvent | None:
        """Crash the host as the fault ``event`` says: ``event`` with the files its power loss
        rolled back (for the schedule), or None if no host was running."""
        power = event.kind in POWER_LOSSES
        files = event.files if self.decisions.replaying else None
        self.injecting = True
        try:
            rolled = self._crash(power, restart_after, files)
        finally:
            self.injecting = False
        if rolled is None:
            return None
        return dataclasses.replace(event, files=rolled if power else ())

    async def restart(self, downtime: float = 0.0) -> Incarnation:
        """Wait for the dead host to finish dying, then ``downtime``, then start the next one."""
        inc = self.current
        if inc is not None:
            if inc.alive:
                await self.stop()
            await inc.done.wait()
        if downtime > 0:
            await trio.sleep(downtime)
        if self.current is not None and self.current is not inc and self.current.alive:
            return self.current  # someone else restarted it meanwhile
        new = await self.start()
        self.history.fault("restart", self.now(), host=new.number)
        return new

    async def deploy(self, app: App, downtime: float = 0.0) -> Incarnation:
        """Deploy a new version of the app: stop the host gracefully and start it again, after
        ``downtime``, running ``app``, as every later start does (after a crash too)."""
        self.app = app
        self.history.fault("deploy", self.now())
        return await self.restart(downtime)

    async def timed_faults(
        self, rng: random.Random, count: int, span: float, power_p: float
    ) -> None:
        """``count`` crashes or power losses (each a power loss with ``power_p``) at random
        moments spread over ``span`` virtual seconds, each followed by a restart. Replaying a
        schedule: its timed faults instead, and nothing is drawn. Ends early at ``heal``."""
        if self.decisions.replaying:
            for event in self.decisions.schedule.timed() if self.decisions.schedule else []:
                if not await self._fault_pause(until=event.at):
                    return
                done = self._inject(event, None)
                self.decisions.take(done or event)
                if done is not None:
                    await self.restart(event.value)
            return
        for _ in range(count):
            if not await self._fault_pause(rng.uniform(0.0, span / max(count, 1))):
                return
            power = rng.random() < power_p
            event = FaultEvent("power" if power else "crash", trio.current_time())
            done = self._inject(event, None)
            if done is None:
                self.decisions.take(event)
                continue
            downtime = rng.uniform(0.0, 0.5)
            self.decisions.take(dataclasses.replace(done, value=downtime))
            await self.restart(downtime)

    async def _fault_pause(self, seconds: float = 0.0, until: float | None = None) -> bool:
        """Sleep ``seconds`` (or until trio time ``until``) before the next timed fault: False
        if ``heal`` came first (or meanwhile)."""
        if self.healed:
            return False
        with trio.CancelScope() as scope:
            self._fault_sleep = scope
            try:
                if until is not None:
                    await trio.sleep_until(until)
                else:
                    await trio.sleep(seconds)
            finally:
                self._fault_sleep = None
        return not scope.cancelled_caught

    def heal(self) -> None:
        """End the fault phase: no more injected crashes, call faults, late alarms or BUGGIFY
        (timed faults are the caller's to stop). What follows should show liveness."""
        self.faults.heal()
        self.hooks.heal()
        self.healed = True
        if self._fault_sleep is not None:
            self._fault_sleep.cancel()  # a timed fault waiting for its moment: it never comes
        self.history.note("heal: no more injected faults")

    def _fsync_delay(self) -> float:
        d = self.decisions
        n = d.reach("sync")
        if d.replaying:
            planned = d.planned("slow-fsync", n)
            return d.take(planned).value if planned is not None else 0.0
        f = self.faults
        if f.fsync_delay_p > 0 and self._fault_rng.random() < f.fsync_delay_p:
            delay = self._fault_rng.uniform(0.0, f.fsync_delay_max)
            d.take(FaultEvent("slow-fsync", n, delay))
            return delay
        return 0.0

    def _on_sync(self, db: SimDatabase) -> None:
        self._crash_after(f"the sync of {db.key}")

    def _on_remove(self, key: str) -> None:
        self._crash_after(f"the deletion of {key}")

    def _crash_after(self, what: str) -> None:
        d = self.decisions
        n = d.reach("durable")
        f = self.faults
        if d.replaying:
            if self.healed:
                return
            event = d.planned("crash-after-sync", n) or d.planned("power-after-sync", n)
            if event is None:
                return
            downtime = event.value
        elif (
            f.crash_after_sync_p > 0
            and self.crashes < f.max_crashes
            and self._fault_rng.random() < f.crash_after_sync_p
        ):
            power = self._fault_rng.random() < f.power_loss_p
            downtime = self._fault_rng.uniform(0.0, f.downtime_max)
            kind = "power-after-sync" if power else "crash-after-sync"
            event = FaultEvent(kind, n, downtime)
        else:
            return
        if self.current is None or not self.current.alive:
            return  # between incarnations (a new host syncing as it starts): nothing to crash
        self.history.note(f"crash right after {what}")
        done = self._inject(event, downtime)
        if done is not None:
            d.take(done)

    # -- reaching the app -------------------------------------------------------------------
    async def wait_up(self) -> Incarnation:
        """The running host incarnation, waiting for a restart if there is none."""
        while True:
            inc = self.current
            if inc is not None and inc.alive:
                return inc
            await self._up.wait()

    async def rpc(
        self, address: str, method: str, timeout: float | None = 30.0, **args: Any
    ) -> Any:
        """Call ``@rpc method`` of ``address`` as the actor ``sim-world/world``."""
        inc = await self.wait_up()
        return await inc.host.call_rpc(
            WORLD_CALLER, (WORLD_CALLER,), address, method, args, timeout
        )

    async def call_as(
        self,
        caller: str,
        address: str,
        method: str,
        path: str,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
        timeout: float | None = 30.0,
    ) -> Response:
        """An HTTP-shaped call from the actor ``caller`` (which need not exist)."""
        inc = await self.wait_up()
        return await inc.host.call_as(caller, address, method, path, body, headers, timeout)

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        """A request from outside, through the front (header stripping, access rules)."""
        inc = await self.wait_up()
        return await inc.front.request(method, path, json=json, body=body, headers=headers)

    async def invoke(
        self,
        process: str,
        kind: str,
        args: dict[str, Any],
        action: Callable[[], Awaitable[Any]],
        *,
        classify: Callable[[Any], tuple[Status, Any]] | None = None,
        timeout: float = 120.0,
    ) -> Op:
        """Run ``action`` (a call into the app) and record it as one operation.

        ``classify`` maps the action's return value to (status, result); by default it is
        ok. A reply seen after the serving incarnation crashed is unknown (its effects may or may
        not have happened); so is an exception or a timeout. An exception or timeout while the
        host stayed up is recorded as ``{"error": ..., "host_alive": True}`` for the checkers.
        """
        inc = await self.wait_up()
        op = self.history.invoke(process, kind, args, inc.number, self.now())
        crashed = self._op_fault(inc)
        status: Status = "unknown"
        result: Any = None
        with trio.move_on_after(timeout) as scope:
            try:
                value = await action()
            except Exception as exc:
                alive = inc.alive and not self.excused(exc)
                result = {"error": self.describe(exc), "host_alive": alive}
            else:
                status, result = classify(value) if classify is not None else ("ok", value)
        if scope.cancelled_caught:
            result = {"error": f"no answer within {timeout} s", "host_alive": inc.alive}
        if not inc.alive and status != "unknown":
            status, result = "unknown", {"late": result}
        self.history.complete(op, status, result, self.now())
        if crashed is not None:
            await crashed.wait()  # an action that never let the crash land: right after it
        return op

    def _op_fault(self, inc: Incarnation) -> trio.Event | None:
        """Maybe crash ``inc`` a few scheduler steps into the operation starting now
        (``Faults.op_crash_p``; replaying a schedule: where it has an op-crash or op-power).
        The event is set once the crash landed, or was called off."""
        d = self.decisions
        n = d.reach("op")
        if d.replaying:
            if self.healed:
                return None
            event = d.planned("op-crash", n) or d.planned("op-power", n)
        else:
            f = self.faults
            if not (
                f.op_crash_p > 0
                and self._op_crashes < f.max_crashes
                and self._op_rng.random() < f.op_crash_p
            ):
                return None
            power = self._op_rng.random() < f.power_loss_p
            downtime = self._op_rng.uniform(0.0, f.downtime_max)
            steps = self._op_rng.randint(0, OP_CRASH_STEPS)
            event = FaultEvent("op-power" if power else "op-crash", n, downtime, steps=steps)
        if event is None:
            return None
        self._op_crashes += 1
        done = trio.Event()
        assert self._nursery is not None
        self._nursery.start_soon(self._crash_into, inc, event, done)
        return done

    async def _crash_into(self, inc: Incarnation, event: FaultEvent, done: trio.Event) -> None:
        try:
            for _ in range(event.steps):
                await trio.lowlevel.checkpoint()
            if inc is not self.current or not inc.alive or self.healed:
                return  # another fault got there first, or the faults are over
            self.history.note(f"crash {event.steps} steps into operation {int(event.at)}")
            injected = self._inject(event, event.value)
            if injected is not None:
                self.decisions.take(injected)
        finally:
            done.set()

    def excused(self, exc: BaseException) -> bool:
        """Whether the world's faults explain ``exc`` while the host is up (never, on one
        host: an error while the host stays up is a bug)."""
        return False

    def describe(self, exc: BaseException) -> str:
        """How an exception is recorded in the history."""
        return f"{type(exc).__name__}: {exc}"

    # -- results ----------------------------------------------------------------------------
    def trace_hash(self) -> str:
        """SHA-256 over the history, the scheduler step count, the clock and every file."""
        h = hashlib.sha256()
        h.update(self.history.digest().encode())
        h.update(f"steps={self.steps.steps} crashes={self.crashes}".encode())
        for key, committed, durable in self.storage.digest_parts():
            h.update(key.encode())
            for image in (committed, durable):
                h.update(hashlib.sha256(image).digest() if image is not None else b"-")
        return h.hexdigest()
