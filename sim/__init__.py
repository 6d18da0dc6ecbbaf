"""Deterministic simulation of actorkeep hosts (docs/simulation.md).

``World(app, seed)`` runs an app's hosts under a seeded trio scheduler, a virtual clock and a
simulated storage that can crash (lose open transactions) or lose power (lose what was not
synced), with delayed and failed calls, late alarms and BUGGIFY; ``python -m sim`` sweeps the
seeded KV, alarm and queue scenarios and checks their histories.

Names are imported on first use (``sim.World`` loads the runtime; ``import sim`` alone does
not), so that the pytest plugin the package installs costs nothing to test runs that do not
simulate.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .alarms import check_alarms
    from .check import Violation, check_errors
    from .fault_schedule import FaultEvent, FaultSchedule
    from .faults import Faults
    from .history import Fault, History, Op
    from .invariants import (
        CheckFailed,
        acknowledged_writes_survive,
        exactly_once,
        expect_no_violations,
    )
    from .kv import check_kv, check_kv_exhaustive
    from .models import ANY, Model, TooBig, cas_map, check_linearizable, counter, register
    from .queues import check_queue
    from .runner import Scenario, SeedResult, Setup
    from .scenarios import SCENARIOS, run_seed
    from .shrinking import Shrunk, shrink
    from .storage import Fenced, SimDatabase, SimStorage, SimStorageView
    from .world import Incarnation, World

_WHERE = {
    "ANY": "models",
    "CheckFailed": "invariants",
    "Fault": "history",
    "FaultEvent": "fault_schedule",
    "FaultSchedule": "fault_schedule",
    "Faults": "faults",
    "Fenced": "storage",
    "History": "history",
    "Incarnation": "world",
    "Model": "models",
    "Op": "history",
    "SCENARIOS": "scenarios",
    "Scenario": "runner",
    "SeedResult": "runner",
    "Setup": "runner",
    "Shrunk": "shrinking",
    "SimDatabase": "storage",
    "SimStorage": "storage",
    "SimStorageView": "storage",
    "TooBig": "models",
    "Violation": "check",
    "World": "world",
    "acknowledged_writes_survive": "invariants",
    "cas_map": "models",
    "check_alarms": "alarms",
    "check_errors": "check",
    "check_kv": "kv",
    "check_kv_exhaustive": "kv",
    "check_linearizable": "models",
    "check_queue": "queues",
    "counter": "models",
    "exactly_once": "invariants",
    "expect_no_violations": "invariants",
    "register": "models",
    "run_seed": "scenarios",
    "shrink": "shrinking",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'sim' has no attribute {name!r}")
    # Not cached here: the module in sys.modules stays the one answer (pytester's runs
    # forget the modules they imported, and a cached name would outlive its module).
    return getattr(importlib.import_module(f".{module}", __name__), name)


__all__ = [
    "ANY",
    "SCENARIOS",
    "CheckFailed",
    "Fault",
    "FaultEvent",
    "FaultSchedule",
    "Faults",
    "Fenced",
    "History",
    "Incarnation",
    "Model",
    "Op",
    "Scenario",
    "SeedResult",
    "Setup",
    "Shrunk",
    "SimDatabase",
    "SimStorage",
    "SimStorageView",
    "TooBig",
    "Violation",
    "World",
    "acknowledged_writes_survive",
    "cas_map",
    "check_alarms",
    "check_errors",
    "check_kv",
    "check_kv_exhaustive",
    "check_linearizable",
    "check_queue",
    "counter",
    "exactly_once",
    "expect_no_violations",
    "register",
    "run_seed",
    "shrink",
]
