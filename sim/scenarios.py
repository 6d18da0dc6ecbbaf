"""The registry of scenarios, by name."""

from __future__ import annotations

from typing import Any

from .alarms import ALARMS
from .fault_schedule import FaultSchedule
from .faults import ALL_FAULTS
from .kv import KV
from .migrations import MIGRATIONS
from .queues import QUEUES
from .queues.features import QUEUE_FEATURES
from .queues.recurring import RECURRING
from .runner import Scenario, SeedResult
from .runner import run_seed as run_scenario_seed
from .schedules import SCHEDULES

SCENARIOS: dict[str, Scenario[Any]] = {
    s.name: s for s in (KV, ALARMS, QUEUES, QUEUE_FEATURES, SCHEDULES, RECURRING, MIGRATIONS)
}


def scenario_of_bug(bug: str) -> str:
    """The scenario whose planted bugs include ``bug``."""
    for name, scenario in SCENARIOS.items():
        if bug in scenario.bugs:
            return name
    raise ValueError(f"no scenario has a planted bug {bug!r}")


def run_seed(
    scenario: str,
    seed: int,
    bug: str | None = None,
    faults: frozenset[str] = ALL_FAULTS,
    cluster: bool = False,
    schedule: FaultSchedule | None = None,
) -> SeedResult:
    """Run one seed of the scenario named ``scenario`` (on a simulated cluster: ``cluster``;
    with exactly the faults of ``schedule``, when given)."""
    return run_scenario_seed(SCENARIOS[scenario], seed, bug, faults, cluster, schedule)
