"""A run's faults as data: the ``FaultSchedule`` a seed drew, replayed exactly or shrunk.

Every fault the world injects is a decision made at a point of the run: at a virtual time (a
timed crash or power loss), or at the n-th time the run reaches a place (the n-th completed
sync, the n-th call between actors, the n-th power loss choosing which files roll back). A
world run from a seed draws each decision from the seed's random streams and records the ones
that injected something (``FaultDecisions.taken``). A world given a schedule draws nothing: a
decision injects a fault exactly where the schedule has one. Replaying the schedule a seed
recorded gives the same run (the same trace hash); a schedule with fewer or milder faults gives
another run, as deterministic, which is what shrinking (``sim/shrinking.py``) explores.

The kinds, with what ``at`` counts and what ``value`` holds:

====================  ==========================================  ==========================
kind                  at                                          value, site, files
====================  ==========================================  ==========================
crash, power          virtual seconds since the run began         downtime before the restart
op-crash, op-power    the n-th operation ``World.invoke`` starts  downtime before the restart;
                                                                  steps: scheduler steps
                                                                  after its start
crash-after-sync,     the n-th completed sync or file deletion    downtime before the restart
power-after-sync
rollback              the n-th power loss the run asked for       files rolled back to their
                      itself (``World.crash``)                    last sync
slow-fsync            the n-th sync                               its virtual seconds
call-delay            the n-th call between actors                the delay
call-refused          the n-th call between actors
reply-lost            the n-th reply of a call between actors
alarm-late            the n-th alarm handed to its actor          the lateness
buggify-on            1 (the site's first reach)                  site
buggify               the n-th reach of the site                  site
====================  ==========================================  ==========================

A power loss of the schedule (power, op-power, power-after-sync) names in ``files`` the files
it rolled back, so dropping it drops its rollback too.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

TIMED = ("crash", "power")
COUNTED = (
    "op-crash",
    "op-power",
    "crash-after-sync",
    "power-after-sync",
    "rollback",
    "slow-fsync",
    "call-delay",
    "call-refused",
    "reply-lost",
    "alarm-late",
    "buggify-on",
    "buggify",
)
KINDS = TIMED + COUNTED
#: Kinds that take a site, files, or steps.
_SITED = ("buggify-on", "buggify")
#: The kinds that lose power: each names the files it rolled back.
POWER_LOSSES = ("power", "op-power", "power-after-sync")
_FILED = ("rollback", *POWER_LOSSES)
#: Kinds aimed at a scheduler step after an operation starts, up to ``OP_CRASH_STEPS``.
AIMED = ("op-crash", "op-power")
OP_CRASH_STEPS = 40


@dataclass(frozen=True)
class FaultEvent:
    """One fault of a schedule (the module's table says what each field means per kind)."""

    kind: str
    at: float
    value: float = 0.0
    site: str = ""
    files: tuple[str, ...] = field(default=())
    steps: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; the kinds are {', '.join(KINDS)}")
        if not isinstance(self.at, int | float) or not math.isfinite(self.at) or self.at < 0:
            raise ValueError(f"a fault's at must be a finite number >= 0, not {self.at!r}")
        if self.kind in COUNTED and (self.at != int(self.at) or self.at < 1):
            raise ValueError(f"{self.kind}'s at counts occurrences from 1, not {self.at!r}")
        if not isinstance(self.value, int | float) or not math.isfinite(self.value):
            raise ValueError(f"a fault's value must be a finite number, not {self.value!r}")
        if self.value < 0:
            raise ValueError(f"a fault's value must be >= 0, not {self.value!r}")
        if (self.kind in _SITED) != bool(self.site):
            raise ValueError(f"{self.kind} {'needs' if self.kind in _SITED else 'takes no'} site")
        if self.files and self.kind not in _FILED:
            raise ValueError(f"{self.kind} takes no files")
        if type(self.steps) is not int or not 0 <= self.steps <= OP_CRASH_STEPS:
            raise ValueError(
                f"a fault's steps must be an int from 0 to {OP_CRASH_STEPS}, not {self.steps!r}"
            )
        if self.steps and self.kind not in AIMED:
            raise ValueError(f"{self.kind} takes no steps")

    @property
    def key(self) -> tuple[str, str, float]:
        """Where it happens: no two faults of a schedule share one."""
        return (self.kind, self.site, self.at)

    def describe(self) -> str:
        """The fault in words."""
        k, n, v = self.kind, int(self.at), self.value
        back = f", restarted {v:g} s later"
        if k in POWER_LOSSES:
            back = f" rolling back {', '.join(self.files) or 'no file'}" + back
        text = {
            "crash": f"process crash at {self.at:g} s{back}",
            "power": f"power loss at {self.at:g} s{back}",
            "op-crash": f"process crash {self.steps} steps into operation {n}{back}",
            "op-power": f"power loss {self.steps} steps into operation {n}{back}",
            "crash-after-sync": f"process crash right after sync {n}{back}",
            "power-after-sync": f"power loss right after sync {n}{back}",
            "rollback": f"the run's own power loss {n} rolls back "
            f"{', '.join(self.files) or 'no file'}",
            "slow-fsync": f"sync {n} takes {v:g} s",
            "call-delay": f"call {n} between actors delayed {v:g} s",
            "call-refused": f"call {n} between actors refused (Overloaded)",
            "reply-lost": f"the reply of call {n} between actors lost (CallTimeout)",
            "alarm-late": f"alarm {n} handed over {v:g} s late",
            "buggify-on": f"BUGGIFY site {self.site} enabled",
            "buggify": f"BUGGIFY site {self.site} fires at its reach {n}",
        }
        return text[k]

    def as_json(self) -> dict[str, Any]:
        """The fault as ``to_text`` writes it (fields at their defaults left out)."""
        out: dict[str, Any] = {"kind": self.kind, "at": self.at}
        if self.value:
            out["value"] = self.value
        if self.site:
            out["site"] = self.site
        if self.files:
            out["files"] = list(self.files)
        if self.steps:
            out["steps"] = self.steps
        return out


@dataclass(frozen=True)
class FaultSchedule:
    """The faults of one run, in order: timed ones by time, counted ones by kind and count."""

    events: tuple[FaultEvent, ...] = ()

    def __post_init__(self) -> None:
        keys = [e.key for e in self.events]
        dup = [k for k, n in Counter(keys).items() if n > 1]
        if dup:
            kind, site, at = dup[0]
            raise ValueError(f"two {kind} faults at {at:g}{f' of {site}' if site else ''}")
        ordered = tuple(sorted(self.events, key=_order))
        object.__setattr__(self, "events", ordered)

    def __len__(self) -> int:
        return len(self.events)

    def timed(self) -> list[FaultEvent]:
        """The faults at a virtual time (crash, power), in time order."""
        return [e for e in self.events if e.kind in TIMED]

    def without(self, drop: Iterable[FaultEvent]) -> FaultSchedule:
        """This schedule less the faults of ``drop``."""
        gone = set(drop)
        return FaultSchedule(tuple(e for e in self.events if e not in gone))

    def replacing(self, old: FaultEvent, new: FaultEvent) -> FaultSchedule:
        """This schedule with ``new`` in place of ``old``."""
        return FaultSchedule(tuple(new if e == old else e for e in self.events))

    def counts(self) -> dict[str, int]:
        """How many faults of each kind."""
        return dict(Counter(e.kind for e in self.events))

    def summary(self) -> str:
        """``"3 faults: 1 power, 2 slow-fsync"``."""
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(self.counts().items()))
        return f"{len(self)} fault{'s' if len(self) != 1 else ''}" + (f": {kinds}" if kinds else "")

    def lines(self) -> list[str]:
        """Each fault in words, in order."""
        return [e.describe() for e in self.events]

    def to_text(self) -> str:
        """One line of JSON that ``from_text`` reads back exactly."""
        return json.dumps([e.as_json() for e in self.events], separators=(",", ":"))

    @staticmethod
    def from_text(text: str) -> FaultSchedule:
        """The schedule ``to_text`` wrote; ``ValueError`` saying what is wrong otherwise."""
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"a fault schedule is a JSON list of faults: {exc}") from None
        if not isinstance(raw, list):
            raise ValueError("a fault schedule is a JSON list of faults")
        events = []
        for i, item in enumerate(raw):
            if not isinstance(item, dict) or not {"kind", "at"} <= set(item):
                raise ValueError(f"fault {i} of the schedule needs a kind and an at")
            extra = set(item) - {"kind", "at", "value", "site", "files", "steps"}
            if extra:
                raise ValueError(f"fault {i} of the schedule has unknown fields {sorted(extra)}")
            files = item.get("files", [])
            if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
                raise ValueError(f"fault {i}'s files must be a list of file names")
            site = item.get("site", "")
            if not isinstance(site, str) or not isinstance(item["kind"], str):
                raise ValueError(f"fault {i}'s kind and site must be text")
            try:
                events.append(
                    FaultEvent(
                        item["kind"],
                        item["at"],
                        item.get("value", 0.0),
                        site,
                        tuple(files),
                        item.get("steps", 0),
                    )
                )
            except ValueError as exc:
                raise ValueError(f"fault {i} of the schedule: {exc}") from None
        return FaultSchedule(tuple(events))


def _order(e: FaultEvent) -> tuple[int, float, str, str]:
    return (0 if e.kind in TIMED else 1 + COUNTED.index(e.kind), e.at, e.site, ",".join(e.files))


class FaultDecisions:
    """Where a world's fault decisions come from: drawn from the seed (``schedule`` None),
    or read from ``schedule``. Either way each fault injected is kept in ``taken``."""

    def __init__(self, schedule: FaultSchedule | None = None) -> None:
        self.schedule = schedule
        self._planned = {e.key: e for e in schedule.events} if schedule is not None else {}
        self._counts: Counter[str] = Counter()
        self.taken: list[FaultEvent] = []

    @property
    def replaying(self) -> bool:
        """Whether the faults come from a schedule (not drawn from the seed)."""
        return self.schedule is not None

    def reach(self, place: str) -> int:
        """Count one more reach of ``place``; its number (from 1)."""
        self._counts[place] += 1
        return self._counts[place]

    def planned(self, kind: str, at: float, site: str = "") -> FaultEvent | None:
        """The schedule's fault of ``kind`` at ``at`` (of ``site``), if any."""
        return self._planned.get((kind, site, at))

    def take(self, event: FaultEvent) -> FaultEvent:
        """Keep ``event`` as injected (``recorded`` gives them back); returns it."""
        self.taken.append(event)
        return event

    def recorded(self) -> FaultSchedule:
        """The faults injected so far, as a schedule that replays them."""
        return FaultSchedule(tuple(self.taken))


def later(event: FaultEvent, at: float) -> FaultEvent:
    """``event`` moved to ``at``."""
    return replace(event, at=at)
