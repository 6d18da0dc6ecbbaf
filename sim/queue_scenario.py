"""The seeded queue scenario: a seed draws the workload's shape and its faults, runs, checks."""

from __future__ import annotations

import time

import queues

from .check import check_errors
from .determinism import sub_rng
from .queue_bugs import QUEUE_BUGS
from .queue_checker import check_queue
from .queue_workload import PushRecorder, draw_plan, make_app, run_queue_workload
from .scenario import ALL_FAULTS, SeedResult, draw_faults, seed_result
from .world import World


def run_queue_seed(
    seed: int, bug: str | None = None, faults: frozenset[str] = ALL_FAULTS
) -> SeedResult:
    """Run the queue scenario of ``seed`` (against a planted queue ``bug`` if given, with the
    fault kinds ``faults``) and check it: ``check_errors`` and ``check_queue`` on the history
    and the drained final state."""
    started = time.perf_counter()
    rng = sub_rng(seed, "queue-scenario")
    plan = draw_plan(rng)
    draw = draw_faults(rng, faults)
    host_options = {"idle_timeout": rng.choice([0.05, 1.0, 30.0])}
    recorder = PushRecorder()
    queue_cls = QUEUE_BUGS[bug] if bug is not None else queues.Queue
    world = World(
        make_app(recorder, queue_cls), seed, faults=draw.faults, host_options=host_options
    )
    summary: dict[str, object] = {
        "scenario": "queues",
        "producers": plan.producers,
        "sends": plan.sends,
        "workers": plan.workers,
        "rounds": plan.rounds,
        "push_share": plan.push_share,
        "max_attempts": [plan.pull_max_attempts, plan.push_max_attempts],
        "batch_size": plan.batch_size,
        **draw.summary(),
        "idle_timeout": host_options["idle_timeout"],
        "bug": bug,
    }
    world.history.note(f"scenario {summary}")
    world.run(run_queue_workload(world, plan, recorder, draw.timed, draw.power_p))
    history = world.history
    violations = check_errors(history) + check_queue(history, plan.max_attempts())
    ops = len(history.ops) + len(history.observations)
    return seed_result(seed, world, violations, ops, started, summary)
