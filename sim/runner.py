"""The one seed runner: a seed draws a scenario's plan and its faults, runs it in a ``World``
and checks the history.

A scenario (``sim/kv``, ``sim/alarms``, ``sim/queues``) is a ``Scenario``: how to draw its plan
from the seed, and, given the plan, the planted bug (if any) and the faults, the ``Setup`` of
one run: the app, extra host options, the workload and the checker.
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from actorkeep.runtime.gate import Gate

from .check import Violation, check_errors
from .determinism import sub_rng
from .fault_schedule import FaultSchedule
from .faults import ALL_FAULTS, FaultDraw, draw_faults
from .history import History
from .world import Stuck, World

P = TypeVar("P")


@dataclass
class Setup:
    """One run of a scenario, ready to go.

    ``app``: what the world hosts. ``workload(world)``: the ``main`` to run in ``world`` (made
    once the world exists, before it starts). ``check(history)``:
    the scenario's violations (``check_errors`` is added for every scenario). ``ops(history)``:
    how many operations the run checked. ``summary``: the plan's shape, for the history and
    ``replay``. ``host_options``: more keyword arguments for ``Host``.
    """

    app: Any
    workload: Callable[[World], Callable[[World], Awaitable[Any]]]
    check: Callable[[History], list[Violation]]
    ops: Callable[[History], int]
    summary: dict[str, object]
    host_options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Scenario(Generic[P]):
    """A named scenario: ``salt`` names its random stream; ``bugs`` are its planted bugs
    (name -> what ``setup`` gets instead of the real class); ``draw_plan`` draws the plan."""

    name: str
    salt: str
    bugs: Mapping[str, Any]
    draw_plan: Callable[[random.Random], P]
    setup: Callable[[P, Any, FaultDraw], Setup]


@dataclass
class SeedResult:
    """The outcome of one seed."""

    seed: int
    trace_hash: str
    violations: list[Violation]
    history: History
    ops: int
    counts: dict[str, int]
    crashes: int
    seconds: float
    summary: dict[str, object] = field(default_factory=dict)
    #: The faults the run injected: ``run_seed(..., schedule=...)`` replays them exactly.
    schedule: FaultSchedule = field(default_factory=FaultSchedule)

    @property
    def ok(self) -> bool:
        return not self.violations


#: Each run's host evicts idle actors after one of these (seconds): often, now and then, rarely.
IDLE_TIMEOUTS = (0.05, 1.0, 30.0)


#: Hosts of a cluster run: drawn from the seed in this range.
CLUSTER_HOSTS = (1, 5)
#: The fraction of the store's replies lost after the call took effect, one drawn per run.
STORE_REPLIES_LOST = (0.0, 0.0, 0.01, 0.05)
#: The fraction of packets dropped for good (a connection between hosts reset at a chunk, a
#: call to the store lost before it ran), one drawn per run.
DROPS = (0.0, 0.0, 0.01, 0.05)


def run_seed(
    scenario: Scenario[Any],
    seed: int,
    bug: str | None = None,
    faults: frozenset[str] = ALL_FAULTS,
    cluster: bool = False,
    schedule: FaultSchedule | None = None,
) -> SeedResult:
    """Run ``scenario`` for ``seed`` (against the planted ``bug`` if given, with the fault kinds
    ``faults``) and check it; ``cluster``: on 1 to 5 cluster hosts (drawn from the seed) over
    the simulated store (``ClusterWorld``), with the single-owner checks too. ``schedule``:
    inject exactly these faults (``SeedResult.schedule`` of an earlier run) instead of
    drawing them; on one host only."""
    if schedule is not None and cluster:
        raise ValueError("a fault schedule replays on one host only (not with cluster=True)")
    started = time.perf_counter()
    rng = sub_rng(seed, scenario.salt)
    plan = scenario.draw_plan(rng)
    draw = draw_faults(rng, faults)
    idle_timeout = rng.choice(IDLE_TIMEOUTS)
    cluster_bug: dict[str, Any] = {}
    if bug is not None and bug not in scenario.bugs:
        from actorkeep.cluster.committer import Committer

        from .cluster import CLUSTER_BUGS
        from .cluster.observers import ObservedKeeper, ObservedRouter

        if bug not in CLUSTER_BUGS:
            raise ValueError(f"no planted bug {bug!r}")
        if not cluster:
            raise ValueError(f"the planted bug {bug!r} is a cluster's: run it with cluster=True")
        cls = CLUSTER_BUGS[bug]
        kind = (
            "router_class" if issubclass(cls, ObservedRouter)
            else "keeper_class" if issubclass(cls, ObservedKeeper)
            else "committer_class" if issubclass(cls, Committer)
            else "store_class"
        )  # fmt: skip
        cluster_bug = {kind: cls}
    planted = scenario.bugs[bug] if bug is not None and not cluster_bug else None
    gate: dict[str, Any] = {}
    if isinstance(planted, type) and issubclass(planted, Gate):  # a runtime bug (bugs.py)
        gate, planted = {"gate": planted}, None
    setup = scenario.setup(plan, planted, draw)
    host_options = {"idle_timeout": idle_timeout, **setup.host_options, **gate}
    summary: dict[str, object] = {
        "scenario": scenario.name,
        **setup.summary,
        **draw.summary(),
        "idle_timeout": idle_timeout,
        "bug": bug,
    }
    world: World
    if cluster:
        from .cluster import ClusterWorld

        hosts = sub_rng(seed, "cluster").randint(*CLUSTER_HOSTS)
        lost = sub_rng(seed, "cluster-store").choice(STORE_REPLIES_LOST)
        lost = lost if "store" in faults else 0.0
        drops = sub_rng(seed, "cluster-drop").choice(DROPS) if "drop" in faults else 0.0
        world = ClusterWorld(
            setup.app, seed, hosts=hosts, faults=draw.faults, host_options=host_options,
            lost_replies=lost, drops=drops, **cluster_bug,
        )  # fmt: skip
        summary["hosts"] = hosts
        summary["store_replies_lost"] = lost
        summary["drops"] = drops
    else:
        world = World(
            setup.app, seed, faults=draw.faults, host_options=host_options, schedule=schedule
        )
    world.history.note(f"scenario {summary}")
    try:
        world.run(setup.workload(world))
    except Stuck as exc:
        # The history so far is still checked: a stuck run often broke something first.
        world.history.note(f"stuck: {exc}")
        stuck = [Violation("ends", str(exc))]
    else:
        stuck = []
    history = world.history
    violations = stuck + check_errors(history) + setup.check(history)
    if cluster:
        from .cluster import check_single_owner

        violations += check_single_owner(history)
    return seed_result(seed, world, violations, setup.ops(history), started, summary)


def seed_result(
    seed: int,
    world: World,
    violations: list[Violation],
    ops: int,
    started: float,
    summary: dict[str, object],
) -> SeedResult:
    """The outcome of a finished run of ``world``."""
    history = world.history
    if world.current is not None:
        world.quarantined.update(world.current.host.quarantined)
    violations = violations + [
        Violation("no-false-damage", f"{address} was quarantined: {reason}")
        for address, reason in sorted(world.quarantined.items())
    ]
    return SeedResult(
        seed,
        world.trace_hash(),
        violations,
        history,
        ops,
        history.counts(),
        world.crashes,
        time.perf_counter() - started,
        summary,
        world.decisions.recorded(),
    )


def replay_command(
    seed: int,
    bug: str | None = None,
    scenario: str = "kv",
    faults: frozenset[str] = ALL_FAULTS,
    cluster: bool = False,
) -> str:
    cmd = f"python -m sim replay {seed} --scenario {scenario}" + (" --cluster" if cluster else "")
    if faults != ALL_FAULTS:
        cmd += f" --faults {','.join(sorted(faults)) or 'none'}"
    return cmd + (f" --bug {bug}" if bug else "")
