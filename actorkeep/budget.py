"""The host-wide budget of bytes held for outside requests in flight (docs/reliability.md).

A request body, and what it decodes to, stay in memory from the moment the front reads them
until the reply leaves. Each outside request takes its share from one budget; a request that
does not fit is refused with 503 before anything is read, decoded or queued.
"""

from __future__ import annotations


class ByteBudget:
    """A counter of bytes in use with a ceiling. Not a lock: ``take`` never waits."""

    __slots__ = ("in_use", "limit", "refused")

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("the in-flight budget must be at least 1 byte")
        self.limit = limit
        self.in_use = 0
        self.refused = 0

    def take(self, n: int) -> bool:
        """Reserve ``n`` bytes; False (and nothing reserved) if they do not fit."""
        if self.in_use + n > self.limit and n > 0:
            self.refused += 1
            return False
        self.in_use += n
        return True

    def give(self, n: int) -> None:
        """Return ``n`` bytes taken earlier."""
        self.in_use -= n
