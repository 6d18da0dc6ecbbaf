"""The schedules scenario: clients set one-shot and cron schedules on planner actors, replace
and cancel them, while the host crashes and loses power and runs fail and are retried; then
checked (docs/simulation.md).

The invariants, over the history (virtual time):

- ``never-early``: no run begins before the time it stands for (``ScheduleRun.due``).
- ``at-least-once``: for each schedule key whose last write (ordered after every other write
  of the key) is an acknowledged ``schedule``, a one-shot runs at its due time, and a cron
  schedule (``missed="each"``) runs every occurrence from its first due time up to the
  horizon (the end of the run less a margin for late alarms and retries), each at least once
  and to completion.
- ``cancel-sticks``: after an acknowledged ``cancel_schedule`` that is its key's last write, no
  run of that key begins.

Every write here is durable when it is acknowledged (``wait=True`` waits for its fsync, and
the reply to a ``wait=False`` one is held by the output gate until it is durable), so power
loss excuses none of these.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any

import trio

import actorkeep as ak

from .check import Violation
from .faults import FaultDraw
from .history import History, Op, Status
from .runner import Scenario, Setup
from .world import World

PLANNER = "planner"
#: After the heal: longer than every retry of a failing run (2 s, then 4 s), a late alarm
#: (2 s) and the longest one-shot delay.
SETTLE = 30.0
#: Occurrences due within this many seconds of the end are not owed yet.
MARGIN = 10.0
EPS = 1e-6
WRITES = ("sched.once", "sched.cron", "sched.cancel")


class Recorder:
    """The world's ear inside the app."""

    def __init__(self) -> None:
        self.world: World | None = None
        self.rng = random.Random(0)
        self.fail_p = 0.0
        self.healed = False


class Planner(ak.Actor):
    """Schedules of its own, set and cancelled by RPC; each run is reported to the world."""

    @property
    def recorder(self) -> Recorder:
        rec: Recorder = self.options["recorder"]
        return rec

    @ak.rpc
    async def once(self, key: str, delay: float, wait: bool = True) -> float:
        """A one-shot in ``delay`` seconds; its due time. ``wait=False``: a gated write (the
        reply leaves once it is durable)."""
        await self.schedule("run", key, delay=delay, key=key, wait=wait)
        return self._due(key)

    @ak.rpc
    async def cron(self, key: str, every: int, wait: bool = True) -> float:
        """Every ``every`` seconds, each occurrence run (``missed="each"``); its first due."""
        cron = f"*/{every} * * * * *"
        await self.schedule("run", key, cron=cron, missed="each", key=key, wait=wait)
        return self._due(key)

    @ak.rpc
    async def cancel(self, key: str, wait: bool = True) -> bool:
        return await self.cancel_schedule(key, wait=wait)

    @ak.rpc
    async def listed(self) -> list[list[Any]]:
        return [[s.key, s.due, s.cron] for s in self.schedules()]

    def _due(self, key: str) -> float:
        found = self.get_schedule(key)
        assert found is not None
        return found.due

    async def run(self, run: ak.ScheduleRun) -> None:
        rec = self.recorder
        assert rec.world is not None
        # Fails at most twice in a row: the host's retries always outlast it.
        fails = not rec.healed and run.retry_count < 2 and rec.rng.random() < rec.fail_p
        rec.world.history.observe(
            "sched.run",
            self.now(),
            actor=self.address,
            key=run.key,
            due=run.due,
            retry_count=run.retry_count,
            fails=fails,
        )
        if fails:
            raise RuntimeError("sim: the scheduled run failed on purpose")


class CancelIgnored(Planner):
    """Planted: answers a cancel as done and cancels nothing."""

    @ak.rpc
    async def cancel(self, key: str, wait: bool = True) -> bool:
        return self.get_schedule(key) is not None


class RunsEarly(Planner):
    """Planted: sets each one-shot of half a second or more half a second early, and answers
    (and reports its runs with) the time it was asked for."""

    @ak.rpc
    async def once(self, key: str, delay: float, wait: bool = True) -> float:
        promised = self.now() + delay
        early = delay - 0.5 if delay >= 0.5 else delay
        await self.schedule("run", promised, delay=early, key=key, wait=wait)
        return promised

    async def run(self, run: ak.ScheduleRun) -> None:
        if isinstance(run.payload, float):  # a one-shot: the time promised
            run = ak.ScheduleRun(run.key, run.key, run.payload, run.retry_count)
        await super().run(run)


class ForgetsOnRestart(Planner):
    """Planted: drops its cron schedules whenever an instance opens (after a crash, a restart
    or an idle eviction), as schedules kept only in memory would be."""

    async def setup(self) -> None:
        for s in self.schedules():
            if s.cron is not None:
                await self.cancel_schedule(s.key)


# -- the plan and the workload -----------------------------------------------------------------


@dataclass(frozen=True)
class SchedulePlan:
    planners: int
    keys: int
    clients: int
    ops: int
    delays: tuple[float, ...]
    fail_p: float
    gated_p: float  # writes that do not wait for their fsync (wait=False)


def draw_plan(rng: random.Random) -> SchedulePlan:
    return SchedulePlan(
        planners=rng.randint(1, 3),
        keys=rng.randint(1, 4),
        clients=rng.randint(1, 3),
        ops=rng.randint(5, 15),
        delays=rng.choice([(0.0, 0.05, 0.5), (0.1, 1.0, 3.0), (0.0, 2.0, 8.0)]),
        fail_p=rng.choice([0.0, 0.1, 0.3]),
        gated_p=rng.choice([0.0, 0.5, 1.0]),
    )


def _classify(reply: Any) -> tuple[Status, Any]:
    return "ok", reply


async def op(w: World, process: str, kind: str, planner: str, method: str, **args: Any) -> Op:
    address = f"{PLANNER}/{planner}"
    return await w.invoke(
        process,
        kind,
        {"actor": address, **args},
        lambda: w.rpc(address, method, timeout=None, **args),
        classify=_classify,
    )


async def client(w: World, p: str, plan: SchedulePlan, rng: random.Random) -> None:
    for _ in range(plan.ops):
        planner, key = f"a{rng.randrange(plan.planners)}", f"k{rng.randrange(plan.keys)}"
        r, wait = rng.random(), rng.random() >= plan.gated_p
        if r < 0.45:
            delay = rng.choice(plan.delays)
            await op(w, p, "sched.once", planner, "once", key=key, delay=delay, wait=wait)
        elif r < 0.7:
            every = rng.choice((1, 2, 5))
            await op(w, p, "sched.cron", planner, "cron", key=key, every=every, wait=wait)
        elif r < 0.9:
            await op(w, p, "sched.cancel", planner, "cancel", key=key, wait=wait)
        else:
            await op(w, p, "sched.list", planner, "listed")
        await trio.sleep(rng.uniform(0.0, 0.6))


def workload(plan: SchedulePlan, recorder: Recorder, draw: FaultDraw) -> Any:
    async def main(w: World) -> None:
        recorder.world = w
        recorder.rng = w.rng("schedule-runs")
        recorder.fail_p = plan.fail_p
        rng = w.rng("schedule-clients")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(w.timed_faults, w.rng("timed-faults"), draw.timed, 5.0, draw.power_p)
            for k in range(plan.clients):
                nursery.start_soon(client, w, f"c{k}", plan, random.Random(rng.random()))
        w.heal()
        recorder.healed = True
        await w.wait_up()
        await trio.sleep(SETTLE)
        for k in range(plan.planners):
            await op(w, "final", "sched.list", f"a{k}", "listed")

    return main


# -- the checker -------------------------------------------------------------------------------


def check_schedules(history: History) -> list[Violation]:
    ops = [o for o in history.ops if o.kind.startswith("sched.")]
    runs = [f for f in history.observations if f.kind == "sched.run"]
    found: list[Violation] = []
    for f in runs:
        if f.time < f.detail["due"] - EPS:
            found.append(
                Violation(
                    "never-early",
                    f"{f.detail['actor']} ran {f.detail['key']!r} at {f.time:.6f}, "
                    f"{f.detail['due'] - f.time:.3f} s before its due time",
                    entries=(f.index,),
                )
            )
    finals = [o for o in ops if o.process == "final"]
    if not finals:
        return found[:20]
    horizon = min(o.invoke_time for o in finals) - MARGIN
    done: dict[tuple[str, str], set[float]] = defaultdict(set)
    started: dict[tuple[str, str], list[float]] = defaultdict(list)
    for f in runs:
        where = (f.detail["actor"], f.detail["key"])
        started[where].append(f.time)
        if not f.detail["fails"]:
            done[where].add(f.detail["due"])
    writes: dict[tuple[str, str], list[Op]] = defaultdict(list)
    for o in ops:
        if o.kind in WRITES:
            writes[(o.args["actor"], o.args["key"])].append(o)
    for where, ws in sorted(writes.items()):
        last = max(ws, key=lambda o: o.invoke_index)
        if last.status != "ok" or not all(o is last or o.precedes(last) for o in ws):
            continue  # concurrent or unsure last writes: nothing owed
        if last.kind == "sched.cancel":
            late = [t for t in started[where] if t > last.complete_time]
            if late:
                found.append(
                    Violation(
                        "cancel-sticks",
                        f"{where[0]} ran {where[1]!r} at {late[0]:.3f}, after the cancel of op "
                        f"#{last.id} was acknowledged",
                        (last.id,),
                    )
                )
            continue
        due: float = last.result
        owed = [due]
        if last.kind == "sched.cron":
            every = last.args["every"]
            while owed[-1] + every <= horizon:
                owed.append(owed[-1] + every)
        missing = [d for d in owed if d <= horizon and d not in done[where]]
        if missing:
            found.append(
                Violation(
                    "at-least-once",
                    f"{where[0]} never completed a run of {where[1]!r} due at {missing[0]:.3f} "
                    f"({len(missing)} of {len(owed)} owed), set by op #{last.id}",
                    (last.id,),
                )
            )
    return found[:20]


def make_app(recorder: Recorder, planner: type[Planner] = Planner) -> ak.App:
    app = ak.App()
    app.mount(planner, PLANNER, recorder=recorder)
    return app


def setup(plan: SchedulePlan, planted: type[Planner] | None, draw: FaultDraw) -> Setup:
    recorder = Recorder()
    return Setup(
        app=make_app(recorder, planted or Planner),
        workload=lambda world: workload(plan, recorder, draw),
        check=check_schedules,
        ops=lambda history: len(history.ops) + len(history.observations),
        summary=asdict(plan),
    )


SCHEDULE_BUGS: dict[str, type[Planner]] = {
    "cancel-ignored": CancelIgnored,
    "runs-early": RunsEarly,
    "forgets-on-restart": ForgetsOnRestart,
}

SCHEDULES = Scenario("schedules", "schedules-scenario", SCHEDULE_BUGS, draw_plan, setup)

__all__ = ["SCHEDULES", "SCHEDULE_BUGS", "Planner", "check_schedules", "make_app"]
