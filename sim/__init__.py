"""Deterministic simulation of actorkeep hosts (SPEC §10).

``World(app, seed)`` runs an app's hosts under a seeded trio scheduler, a virtual clock and a
simulated storage that can crash (lose open transactions) or lose power (lose what was not
synced), with delayed and failed calls, late alarms and BUGGIFY; ``python -m sim`` sweeps the
seeded KV, alarm and queue scenarios and checks their histories.
"""

from .alarm_checker import check_alarms
from .check import Violation, check_errors
from .history import Fault, History, Op
from .kv_checker import check_kv
from .kv_exhaustive import check_kv_exhaustive
from .queue_checker import check_queue
from .scenario import SeedResult, run_alarm_seed, run_kv_seed
from .scenarios import SCENARIOS, run_seed
from .storage import Fenced, SimDatabase, SimStorage, SimStorageView
from .world import Faults, Incarnation, World

__all__ = [
    "SCENARIOS",
    "Fault",
    "Faults",
    "Fenced",
    "History",
    "Incarnation",
    "Op",
    "SeedResult",
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
    "run_alarm_seed",
    "run_kv_seed",
    "run_seed",
]
