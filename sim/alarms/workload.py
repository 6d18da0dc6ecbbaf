"""The alarm workload: clients set, replace and delete timer actors' alarms under faults, and
in some runs an operator deletes whole timers (``Host.remove``, ``actorkeep rm``).

Each timer's ``alarm`` reports every firing to the world (``History.observe``) and records it
with a plain write in its own table; during the fault phase it sometimes fails (the host
retries it) or sets the alarm again from inside. After the heal every timer is left alone or
given one last alarm, the world waits long enough for every retry, and the final state of
every timer is read for the checker (sim/alarms/checker.py).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio

import actorkeep as ak
from actorkeep.runtime.alarm_store import FIRST_RETRY_DELAY, MAX_RETRIES

from ..history import Status
from ..world import World

TIMER_CLASS = "timer"
#: Long enough after the heal and the longest delay for every alarm, late alarm and retry to
#: have fired.
SETTLE = 2 * FIRST_RETRY_DELAY * 2**MAX_RETRIES + 60.0


class Recorder:
    """The world's ear inside the app: timers report firings through it."""

    def __init__(self) -> None:
        self.world: World | None = None
        self.rng = random.Random(0)
        self.healed = False
        self.fail_p = 0.0
        self.rearm_p = 0.0
        self.rearm_delays = [0.0]

    def observe(self, kind: str, now: float, **detail: Any) -> None:
        assert self.world is not None
        self.world.history.observe(kind, now, **detail)


class TimerActor(ak.Actor):
    """One alarm, driven by ``set`` / ``delete`` / ``state``; its firings are recorded."""

    async def setup(self) -> None:
        self.sql.exec(
            "CREATE TABLE IF NOT EXISTS fired (n INTEGER PRIMARY KEY, scheduled_at REAL NOT NULL, "
            "retry_count INTEGER NOT NULL)"
        )

    @property
    def recorder(self) -> Recorder:
        rec: Recorder = self.options["recorder"]
        return rec

    @ak.rpc
    async def set(self, delay: float, wait: bool = True) -> float:
        """``wait=False``: a gated write, acknowledged (the reply leaves) once durable."""
        at = self.now() + delay
        await self.set_alarm(at, wait=wait)
        return at

    @ak.rpc
    async def delete(self, wait: bool = True) -> None:
        await self.delete_alarm(wait=wait)

    @ak.rpc
    async def state(self) -> list[Any]:
        """[the alarm's time or None, the scheduled times recorded by successful firings]."""
        rows = self.sql.exec("SELECT scheduled_at FROM fired ORDER BY n").fetchall()
        return [self.get_alarm(), [r[0] for r in rows]]

    async def alarm(self, info: ak.AlarmInfo) -> None:
        rec = self.recorder
        now = self.now()
        fail = not rec.healed and rec.rng.random() < rec.fail_p
        rearm = not rec.healed and not fail and rec.rng.random() < rec.rearm_p
        rec.observe(
            "fire",
            now,
            actor=self.address,
            scheduled_at=info.scheduled_at,
            retry_count=info.retry_count,
            fails=fail,
        )
        self.sql.exec(
            "INSERT INTO fired (scheduled_at, retry_count) VALUES (?, ?)",
            (info.scheduled_at, info.retry_count),
        )
        if fail:
            raise RuntimeError("sim: the alarm handler failed on purpose")
        if rearm:
            at = now + rec.rng.choice(rec.rearm_delays)
            # Before: a crash may end the event after the new alarm is durable.
            rec.observe("rearm", now, actor=self.address, at=at)
            await self.set_alarm(at)
            rec.observe("rearmed", self.now(), actor=self.address, at=at)


def make_app(recorder: Recorder, timer_cls: type[ak.Actor] = TimerActor) -> ak.App:
    app = ak.App()
    app.mount(timer_cls, TIMER_CLASS, recorder=recorder)
    return app


@dataclass
class AlarmPlan:
    """A run's shape, drawn from the seed."""

    timers: int
    processes: int
    ops_per_process: int
    delays: list[float]
    think: list[float]
    fail_p: float
    rearm_p: float
    gated_p: float  # sets and deletes that do not wait for their fsync (wait=False)


def draw_plan(rng: random.Random) -> AlarmPlan:
    return AlarmPlan(
        timers=rng.randint(2, 6),
        processes=rng.randint(1, 4),
        ops_per_process=rng.randint(8, 25),
        delays=rng.choice(
            [[0.0, 0.01, 0.1], [0.0, 0.05, 0.5, 2.0], [0.001, 1.0, 5.0], [0.0, 0.05, 30.0, 600.0]]
        ),
        think=rng.choice([[0.0, 0.01], [0.0, 0.05, 0.3], [0.2, 1.0]]),
        fail_p=rng.choice([0.0, 0.1, 0.3]),
        rearm_p=rng.choice([0.0, 0.2, 0.5]),
        gated_p=rng.choice([0.0, 0.5, 1.0]),
    )


def classify(reply: Any) -> tuple[Status, Any]:
    """A refusal (a dict) changed nothing; anything else is the call's answer."""
    return ("fail" if isinstance(reply, dict) else "ok"), reply


async def timer_op(world: World, process: str, timer: str, name: str, **args: Any) -> Any:
    address = f"{TIMER_CLASS}/{timer}"

    async def call() -> Any:
        try:
            return await world.rpc(address, name, timeout=None, **args)
        except ak.Overloaded as exc:
            if "is being deleted" not in exc.message:
                raise  # any other 503 here is a bug
            return {"refused": 503, "message": exc.message}  # by the operator: nothing ran

    return await world.invoke(
        process, f"alarm.{name}", {"timer": address, **args}, call, classify=classify
    )


async def alarm_client(world: World, process: str, plan: AlarmPlan, rng: random.Random) -> None:
    for _ in range(plan.ops_per_process):
        await trio.sleep(rng.choice(plan.think))
        timer = f"t{rng.randrange(plan.timers)}"
        kind = rng.choices(["set", "delete", "state"], [70, 12, 18])[0]
        if kind == "set":
            delay = rng.choice(plan.delays)
            wait = rng.random() >= plan.gated_p
            await timer_op(world, process, timer, "set", delay=delay, wait=wait)
        elif kind == "delete":
            await timer_op(world, process, timer, kind, wait=rng.random() >= plan.gated_p)
        else:
            await timer_op(world, process, timer, kind)


async def remove_timer(world: World, address: str) -> Any:
    """``actorkeep rm`` of a timer: the bytes freed, or the refusal (busy, no such actor, or,
    on a cluster, held by another host)."""
    inc = await world.wait_up()
    try:
        return await inc.host.remove(address)
    except ak.RemoteError as exc:
        if exc.status in (404, 409):
            return {"refused": exc.status, "message": exc.message}
        raise


async def alarm_operator(world: World, plan: AlarmPlan, rng: random.Random, count: int) -> None:
    """An operator who deletes timers now and then, while the clients use them."""
    for _ in range(count):
        await trio.sleep(rng.choice(plan.think) + rng.random() * 0.2)
        address = f"{TIMER_CLASS}/t{rng.randrange(plan.timers)}"
        await world.invoke(
            "operator",
            "alarm.remove",
            {"timer": address},
            functools.partial(remove_timer, world, address),
            classify=classify,
        )


def run_alarm_workload(
    world: World,
    plan: AlarmPlan,
    recorder: Recorder,
    fault_count: int,
    power_p: float,
) -> Callable[[World], Any]:
    """The ``main`` of an alarm scenario for ``World.run``."""
    recorder.world = world
    recorder.rng = world.rng("timer-handlers")
    recorder.fail_p, recorder.rearm_p = plan.fail_p, plan.rearm_p
    recorder.rearm_delays = plan.delays

    async def main(w: World) -> None:
        operator = w.rng("operator")
        removals = operator.choice([0, 0, 3, 8])  # in half of the runs, nobody deletes timers
        async with trio.open_nursery() as nursery:
            for i in range(plan.processes):
                nursery.start_soon(alarm_client, w, f"c{i}", plan, w.rng(f"client/c{i}"))
            if removals:
                w.history.note(f"an operator deletes timers: {removals} times")
                nursery.start_soon(alarm_operator, w, plan, operator, removals)
            if fault_count:
                span = plan.ops_per_process * (sum(plan.think) / len(plan.think) + 0.01) + 0.05
                nursery.start_soon(
                    w.timed_faults, w.rng("timed-faults"), fault_count, span, power_p
                )
        w.heal()
        recorder.healed = True
        await w.wait_up()
        rng = w.rng("final")
        for i in range(plan.timers):
            if rng.random() < 0.5:
                await timer_op(w, "final", f"t{i}", "set", delay=rng.choice(plan.delays))
        await trio.sleep(max(plan.delays) + SETTLE)
        w.history.note("settled: final states")
        for i in range(plan.timers):
            await timer_op(w, "final", f"t{i}", "state")

    return main
