"""The queue scenario: producers, pull workers and a push consumer on several queues, checked
for no lost acknowledged send, no lease name handed out twice, dead letters that are due, and a
drained final state (``checker``)."""

from __future__ import annotations

from typing import Any

import queues

from ..faults import FaultDraw
from ..history import History
from ..runner import Scenario, Setup
from .bugs import QUEUE_BUGS
from .checker import check_queue
from .workload import PushRecorder, QueuePlan, draw_plan, make_app, run_queue_workload


def setup(plan: QueuePlan, queue_cls: Any, draw: FaultDraw) -> Setup:
    recorder = PushRecorder()

    def check(history: History) -> list[Any]:
        return check_queue(history, plan.max_attempts())

    return Setup(
        app=make_app(recorder, queue_cls or queues.Queue),
        workload=lambda world: run_queue_workload(world, plan, recorder, draw.timed, draw.power_p),
        check=check,
        # Operations and deliveries (the queues' reports of their leases only time these).
        ops=lambda history: (
            len(history.ops) + sum(o.kind == "queue.deliver" for o in history.observations)
        ),
        summary={
            "producers": plan.producers,
            "sends": plan.sends,
            "workers": plan.workers,
            "rounds": plan.rounds,
            "push_share": plan.push_share,
            "max_attempts": [plan.pull_max_attempts, plan.push_max_attempts],
            "batch_size": plan.batch_size,
        },
    )


QUEUES = Scenario("queues", "queue-scenario", QUEUE_BUGS, draw_plan, setup)
