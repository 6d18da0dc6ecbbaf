"""The activation table: the actors in memory, in least-recently-used order, and their
eviction after ``idle_timeout`` seconds without events or past ``max_active`` of them."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterator

import trio

from .activation import Activation
from .handoff import STOP, wake
from .stats import HostStats


class Activations:
    """``address -> Activation``, least recently used first. ``start(act)`` runs a new
    activation's worker (the host's nursery)."""

    def __init__(
        self,
        idle_timeout: float,
        max_active: int,
        start: Callable[[Activation], None],
        stats: HostStats | None = None,
    ) -> None:
        self.idle_timeout = idle_timeout
        self.stats = stats if stats is not None else HostStats()
        #: The run's clock (``trio.current_time`` without its two calls of indirection).
        self.now: Callable[[], float] = trio.current_time
        self.max_active = max_active
        self._start = start
        self._table: OrderedDict[str, Activation] = OrderedDict()
        #: ``get(address)``: the activation of ``address``, or None (the table's own method).
        self.get: Callable[[str], Activation | None] = self._table.get
        self._evictor_scope: trio.CancelScope | None = None

    def __len__(self) -> int:
        return len(self._table)

    def __contains__(self, address: object) -> bool:
        return address in self._table

    def __iter__(self) -> Iterator[Activation]:
        return iter(list(self._table.values()))

    def add(self, act: Activation) -> None:
        """Take in a new activation, start its worker, and evict the least recently used
        idle ones past ``max_active``."""
        self._table[act.address] = act
        self._start(act)
        if len(self._table) > self.max_active:
            self.evict_lru(len(self._table) - self.max_active)

    def used(self, act: Activation) -> None:
        """``act`` just had an event: most recently used; idle from now."""
        act.last_used = now = self.now()
        if not act.closed:
            self._table.move_to_end(act.address)
            self._note_idle(now + self.idle_timeout)

    def touch(self, act: Activation) -> None:
        """``act`` gets an event: most recently used."""
        self._table.move_to_end(act.address)

    def forget(self, act: Activation) -> None:
        """Take out an activation whose worker has ended (if it is still the one here)."""
        if self._table.get(act.address) is act:
            del self._table[act.address]

    def evict(self, act: Activation) -> None:
        """Take ``act`` out of memory: its worker ends once it has no event running."""
        self.forget(act)
        act.closed = True
        self.stats.evictions += 1
        if act.parked:
            act.parked = False
            assert act.task is not None
            wake(act.task, STOP)

    def evict_lru(self, count: int) -> None:
        victims: list[Activation] = []
        for act in self._table.values():
            if len(victims) >= count:
                break
            if act.parked and not act.inbox:
                victims.append(act)
        for act in victims:
            self.evict(act)

    def _note_idle(self, deadline: float) -> None:
        scope = self._evictor_scope
        if scope is not None and deadline < scope.deadline:
            scope.deadline = deadline

    async def evictor_loop(self) -> None:
        """Evict activations idle for ``idle_timeout``, waking only when the next one is due."""
        while True:
            now = trio.current_time()
            victims: list[Activation] = []
            deadline = math.inf
            for act in self._table.values():
                if act.current is not None or act.inbox or not act.parked:
                    continue  # busy, or its worker has not started yet
                expires = act.last_used + self.idle_timeout
                if expires > now:
                    deadline = expires
                    break
                victims.append(act)
            for act in victims:
                self.evict(act)
            with trio.CancelScope(deadline=deadline) as scope:
                self._evictor_scope = scope
                await trio.sleep_forever()
            self._evictor_scope = None
