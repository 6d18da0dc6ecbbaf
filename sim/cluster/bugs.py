"""Planted cluster bugs the checkers must catch (``python -m sim --cluster --bug NAME``, any
scenario): a store that forgets to fence or hands out leases without the margin, and a router
that serves from what it has open."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from actorkeep.cluster.records import Lease

from .observers import ObservedRouter, ObservedStore


class SkipsTheEpochCheck(ObservedStore):
    """A commit that does not compare the writes' epochs with the partitions' (fencing lost):
    a host whose lease moved still lands its writes."""

    def moved(self, epochs: dict[int, int]) -> list[int]:
        return []


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


#: name -> the store's or the router's class with the bug.
CLUSTER_BUGS: dict[str, type[ObservedStore] | type[ObservedRouter]] = {
    "skips-epoch-check": SkipsTheEpochCheck,
    "no-margin": ServesWithoutMargin,
    "trusts-open-actor": TrustsWhatItHasOpen,
}
