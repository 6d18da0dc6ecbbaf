"""Shrinking a failing run's fault schedule: a smaller schedule that still fails the same way.

``shrink(schedule, fails)`` calls ``fails(candidate)`` (a deterministic run of the same seed
with exactly the candidate's faults) on simpler and simpler candidates, keeping each one that
still fails. Each step is repeated while it helps, and the four run in passes until a pass
changes nothing or the budget runs out:

1. drop every fault of one kind (all the slow fsyncs, all the call faults, ...);
2. drop faults in chunks, halves first, then smaller ones (delta debugging);
3. make faults milder: a power loss becomes a process crash or rolls back one file fewer, a
   downtime or delay becomes 0 or half of it (down to a millisecond);
4. move timed faults later, to a round time (the next whole second, tenth or hundredth);
5. when none of these helps any more: drop one other fault while aiming a crash inside an
   operation at each scheduler step in turn (the steps that lead to it change without the
   fault), nearest first.

Everything is in a fixed order and each candidate is run at most once, so shrinking is as
deterministic as the runs. ``max_runs`` bounds the runs; the result says what was tried.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import TypeVar

from .fault_schedule import AIMED, KINDS, OP_CRASH_STEPS, FaultEvent, FaultSchedule

R = TypeVar("R")

#: The order in which whole kinds are dropped: the noisiest first.
_KIND_ORDER = (
    "slow-fsync",
    "call-delay",
    "alarm-late",
    "buggify",
    "buggify-on",
    "reply-lost",
    "call-refused",
    "rollback",
    "crash-after-sync",
    "power-after-sync",
    "op-crash",
    "op-power",
    "crash",
    "power",
)
assert sorted(_KIND_ORDER) == sorted(KINDS)
#: Values (seconds) not halved further: below it a delay is noise.
_SMALLEST = 0.001
_MILDER = {"power": "crash", "power-after-sync": "crash-after-sync", "op-power": "op-crash"}


@dataclass
class Shrunk:
    """The outcome: ``schedule`` still fails; ``runs`` runs were made, ``tried`` says of what."""

    original: FaultSchedule
    schedule: FaultSchedule
    runs: int = 0
    exhausted: bool = False  # the budget ran out before no step helped any more
    tried: dict[str, list[int]] = field(default_factory=dict)  # step -> [tried, kept]

    def report(self) -> str:
        """``"41 faults -> 1 in 37 runs (drop a kind: 12 tried, 3 kept; ...)"``."""
        steps = "; ".join(f"{k}: {t} tried, {kept} kept" for k, (t, kept) in self.tried.items())
        budget = ", the budget of runs ran out" if self.exhausted else ""
        return (
            f"{len(self.original)} faults -> {len(self.schedule)} in {self.runs} runs"
            f"{budget} ({steps or 'nothing to try'})"
        )


class _Budget(Exception):
    pass


def shrink(
    schedule: FaultSchedule,
    fails: Callable[[FaultSchedule], bool],
    max_runs: int = 100,
) -> Shrunk:
    """The smallest schedule found that ``fails``, from ``schedule`` (which must fail)."""
    out = Shrunk(schedule, schedule)
    seen: dict[str, bool] = {schedule.to_text(): True}

    def attempt(step: str, candidate: FaultSchedule) -> bool:
        text = candidate.to_text()
        if text in seen:
            return False  # tried, or the current one
        if out.runs >= max_runs:
            out.exhausted = True
            raise _Budget
        out.runs += 1
        counts = out.tried.setdefault(step, [0, 0])
        counts[0] += 1
        seen[text] = failed = fails(candidate)
        if failed:
            counts[1] += 1
            out.schedule = candidate
        return failed

    try:
        if len(schedule) and attempt("no fault at all", FaultSchedule()):
            return out
        progress = True
        while progress:  # passes over the steps, until one pass changes nothing
            progress = False
            for name, candidates in (
                ("drop a kind", _drop_kinds),
                ("drop a chunk", _drop_chunks),
                ("milder", _milder),
                ("later", _later),
            ):
                kept = True
                while kept:  # a step again from the smaller schedule, while it helps
                    kept = any(attempt(name, c) for c in candidates(out.schedule))
                    progress = progress or kept
            if not progress:  # the last resort: it costs up to 41 runs per fault
                progress = any(attempt("drop and re-aim", c) for c in _reaimed(out.schedule))
    except _Budget:
        pass
    return out


def shrink_runs(
    schedule: FaultSchedule,
    first: R,
    run: Callable[[FaultSchedule], R],
    same: Callable[[R], bool],
    max_runs: int = 100,
) -> tuple[Shrunk, R]:
    """``shrink`` where a candidate fails if ``same(run(candidate))``; also the run of the
    schedule it ends with (``first``, the failing run of ``schedule``, if nothing smaller
    failed). Only that one run is kept."""
    best = first

    def fails(candidate: FaultSchedule) -> bool:
        nonlocal best
        attempt = run(candidate)
        if same(attempt):
            best = attempt
            return True
        return False

    return shrink(schedule, fails, max_runs), best


def _reaimed(schedule: FaultSchedule) -> Iterator[FaultSchedule]:
    """Without one other fault, each crash inside an operation aimed at every step, nearest
    first: a crash counted in scheduler steps lands elsewhere once a fault before it is gone."""
    aimed = [e for e in schedule.events if e.kind in AIMED]
    others = sorted(
        (e for e in schedule.events if e.kind not in AIMED), key=lambda e: _KIND_ORDER.index(e.kind)
    )
    for other in others:
        for event in aimed:
            fewer = schedule.without([other])
            for steps in sorted(range(OP_CRASH_STEPS + 1), key=lambda s: (abs(s - event.steps), s)):
                yield fewer.replacing(event, replace(event, steps=steps))


def _drop_kinds(schedule: FaultSchedule) -> Iterator[FaultSchedule]:
    present = schedule.counts()
    if len(present) < 2:
        return
    for kind in _KIND_ORDER:
        if kind in present:
            yield FaultSchedule(tuple(e for e in schedule.events if e.kind != kind))


def _drop_chunks(schedule: FaultSchedule) -> Iterator[FaultSchedule]:
    events = schedule.events
    n = 2
    while n <= len(events):
        size = math.ceil(len(events) / n)
        for start in range(0, len(events), size):
            yield FaultSchedule(events[:start] + events[start + size :])
        n *= 2
    for i in range(len(events)):  # one at a time, when the halving did not get there
        yield FaultSchedule(events[:i] + events[i + 1 :])


def _milder(schedule: FaultSchedule) -> Iterator[FaultSchedule]:
    for event in schedule.events:
        if event.kind in _MILDER:
            milder = replace(event, kind=_MILDER[event.kind], files=())
            if not _clashes(schedule, milder, milder.at):
                yield schedule.replacing(event, milder)
    for event in schedule.events:
        if len(event.files) > 1:  # a power loss that rolls back fewer files
            for file in event.files:
                fewer = tuple(f for f in event.files if f != file)
                yield schedule.replacing(event, replace(event, files=fewer))
    for event in schedule.events:
        if event.value > 0:
            yield schedule.replacing(event, replace(event, value=0.0))
            if event.value >= _SMALLEST:
                yield schedule.replacing(event, replace(event, value=_round(event.value / 2)))


def _later(schedule: FaultSchedule) -> Iterator[FaultSchedule]:
    for event in schedule.timed():
        for step in (1.0, 0.1, 0.01):
            at = _round(math.ceil(event.at / step) * step)
            if at > event.at and not _clashes(schedule, event, at):
                yield schedule.replacing(event, replace(event, at=at))


def _clashes(schedule: FaultSchedule, event: FaultEvent, at: float) -> bool:
    return any(e.key == (event.kind, event.site, at) for e in schedule.events)


def _round(x: float) -> float:
    return float(f"{x:.6g}")
