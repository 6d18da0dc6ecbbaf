"""The host clock: epoch seconds that follow trio's clock (docs/reference.md §2, §4, §9;
decisions 0002 and 0012).

``now() = anchor + trio.current_time()``. The anchor is fixed once per ``trio.run``, so a
``trio.testing.MockClock`` drives actor time, alarms and timeouts, and virtual time that passes
while no host is open counts too. This module is the one place the runtime reads the wall clock:
to place the anchor, and to compare the two while a host runs (``wall_offset``); the simulator
passes a fixed anchor instead and never reads it.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable

import structlog
import trio
from trio.lowlevel import RunVar

log = structlog.get_logger("actorkeep")

_run_anchor: RunVar[float] = RunVar("actorkeep_epoch_anchor")


def on_mock_clock() -> bool:
    """Whether the current trio run is on a ``trio.testing.MockClock``. (Looked up, not
    imported: ``trio.testing`` imports pytest where it is installed, about 70 ms at every start
    of ``actorkeep serve``; a run cannot be on a MockClock unless it was imported.)"""
    testing = sys.modules.get("trio.testing")
    return testing is not None and isinstance(trio.lowlevel.current_clock(), testing.MockClock)


class Clock:
    """Epoch time derived from trio's clock, with an anchor fixed once per ``trio.run``.

    ``wall`` is the wall clock to place the anchor by (``time.time`` by default). Host time
    only ever moves forward from it: ``step`` moves it forward, never back (decision 0012).
    """

    def __init__(
        self, anchor: float | None = None, wall: Callable[[], float] | None = None
    ) -> None:
        self._anchor = anchor
        self._wall = wall if wall is not None else time.time
        self._explicit_wall = wall is not None

    @property
    def anchor(self) -> float:
        """Epoch seconds at trio time zero."""
        if self._anchor is not None:
            return self._anchor
        try:
            return _run_anchor.get()
        except LookupError:
            anchor = self._wall() - trio.current_time()
            _run_anchor.set(anchor)
            return anchor

    def now(self) -> float:
        """The current time in epoch seconds."""
        return self.anchor + trio.current_time()

    def trio_time(self, epoch: float) -> float:
        """The earliest trio time at which ``now()`` is at least ``epoch`` (never early)."""
        anchor = self.anchor
        t = epoch - anchor
        while anchor + t < epoch:  # float rounding: step up to the first time that is not early
            t = math.nextafter(t, math.inf)
        return t

    @property
    def follows_wall(self) -> bool:
        """Whether this clock should track the wall clock: not with a fixed anchor (the
        simulator), nor on a ``MockClock`` with the real wall clock (tests' virtual time is
        meant to run ahead of it)."""
        if self._anchor is not None:
            return False
        if self._explicit_wall:
            return True
        return not on_mock_clock()

    def wall_offset(self) -> float:
        """The wall clock minus host time, in seconds (positive: the wall clock is ahead)."""
        return self._wall() - self.now()

    def step(self, seconds: float) -> None:
        """Move host time forward by ``seconds`` (> 0), for every clock of this run."""
        if not seconds > 0:
            raise ValueError("host time only moves forward")
        anchor = self.anchor + seconds
        if self._anchor is not None:
            self._anchor = anchor
        else:
            _run_anchor.set(anchor)


#: Host time is compared with the wall clock this often (seconds), and acts on a difference
#: past CLOCK_BOUND (decision 0012); the latest host time is recorded every HIGH_WATER_EVERY.
CLOCK_CHECK_EVERY = 5.0
CLOCK_BOUND = 1.0
HIGH_WATER_EVERY = 60.0
#: Warnings about a wall clock behind host time repeat this often while it lasts.
CLOCK_WARN_EVERY = 600.0


class WallClockGuard:
    """Keeps host time following the wall clock forward, never back (decision 0012).

    ``load()`` and ``save(t)`` read and record the latest host time (the host database);
    ``stepped()`` runs after host time stepped forward (the host wakes its alarm scheduler).
    """

    def __init__(
        self,
        clock: Clock,
        load: Callable[[], object],
        save: Callable[[float], None],
        stepped: Callable[[], None],
    ) -> None:
        self.clock = clock
        self._load = load
        self._save = save
        self._stepped = stepped

    def not_before_last_run(self) -> None:
        """Host time never goes back across a restart: start at the latest time recorded."""
        high_water = self._load()
        if not isinstance(high_water, int | float):
            return
        behind = high_water - self.clock.now()
        if behind > 0:
            log.warning(
                "the wall clock is behind the last time this host ran: host time starts "
                "from that time instead, so that nothing moves back",
                seconds=round(behind, 3),
            )
            self.clock.step(behind)

    def record(self) -> None:
        """Record the latest host time (a plain write)."""
        try:
            self._save(self.clock.now())
        except Exception as exc:
            log.error("could not record the host time", error=repr(exc))

    async def watch(self) -> None:
        """Compare the clocks every ``CLOCK_CHECK_EVERY`` seconds until cancelled. A forward
        step is followed once two checks in a row see it (the same within ``CLOCK_BOUND``),
        so a wrong wall clock corrected within seconds leaves host time alone."""
        warned = saved = -math.inf
        ahead: float | None = None  # how far ahead the wall clock was at the last check
        while True:
            await trio.sleep(CLOCK_CHECK_EVERY)
            offset = self.clock.wall_offset()
            seen, ahead = ahead, (offset if offset > CLOCK_BOUND else None)
            if ahead is not None and (seen is None or abs(ahead - seen) > CLOCK_BOUND):
                pass  # first sight of this step: confirm it at the next check
            elif ahead is not None:
                ahead = None
                self.clock.step(offset)
                log.warning(
                    "the wall clock jumped ahead of host time: host time steps forward to it "
                    "(alarms due by then fire, TTLs that ended are over)",
                    seconds=round(offset, 3),
                )
                self._stepped()
            elif offset < -CLOCK_BOUND and trio.current_time() - warned >= CLOCK_WARN_EVERY:
                warned = trio.current_time()
                log.warning(
                    "the wall clock is behind host time: host time goes on at its own pace and "
                    "does not step back",
                    seconds=round(-offset, 3),
                )
            if trio.current_time() - saved >= HIGH_WATER_EVERY:
                saved = trio.current_time()
                self.record()
