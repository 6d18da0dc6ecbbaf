"""Seeded scenarios: a seed draws the workload's shape and its faults, runs it, checks it."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

import shards

from .alarm_checker import check_alarms
from .alarm_workload import Recorder, run_alarm_workload
from .alarm_workload import draw_plan as draw_alarm_plan
from .alarm_workload import make_app as make_alarm_app
from .bugs import ALARM_BUGS, BUGS
from .check import Violation, check_errors
from .determinism import sub_rng
from .history import History
from .kv_checker import check_kv
from .kv_exhaustive import check_kv_exhaustive
from .kv_workload import draw_plan as draw_kv_plan
from .kv_workload import make_app as make_kv_app
from .kv_workload import run_kv_workload
from .world import Faults, World


@dataclass
class SeedResult:
    """The outcome of one seed."""

    seed: int
    trace_hash: str
    violations: list[Violation]
    history: History
    ops: int
    counts: dict[str, int]
    crashes: int
    seconds: float
    summary: dict[str, object] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations


#: Keys with at most this many operations get the exhaustive search too: with its memo, the
#: cost grows with overlap, not length (about 1 ms a seed for the whole KV scenario).
EXHAUSTIVE_MAX_OPS = 1000

#: The fault kinds a run can have; ``--faults`` picks a subset.
FAULT_KINDS = ("crash", "power", "fsync", "calls", "alarms", "buggify")


def parse_faults(text: str) -> frozenset[str]:
    """``"all"``, ``"none"`` or a comma-separated subset of ``FAULT_KINDS``."""
    if text == "all":
        return frozenset(FAULT_KINDS)
    if text == "none":
        return frozenset()
    kinds = frozenset(k.strip() for k in text.split(",") if k.strip())
    unknown = kinds - set(FAULT_KINDS)
    if unknown:
        raise ValueError(f"unknown fault kinds {sorted(unknown)}; choose from {FAULT_KINDS}")
    return kinds


ALL_FAULTS = frozenset(FAULT_KINDS)


def replay_command(
    seed: int, bug: str | None = None, scenario: str = "kv", faults: frozenset[str] = ALL_FAULTS
) -> str:
    cmd = f"python -m sim replay {seed} --scenario {scenario}"
    if faults != ALL_FAULTS:
        cmd += f" --faults {','.join(sorted(faults)) or 'none'}"
    return cmd + (f" --bug {bug}" if bug else "")


@dataclass
class FaultDraw:
    """A run's faults as drawn from its seed (then narrowed by ``--faults``)."""

    mode: str  # none / crash / power / mixed
    faults: Faults
    timed: int  # crashes or power losses at random moments

    @property
    def power_p(self) -> float:
        return self.faults.power_loss_p

    def summary(self) -> dict[str, object]:
        f = self.faults
        return {
            "faults": self.mode,
            "timed_faults": self.timed,
            "fsync_delay_p": f.fsync_delay_p,
            "crash_after_sync_p": f.crash_after_sync_p,
            "call_faults": (f.call_delay_p, f.call_refuse_p, f.reply_loss_p),
            "alarm_late_p": f.alarm_late_p,
            "buggify": f.buggify,
        }


def draw_faults(rng: random.Random, kinds: frozenset[str] = ALL_FAULTS) -> FaultDraw:
    """Draw a run's faults from ``rng``, then drop the kinds not in ``kinds``.

    Every draw is made whatever ``kinds`` is, so that narrowing the faults keeps the rest of
    the run's shape.
    """
    mode = rng.choices(["none", "crash", "power", "mixed"], [2, 3, 2, 3])[0]
    faults = Faults(
        fsync_delay_p=rng.choice([0.0, 0.3, 0.9]),
        fsync_delay_max=rng.choice([0.001, 0.02]),
        crash_after_sync_p=0.0 if mode == "none" else rng.choice([0.0, 0.02, 0.08]),
        power_loss_p={"none": 0.0, "crash": 0.0, "power": 1.0, "mixed": 0.5}[mode],
        max_crashes=2,
        rollback_p=rng.choice([0.5, 1.0]),
    )
    timed = 0 if mode == "none" else rng.randint(0, 3)
    calls = rng.random() < 0.6
    call_delay = (rng.choice([0.05, 0.2, 0.5]), rng.choice([0.001, 0.05]))
    call_fail = (rng.choice([0.0, 0.02, 0.05]), rng.choice([0.0, 0.02, 0.05]))
    late = rng.random() < 0.5
    late_p, late_max = rng.choice([0.2, 0.5]), rng.choice([0.1, 2.0])
    buggify = rng.random() < 0.5
    if mode != "none":
        if calls and "calls" in kinds:
            faults.call_delay_p, faults.call_delay_max = call_delay
            faults.call_refuse_p, faults.reply_loss_p = call_fail
        if late and "alarms" in kinds:
            faults.alarm_late_p, faults.alarm_late_max = late_p, late_max
        faults.buggify = buggify and "buggify" in kinds
    if "fsync" not in kinds:
        faults.fsync_delay_p = 0.0
    crash, power = "crash" in kinds, "power" in kinds
    if not crash and not power:
        mode, timed, faults.crash_after_sync_p = "none", 0, 0.0
    elif not power:
        faults.power_loss_p = 0.0
    elif not crash:
        faults.power_loss_p = 1.0
    return FaultDraw(mode, faults, timed)


def seed_result(
    seed: int,
    world: World,
    violations: list[Violation],
    ops: int,
    started: float,
    summary: dict[str, object],
) -> SeedResult:
    """The outcome of a finished run of ``world``."""
    history = world.history
    if world.current is not None:
        world.quarantined.update(world.current.host.quarantined)
    violations = violations + [
        Violation("no-false-damage", f"{address} was quarantined: {reason}")
        for address, reason in sorted(world.quarantined.items())
    ]
    return SeedResult(
        seed,
        world.trace_hash(),
        violations,
        history,
        ops,
        history.counts(),
        world.crashes,
        time.perf_counter() - started,
        summary,
    )


def run_kv_seed(
    seed: int, bug: str | None = None, faults: frozenset[str] = ALL_FAULTS
) -> SeedResult:
    """Run the KV scenario of ``seed`` (against a planted ``bug`` shard if given) and check it."""
    started = time.perf_counter()
    rng = sub_rng(seed, "scenario")
    plan = draw_kv_plan(rng)
    draw = draw_faults(rng, faults)
    host_options = {"idle_timeout": rng.choice([0.05, 1.0, 30.0])}
    shard_cls = BUGS[bug] if bug is not None else shards.KVShard
    world = World(
        make_kv_app(plan.shards, shard_cls), seed, faults=draw.faults, host_options=host_options
    )
    summary: dict[str, object] = {
        "scenario": "kv",
        "shards": plan.shards,
        "processes": plan.processes,
        "ops_per_process": plan.ops_per_process,
        "keys": plan.keys,
        **draw.summary(),
        "idle_timeout": host_options["idle_timeout"],
        "bug": bug,
    }
    world.history.note(f"scenario {summary}")
    world.run(run_kv_workload(world, plan, world.rng, draw.timed, draw.power_p))
    history = world.history
    violations = (
        check_errors(history)
        + check_kv(history, plan.shards)
        + check_kv_exhaustive(history, plan.shards, max_ops=EXHAUSTIVE_MAX_OPS)
    )
    return seed_result(seed, world, violations, len(history.ops), started, summary)


def run_alarm_seed(
    seed: int, bug: str | None = None, faults: frozenset[str] = ALL_FAULTS
) -> SeedResult:
    """Run the alarm scenario of ``seed`` (on a planted host ``bug`` if given) and check it."""
    started = time.perf_counter()
    rng = sub_rng(seed, "alarm-scenario")
    plan = draw_alarm_plan(rng)
    draw = draw_faults(rng, faults)
    host_options: dict[str, Any] = {"idle_timeout": rng.choice([0.05, 1.0, 30.0])}
    if bug is not None:
        host_options["alarm_scheduler"] = ALARM_BUGS[bug]
    recorder = Recorder()
    world = World(make_alarm_app(recorder), seed, faults=draw.faults, host_options=host_options)
    summary: dict[str, object] = {
        "scenario": "alarms",
        "timers": plan.timers,
        "processes": plan.processes,
        "ops_per_process": plan.ops_per_process,
        "delays": plan.delays,
        "fail_p": plan.fail_p,
        "rearm_p": plan.rearm_p,
        **draw.summary(),
        "idle_timeout": host_options["idle_timeout"],
        "bug": bug,
    }
    world.history.note(f"scenario {summary}")
    late = draw.faults.alarm_late_max if draw.faults.alarm_late_p > 0 else 0.0  # before heal()
    world.run(run_alarm_workload(world, plan, recorder, draw.timed, draw.power_p))
    history = world.history
    violations = check_errors(history) + check_alarms(history, late)
    ops = len(history.ops) + sum(1 for o in history.observations if o.kind == "fire")
    return seed_result(seed, world, violations, ops, started, summary)
