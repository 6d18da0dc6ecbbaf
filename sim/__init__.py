"""Deterministic simulation of actorkeep hosts (docs/simulation.md).

``World(app, seed)`` runs an app's hosts under a seeded trio scheduler, a virtual clock and a
simulated storage that can crash (lose open transactions) or lose power (lose what was not
synced), with delayed and failed calls, late alarms and BUGGIFY; ``python -m sim`` sweeps the
seeded KV, alarm and queue scenarios and checks their histories.
"""

from .alarms import check_alarms
from .check import Violation, check_errors
from .faults import Faults
from .history import Fault, History, Op
from .kv import check_kv, check_kv_exhaustive
from .queues import check_queue
from .runner import Scenario, SeedResult, Setup
from .scenarios import SCENARIOS, run_seed
from .storage import Fenced, SimDatabase, SimStorage, SimStorageView
from .world import Incarnation, World

__all__ = [
    "SCENARIOS",
    "Fault",
    "Faults",
    "Fenced",
    "History",
    "Incarnation",
    "Op",
    "Scenario",
    "SeedResult",
    "Setup",
    "SimDatabase",
    "SimStorage",
    "SimStorageView",
    "Violation",
    "World",
    "check_alarms",
    "check_errors",
    "check_kv",
    "check_kv_exhaustive",
    "check_queue",
    "run_seed",
]
