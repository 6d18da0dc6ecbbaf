"""The host clock: epoch seconds that follow trio's clock (SPEC §2, §9).

``now() = anchor + trio.current_time()``. The anchor is fixed once per ``trio.run``, so a
``trio.testing.MockClock`` drives actor time, alarms and timeouts, and virtual time that passes
while no host is open counts too. This module is the one place the runtime reads the wall clock,
once per run, to place the anchor; the simulator passes a fixed anchor instead.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import trio
from trio.lowlevel import RunVar

_run_anchor: RunVar[float] = RunVar("actorkeep_epoch_anchor")


class Clock:
    """Epoch time derived from trio's clock, with an anchor fixed once per ``trio.run``."""

    def __init__(self, anchor: float | None = None, wall: Callable[[], float] = time.time) -> None:
        self._anchor = anchor
        self._wall = wall

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
