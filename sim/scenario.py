"""Seeded scenarios: a seed draws the workload's shape and its faults, runs it, checks it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import shards

from .bugs import BUGS
from .check import Violation, check_errors
from .determinism import sub_rng
from .history import History
from .kv_checker import check_kv
from .kv_workload import draw_plan, make_app, run_kv_workload
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


def replay_command(seed: int, bug: str | None = None) -> str:
    return f"python -m sim replay {seed}" + (f" --bug {bug}" if bug else "")


def run_kv_seed(seed: int, bug: str | None = None) -> SeedResult:
    """Run the KV scenario of ``seed`` (against a planted ``bug`` shard if given) and check it."""
    started = time.perf_counter()
    rng = sub_rng(seed, "scenario")
    plan = draw_plan(rng)
    mode = rng.choices(["none", "crash", "power", "mixed"], [2, 3, 2, 3])[0]
    power_p = {"none": 0.0, "crash": 0.0, "power": 1.0, "mixed": 0.5}[mode]
    faults = Faults(
        fsync_delay_p=rng.choice([0.0, 0.3, 0.9]),
        fsync_delay_max=rng.choice([0.001, 0.02]),
        crash_after_sync_p=0.0 if mode == "none" else rng.choice([0.0, 0.02, 0.08]),
        power_loss_p=power_p,
        max_crashes=2,
        rollback_p=rng.choice([0.5, 1.0]),
    )
    timed = 0 if mode == "none" else rng.randint(0, 3)
    host_options = {"idle_timeout": rng.choice([0.05, 1.0, 30.0])}
    shard_cls = BUGS[bug] if bug is not None else shards.KVShard
    world = World(make_app(plan.shards, shard_cls), seed, faults=faults, host_options=host_options)
    summary: dict[str, object] = {
        "shards": plan.shards,
        "processes": plan.processes,
        "ops_per_process": plan.ops_per_process,
        "keys": plan.keys,
        "faults": mode,
        "timed_faults": timed,
        "fsync_delay_p": faults.fsync_delay_p,
        "crash_after_sync_p": faults.crash_after_sync_p,
        "idle_timeout": host_options["idle_timeout"],
        "bug": bug,
    }
    world.history.note(f"scenario {summary}")
    world.run(run_kv_workload(world, plan, world.rng, timed, power_p))
    history = world.history
    violations = check_errors(history) + check_kv(history, plan.shards)
    return SeedResult(
        seed,
        world.trace_hash(),
        violations,
        history,
        len(history.ops),
        history.counts(),
        world.crashes,
        time.perf_counter() - started,
        summary,
    )
