"""The alarm scenario: timers set, cleared and re-armed by concurrent clients, checked for
alarms that fire on time, once per setting, and never get lost (``checker``)."""

from __future__ import annotations

from typing import Any

from actorkeep.runtime.removal import Remover

from ..faults import FaultDraw
from ..history import History
from ..runner import Scenario, Setup
from .bugs import ALARM_BUGS
from .checker import check_alarms
from .workload import AlarmPlan, Recorder, draw_plan, make_app, run_alarm_workload


def setup(plan: AlarmPlan, scheduler_cls: Any, draw: FaultDraw) -> Setup:
    recorder = Recorder()
    late = draw.faults.alarm_late_max if draw.faults.alarm_late_p > 0 else 0.0  # before heal()

    def check(history: History) -> list[Any]:
        return check_alarms(history, late)

    def ops(history: History) -> int:
        return len(history.ops) + sum(1 for o in history.observations if o.kind == "fire")

    return Setup(
        app=make_app(recorder),
        workload=lambda world: run_alarm_workload(world, plan, recorder, draw.timed, draw.power_p),
        check=check,
        ops=ops,
        summary={
            "timers": plan.timers,
            "processes": plan.processes,
            "ops_per_process": plan.ops_per_process,
            "delays": plan.delays,
            "fail_p": plan.fail_p,
            "rearm_p": plan.rearm_p,
            "gated_p": plan.gated_p,
        },
        host_options=(
            {}
            if scheduler_cls is None
            else {"remover": scheduler_cls}
            if issubclass(scheduler_cls, Remover)
            else {"alarm_scheduler": scheduler_cls}
        ),
    )


ALARMS = Scenario("alarms", "alarm-scenario", ALARM_BUGS, draw_plan, setup)
