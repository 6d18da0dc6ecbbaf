"""The registry of scenarios: name -> (runner, planted bugs)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from .bugs import ALARM_BUGS, BUGS
from .queue_bugs import QUEUE_BUGS
from .queue_scenario import run_queue_seed
from .scenario import ALL_FAULTS, SeedResult, run_alarm_seed, run_kv_seed

RunSeed = Callable[[int, "str | None", frozenset[str]], SeedResult]

#: Scenario name -> (runner, its planted bugs).
SCENARIOS: dict[str, tuple[RunSeed, Mapping[str, object]]] = {
    "kv": (run_kv_seed, BUGS),
    "alarms": (run_alarm_seed, ALARM_BUGS),
    "queues": (run_queue_seed, QUEUE_BUGS),
}


def scenario_of_bug(bug: str) -> str:
    """The scenario whose planted bugs include ``bug``."""
    for name, (_, bugs) in SCENARIOS.items():
        if bug in bugs:
            return name
    raise ValueError(f"no scenario has a planted bug {bug!r}")


def run_seed(
    scenario: str, seed: int, bug: str | None = None, faults: frozenset[str] = ALL_FAULTS
) -> SeedResult:
    """Run one seed of the named scenario."""
    runner, _ = SCENARIOS[scenario]
    return runner(seed, bug, faults)
