"""Running a test marked ``actorkeep_sim`` seed by seed, and what a failing seed reports
(the pytest plugin, ``sim/pytest_plugin.py``, calls these; docs/testing.md)."""

from __future__ import annotations

import dataclasses
import traceback
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio

from actorkeep.app import App

from .determinism import sub_rng
from .fault_schedule import FaultSchedule
from .faults import FAULT_KINDS, Faults, draw_faults, parse_faults
from .invariants import CheckFailed
from .report import around, tail
from .runner import IDLE_TIMEOUTS
from .shrinking import Shrunk, shrink_runs
from .world import TIME_LIMIT, World

#: What ``pytest.fail()`` raises (a BaseException): a failure of the seed, not of the run.
_FAILED = pytest.fail.Exception
#: The chances that an operation of a test is interrupted by a crash (drawn per seed).
OP_CRASH_P = (0.03, 0.1, 0.2)
_ARGS = ("app", "seeds", "faults", "timed", "span", "shrink", "host_options", "time_limit")


@dataclass(frozen=True)
class SimSpec:
    """What a marker asks for (``_ARGS``): the app; how many seeds; the faults, as kinds drawn
    per seed like ``python -m sim`` or fixed ``Faults``; timed crashes and power losses (None:
    drawn, 0 to 3) over the first ``span`` virtual seconds; at most ``shrink`` runs to shrink
    a failure (0: none); more ``Host`` options; the virtual seconds a run may take before
    it fails as stuck."""

    app: App
    seeds: int = 100
    faults: frozenset[str] | Faults = frozenset(FAULT_KINDS)
    timed: int | None = None
    span: float = 2.0
    shrink: int = 100
    host_options: dict[str, Any] = field(default_factory=dict)
    time_limit: float = TIME_LIMIT


def spec_of(marker: pytest.Mark) -> SimSpec:
    """The marker's arguments checked (``ValueError`` with what is wrong)."""
    if len(marker.args) > 1:
        raise ValueError("it takes the app as its one positional argument")
    given = dict(marker.kwargs)
    if marker.args:
        if "app" in given:
            raise ValueError("the app is given twice")
        given["app"] = marker.args[0]
    unknown = sorted(set(given) - set(_ARGS))
    if unknown:
        raise ValueError(f"unknown arguments {unknown}; it takes {', '.join(_ARGS)}")
    app = given.get("app")
    if not isinstance(app, App):
        raise ValueError(f"app= must be an actorkeep.App, not {type(app).__name__}")
    seeds = given.get("seeds", 100)
    if type(seeds) is not int or seeds < 1:
        raise ValueError(f"seeds= must be an int >= 1, not {seeds!r}")
    faults = given.get("faults", "all")
    if isinstance(faults, Faults):
        kinds: frozenset[str] | Faults = faults
    else:
        if not isinstance(faults, str):
            if not isinstance(faults, list | tuple | set | frozenset):
                raise ValueError(_FAULTS)
            faults = ",".join(str(f) for f in faults) or "none"
        try:
            kinds = parse_faults(faults)
        except ValueError as exc:
            raise ValueError(f"{_FAULTS} ({exc})") from None
    timed = given.get("timed")
    if timed is not None and (type(timed) is not int or timed < 0):
        raise ValueError(f"timed= must be an int >= 0 (or None: drawn), not {timed!r}")
    span = given.get("span", 2.0)
    if isinstance(span, bool) or not isinstance(span, int | float) or not span > 0:
        raise ValueError(f"span= must be a number of virtual seconds > 0, not {span!r}")
    runs = given.get("shrink", 100)
    if type(runs) is not int or runs < 0:
        raise ValueError(f"shrink= must be an int >= 0 (runs at most), not {runs!r}")
    options = given.get("host_options", {})
    if not isinstance(options, dict):
        raise ValueError("host_options= must be a dict of ak.Host keyword arguments")
    limit = given.get("time_limit", TIME_LIMIT)
    if isinstance(limit, bool) or not isinstance(limit, int | float) or not limit > 0:
        raise ValueError(f"time_limit= must be virtual seconds > 0, not {limit!r}")
    return SimSpec(app, seeds, kinds, timed, float(span), runs, dict(options), float(limit))


_FAULTS = (
    f"faults= must be 'all', 'none', fault kinds ({','.join(FAULT_KINDS)}) as a "
    "comma-separated str or a list, or a sim.Faults"
)


@dataclass
class SeedRun:
    """One run of a marked test."""

    seed: int
    world: World
    error: BaseException | None

    @property
    def signature(self) -> Hashable:
        """What makes its failure the same as another's (``signature``)."""
        return signature(self.error)


def unwrap(exc: BaseException) -> BaseException:
    """The one exception inside nested groups of one (trio's nurseries wrap what they raise)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def signature(error: BaseException | None) -> Hashable:
    """What makes two failures the same: the exception's type, where it was raised, and for
    ``CheckFailed`` the invariants broken. None for a run that passed."""
    if error is None:
        return None
    exc = unwrap(error)
    frames = traceback.extract_tb(exc.__traceback__)
    where = (frames[-1].filename, frames[-1].lineno) if frames else None
    broken = (
        tuple(sorted({v.invariant for v in exc.violations})) if isinstance(exc, CheckFailed) else ()
    )
    return (type(exc).__qualname__, where, broken)


def run_one(
    spec: SimSpec,
    test: Callable[..., Awaitable[None]],
    kwargs: dict[str, Any],
    seed: int,
    schedule: FaultSchedule | None = None,
) -> SeedRun:
    """Run ``test`` once in the world of ``seed`` (with exactly ``schedule``'s faults when
    given)."""
    rng = sub_rng(seed, "pytest-plugin")
    if isinstance(spec.faults, Faults):
        faults, timed, power_p = dataclasses.replace(spec.faults), 0, spec.faults.power_loss_p
    else:
        draw = draw_faults(rng, spec.faults)
        faults, timed, power_p = draw.faults, draw.timed, draw.power_p
        if draw.mode != "none":
            # A test's calls take no virtual time: crashes land inside its operations.
            faults.op_crash_p = rng.choice(OP_CRASH_P)
    if spec.timed is not None:
        timed = spec.timed
    options = {"idle_timeout": rng.choice(IDLE_TIMEOUTS), **spec.host_options}
    world = World(spec.app, seed, faults=faults, host_options=options, schedule=schedule)
    world.time_limit = spec.time_limit

    async def main(w: World) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(w.timed_faults, w.rng("timed-faults"), timed, spec.span, power_p)
            await test(**{**kwargs, "world": w})
            nursery.cancel_scope.cancel()

    try:
        world.run(main)
    except (Exception, _FAILED) as exc:  # pytest.fail() in the test: that seed failed
        return SeedRun(seed, world, exc)
    except BaseExceptionGroup as group:  # a KeyboardInterrupt or a skip goes on up
        if group.subgroup(_goes_on_up) is not None:
            raise
        return SeedRun(seed, world, group)
    return SeedRun(seed, world, None)


def _quoted(text: str) -> str:
    """``text`` in single quotes for a POSIX shell (a quote inside it closed and escaped)."""
    return "'" + text.replace("'", "'\\''") + "'"


def _goes_on_up(exc: BaseException) -> bool:
    """Whether ``exc`` (a leaf, not a group) ends the test run rather than the seed."""
    return not isinstance(exc, BaseExceptionGroup | Exception | _FAILED)


def failure_report(
    nodeid: str,
    spec: SimSpec,
    test: Callable[..., Awaitable[None]],
    kwargs: dict[str, Any],
    run: SeedRun,
    passed: int,
    schedule: FaultSchedule | None,
) -> str:
    """What a failing seed shows: the error, the replay commands, the shrunk schedule and the
    history around the failure."""
    assert run.error is not None
    seed = run.seed
    replay = f"pytest {_quoted(nodeid)} --actorkeep-replay {seed}"
    recorded = run.world.decisions.recorded()
    lines = [
        f"seed {seed} failed ({passed} seeds passed before it):",
        *_indent(_error_lines(run.error)),
        "",
        f"replay it: {replay}"
        + (f" --actorkeep-schedule {_quoted(schedule.to_text())}" if schedule else ""),
        f"its faults: {recorded.summary()}",
    ]
    again = run_one(spec, test, kwargs, seed, schedule)
    if again.world.trace_hash() != run.world.trace_hash():
        lines.append(
            "NOT DETERMINISTIC: the same seed ran differently a second time (the app reads "
            "time or randomness outside self.now() and self.rng, or keeps state across runs)"
        )
    shown = run
    if schedule is None and spec.shrink > 0 and len(recorded) > 0:
        shrunk, shown, replays = _shrink(spec, test, kwargs, run, recorded)
        lines.append(f"shrunk: {shrunk.report()}")
        lines.extend(_indent(shrunk.schedule.lines() or ["(no fault at all: it fails anyway)"]))
        lines.append(
            f"replay the shrunk schedule: {replay} --actorkeep-schedule "
            f"{_quoted(shrunk.schedule.to_text())}"
        )
        if not replays:
            lines.append(
                "NOT DETERMINISTIC: that schedule did not run the same way twice (the app "
                "reads time or randomness outside self.now() and self.rng, or keeps state "
                "across runs): the replay command may not fail"
            )
        if shown is not run:
            lines.append(f"(that run: {_error_lines(shown.error)[-1]})")
    lines.append("")
    lines.extend(_history_lines(shown))
    return "\n".join(lines)


def _shrink(
    spec: SimSpec,
    test: Callable[..., Awaitable[None]],
    kwargs: dict[str, Any],
    run: SeedRun,
    recorded: FaultSchedule,
) -> tuple[Shrunk, SeedRun, bool]:
    shrunk, best = shrink_runs(
        recorded,
        run,
        lambda candidate: run_one(spec, test, kwargs, run.seed, candidate),
        lambda attempt: attempt.signature == run.signature,
        spec.shrink,
    )
    # The schedule printed must replay exactly: run it once more (the recorded one too, when
    # nothing smaller failed: replaying a seed's own schedule gives the seed's run).
    again = run_one(spec, test, kwargs, run.seed, shrunk.schedule)
    return shrunk, best, again.world.trace_hash() == best.world.trace_hash()


def _error_lines(error: BaseException | None) -> list[str]:
    exc = unwrap(error) if error is not None else None
    if exc is None:
        return ["(passed)"]
    text = "".join(traceback.format_exception(exc)).rstrip().splitlines()
    return text[-25:]


def _history_lines(run: SeedRun) -> list[str]:
    history = run.world.history
    exc = unwrap(run.error) if run.error is not None else None
    if isinstance(exc, CheckFailed) and exc.violations:
        first = exc.violations[0]
        if first.ops or first.entries:
            return around(history, first.ops, first.entries)
    return tail(history)


def _indent(lines: list[str]) -> list[str]:
    return [f"  {line}" for line in lines]
