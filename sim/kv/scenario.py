"""The KV scenario: concurrent ``ak.kv`` clients against the shards, checked for
linearizability (``checker``) and by exhaustive search on small keys (``exhaustive``)."""

from __future__ import annotations

from typing import Any

import shards

from ..faults import FaultDraw
from ..history import History
from ..runner import Scenario, Setup
from .bugs import BUGS
from .checker import check_kv
from .exhaustive import check_kv_exhaustive
from .workload import KVPlan, draw_plan, make_app, run_kv_workload

#: Keys with at most this many operations get the exhaustive search too: with its memo, the
#: cost grows with overlap, not length (about 1 ms a seed for the whole KV scenario).
EXHAUSTIVE_MAX_OPS = 1000


def setup(plan: KVPlan, shard_cls: Any, draw: FaultDraw) -> Setup:
    def check(history: History) -> list[Any]:
        return check_kv(history, plan.shards) + check_kv_exhaustive(
            history, plan.shards, max_ops=EXHAUSTIVE_MAX_OPS
        )

    return Setup(
        app=make_app(plan.shards, shard_cls or shards.KVShard),
        workload=lambda world: run_kv_workload(world, plan, world.rng, draw.timed, draw.power_p),
        check=check,
        ops=lambda history: len(history.ops),
        summary={
            "shards": plan.shards,
            "processes": plan.processes,
            "ops_per_process": plan.ops_per_process,
            "keys": plan.keys,
        },
    )


KV = Scenario("kv", "scenario", BUGS, draw_plan, setup)
