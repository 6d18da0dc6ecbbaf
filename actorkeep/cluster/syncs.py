"""The commits of a cluster host's actors in flight (decision 0016): how many of each actor run
(its next open waits for them to end), and which syncs are in the committer, failed at their
lease's end by this host's clock rather than when the store answers."""

from __future__ import annotations

from typing import Protocol

import structlog
import trio

from .keeper import LeaseKeeper

log = structlog.get_logger("actorkeep")


class Sending(Protocol):
    """A sync in the committer (``ClusterDatabase``)."""

    address: str
    partition: int
    epoch: int

    def lease_ran_out(self) -> None: ...


class SyncsInFlight:
    """The syncs and commits running for each actor of this host, counted per address and
    per partition (a partition is not handed over while one of its commits runs)."""

    def __init__(self, keeper: LeaseKeeper) -> None:
        self.keeper = keeper
        self._running: dict[str, int] = {}
        self._ended: dict[str, trio.Event] = {}  # by address, while some run
        self._sending: set[Sending] = set()
        self._sends_waiting = trio.Event()

    def change(self, address: str, partition: int, delta: int) -> None:
        """A commit of ``address`` (of ``partition``) begins (+1) or ends (-1)."""
        self.keeper.working(partition, delta)
        n = self._running.get(address, 0) + delta
        if n:
            self._running[address] = n
            self._ended.setdefault(address, trio.Event())
        else:
            self._running.pop(address, None)
            event = self._ended.pop(address, None)
            if event is not None:
                event.set()

    async def ended(self, address: str) -> None:
        """Until no commit of ``address`` runs."""
        while (event := self._ended.get(address)) is not None:
            await event.wait()

    async def all_ended(self) -> None:
        """Until no commit runs."""
        while self._ended:
            await next(iter(self._ended.values())).wait()

    def sending(self, db: Sending) -> None:
        """``db``'s sync went in the committer: it runs until ``sent``."""
        self.change(db.address, db.partition, +1)
        if not self._sending:
            self._sends_waiting.set()
        self._sending.add(db)

    def sent(self, db: Sending) -> None:
        """The batch that had ``db``'s sync ended."""
        self._sending.discard(db)
        self.change(db.address, db.partition, -1)

    async def end_those_past_their_lease(self) -> None:
        """A sync in the committer whose partition's lease runs out by this host's clock
        fails then (``lease_ran_out``), not when the store's connection times out (a host
        cut off from it). Looks again at least every tick's interval; runs until cancelled."""
        while True:
            if not self._sending:
                self._sends_waiting = trio.Event()
                await self._sends_waiting.wait()
                continue
            keeper = self.keeper
            wait = min(keeper.remaining(db.partition) for db in self._sending)
            await trio.sleep(min(wait, keeper.settings.every))
            for db in list(self._sending):
                lease = keeper.lease_for(db.partition)
                if lease is None or lease.epoch != db.epoch:
                    self._sending.discard(db)  # still running until its batch ends
                    try:
                        db.lease_ran_out()
                    except Exception as exc:  # one actor's bookkeeping: never the others'
                        log.error("a sync past its lease could not be ended",
                                  address=db.address, error=repr(exc))  # fmt: skip
