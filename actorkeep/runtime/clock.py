"""The host clock: epoch seconds that follow trio's clock (SPEC §2, §9; decisions 0002, 0012).

``now() = anchor + trio.current_time()``. The anchor is fixed once per ``trio.run``, so a
``trio.testing.MockClock`` drives actor time, alarms and timeouts, and virtual time that passes
while no host is open counts too. This module is the one place the runtime reads the wall clock:
to place the anchor, and to compare the two while a host runs (``wall_offset``); the simulator
passes a fixed anchor instead and never reads it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import trio
import trio.testing
from trio.lowlevel import RunVar

_run_anchor: RunVar[float] = RunVar("actorkeep_epoch_anchor")


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
        return not isinstance(trio.lowlevel.current_clock(), trio.testing.MockClock)

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
