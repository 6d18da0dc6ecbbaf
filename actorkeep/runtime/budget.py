"""The host-wide budget of bytes held for outside requests in flight (docs/reliability.md).

A request body, and what it decodes to, stay in memory from the moment the front reads them
until the reply leaves. Each outside request takes its share from one budget; a request that
does not fit is refused with 503 before anything is read, decoded or queued.
"""

from __future__ import annotations

from collections.abc import Callable

from .burst import BurstLog


class ByteBudget:
    """A counter of bytes in use with a ceiling. Not a lock: ``take`` never waits.

    ``reclaim(n)``, if set, is asked to give back at least ``n`` bytes when a ``take`` does not
    fit: the HTTP server closes the uploads that have waited longest for their client, so that
    stalled bodies cannot hold the budget against requests that arrive whole.
    """

    __slots__ = ("burst", "in_use", "limit", "reclaim", "refused")

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("the in-flight budget must be at least 1 byte")
        self.limit = limit
        self.in_use = 0
        self.refused = 0
        self.reclaim: Callable[[int], None] | None = None
        #: Where refusals are logged, a line per burst (None: not logged).
        self.burst: BurstLog | None = None

    def take(self, n: int) -> bool:
        """Reserve ``n`` bytes; False (and nothing reserved) if they do not fit."""
        if n > 0 and self.in_use + n > self.limit:
            if self.reclaim is not None and n <= self.limit:  # room can be made for it
                self.reclaim(self.in_use + n - self.limit)
            if self.in_use + n > self.limit:
                self.refused += 1
                if self.burst is not None:
                    self.burst.note(limit=self.limit, in_use=self.in_use)
                return False
        self.in_use += n
        return True

    def give(self, n: int) -> None:
        """Return ``n`` bytes taken earlier."""
        self.in_use -= n
