"""Deterministic simulation of actorkeep hosts (SPEC §10).

``World(app, seed)`` runs an app's hosts under a seeded trio scheduler, a virtual clock and a
simulated storage that can crash (lose open transactions) or lose power (lose what was not
synced); ``python -m sim`` sweeps seeded KV scenarios and checks their histories.
"""

from .check import Violation, check_errors
from .history import Fault, History, Op
from .kv_checker import check_kv
from .scenario import SeedResult, run_kv_seed
from .storage import Fenced, SimDatabase, SimStorage, SimStorageView
from .world import Faults, Incarnation, World

__all__ = [
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
    "check_errors",
    "check_kv",
    "run_kv_seed",
]
