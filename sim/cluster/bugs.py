"""Planted cluster bugs the checkers must catch (``python -m sim --cluster --bug NAME``, any
scenario): a store that forgets to fence, takes a lease over before it expired or hands out
leases without the margin, and a router that serves from what it has open."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import outcome

from actorkeep.cluster.committer import Committer, Nothing, Source
from actorkeep.cluster.records import Lease, Write

from .observers import ObservedKeeper, ObservedRouter, ObservedStore


class SkipsTheEpochCheck(ObservedStore):
    """A commit that does not compare the writes' epochs with the partitions' (fencing lost):
    a host whose lease moved still lands its writes."""

    def moved(self, epochs: dict[int, int]) -> list[int]:
        return []


class TakesOverEarly(ObservedStore):
    """A store that counts a host, and its leases, as gone once one renewal interval (a third
    of the TTL) passed without a word from it, as if the expiry were tested against the
    interval: a live owner whose renewal is a little late loses its partitions while its own
    clock still says it holds them."""

    _ttl = 0.0

    def _gone(self, expires_at: float | None) -> bool:
        # Renewed last at expires_at - ttl: gone once ttl / 3 passed since.
        return expires_at is None or expires_at - self._ttl * 2 / 3 <= self.cluster.clock()

    def heartbeat(self, ttl: float, address: str | None = None) -> int:
        self._ttl = ttl
        super().heartbeat(ttl, address)
        now = self.cluster.clock()
        return sum(1 for seen, _ in self.cluster.hosts.values() if seen > now - ttl / 3)

    def free_partitions(self, limit: int) -> list[int]:
        rows = self.cluster.leases
        early = [
            p for p, row in rows.items() if row.owner is not None and self._gone(row.expires_at)
        ]
        return (early + [p for p in super().free_partitions(limit) if p not in early])[:limit]

    def acquire(self, partition: int, ttl: float, margin: float) -> Lease | None:
        row = self.cluster.leases[partition]
        if self._gone(row.expires_at):
            row.expires_at = self.cluster.clock()  # taken as expired
        return super().acquire(partition, ttl, margin)


class ServesWithoutMargin(ObservedStore):
    """Leases good by the host's clock for the whole TTL: no margin for the clocks' drift or
    for a reply on its way."""

    def acquire(self, partition: int, ttl: float, margin: float) -> Lease | None:
        lease = super().acquire(partition, ttl, margin)
        return None if lease is None else Lease(lease.partition, lease.epoch, lease.until + margin)

    def renew(self, leases: Sequence[Lease], ttl: float, margin: float) -> list[Lease]:
        return [
            Lease(x.partition, x.epoch, x.until + margin)
            for x in super().renew(leases, ttl, margin)
        ]


class TrustsWhatItHasOpen(ObservedRouter):
    """A router that runs an event here whenever this host has the actor open, whatever the
    lease says: it trusts a stale view of who owns what."""

    async def call_rpc(
        self,
        caller: str,
        chain: tuple[str, ...],
        address: str,
        method: str,
        args: dict[str, Any],
        timeout: float | None,
    ) -> Any:
        assert self.incarnation is not None
        if self.incarnation.storage.opened_under(address) is not None:
            result = await self.host.call_rpc_here(caller, chain, address, method, args, timeout)
            self._leaves(address)
            return result
        return await super().call_rpc(caller, chain, address, method, args, timeout)


class HandsOverAtOnce(ObservedKeeper):
    """A keeper that releases the partitions above its share at the next tick, without
    waiting for the host to be done with them: what runs on them, and the plain writes of
    their open actors, are lost (the hand-over before decision 0018). The hand-over's own
    test catches it; the sweeps do not (few of their runs hand partitions over with plain
    writes unshipped and then read them), so it is not offered to ``--bug``."""

    def tick(self) -> None:
        self.handed(self.leaving)
        super().tick()


class EndsBeforeItCommits(Committer):
    """A group commit that tells each actor its write is in the store as the batch takes the
    frames, before the store has them: the replies the actor's output gate held leave, and a
    batch that then fails (the store failing over, the host dying) loses writes acknowledged
    as durable. Ended early, an actor's next write may also land while the one before it
    fails: its restore finds that the batches the store holds do not add up and calls the
    actor damaged."""

    def submit_source(self, source: Source) -> None:
        super().submit_source(_EndedAtTake(source))


class _EndedAtTake:
    """A source whose write ends (successfully) the moment the batch takes it."""

    def __init__(self, source: Source) -> None:
        self._source = source
        self._ended = False

    def take(self) -> Write | Nothing | None:
        write = self._source.take()
        if isinstance(write, Write):
            self._ended = True
            self._source.ended(outcome.Value(None))
        return write

    def ended(self, result: outcome.Outcome[None]) -> None:
        if not self._ended:
            self._source.ended(result)


#: name -> the class with the bug (``--bug NAME --cluster``): the store's, the keeper's, the
#: router's or the group commit's.
CLUSTER_BUGS: dict[
    str, type[ObservedStore] | type[ObservedKeeper] | type[ObservedRouter] | type[Committer]
] = {
    "skips-epoch-check": SkipsTheEpochCheck,
    "early-takeover": TakesOverEarly,
    "no-margin": ServesWithoutMargin,
    "trusts-open-actor": TrustsWhatItHasOpen,
    "ends-before-commit": EndsBeforeItCommits,
}
