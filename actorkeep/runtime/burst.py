"""One log line per burst of like refusals: the first at once, then at most one every
``every`` seconds, with how many came since the last line (docs/operations.md, "Logs")."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import structlog

log = structlog.get_logger("actorkeep")


class BurstLog:
    """``note(**fields)`` for each refusal; ``now`` is the run's clock."""

    __slots__ = ("_count", "_every", "_logged", "_message", "_now")

    def __init__(self, message: str, now: Callable[[], float], every: float = 10.0) -> None:
        self._message = message
        self._now = now
        self._every = every
        self._count = 0  # refusals since the last line
        self._logged = -math.inf

    def note(self, **fields: Any) -> None:
        self._count += 1
        now = self._now()
        if now - self._logged >= self._every:
            log.warning(self._message, **fields, refused=self._count)
            self._logged, self._count = now, 0
