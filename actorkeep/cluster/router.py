"""The router of a cluster host (decision 0016): it serves an address only while it holds the
address's partition by its own clock, before the event and again before the reply leaves, so
that no answer leaves a host after its lease ran out. What it does not serve gets 503 with
Retry-After (``NotServedHere``); forwarding to the owner is not built yet."""

from __future__ import annotations

from typing import Any

from ..http import Request, Response
from ..runtime.router import Target
from .backend import ClusterStorage, NotServedHere
from .partitions import partition_of


class ClusterRouter:
    """``Host(..., router=lambda host: ClusterRouter(host, storage))``."""

    def __init__(self, host: Target, storage: ClusterStorage) -> None:
        self.host = host
        self._storage = storage

    def _partition(self, address: str) -> int:
        return partition_of(address, self._storage.store.partitions)

    def _check(self, address: str, partition: int, before: bool) -> None:
        storage = self._storage
        lease = storage.keeper.lease_for(partition)
        if lease is None:
            raise NotServedHere(address)
        opened = storage.opened_under(address)
        # In memory from before the partition left this host and came back, what the actor
        # holds may be stale: out of memory with it, and the event opens it afresh (restored
        # from the store). If it is busy, or the epoch changed while the event ran: 503.
        stale = opened is not None and opened != lease.epoch
        if stale and not (before and self.host.evict(address)):
            raise NotServedHere(address)

    async def deliver(
        self,
        class_name: str,
        name: str,
        request: Request,
        chain: tuple[str, ...],
        timeout: float | None,
    ) -> Response:
        address = f"{class_name}/{name}"
        partition = self._partition(address)
        self._check(address, partition, before=True)
        resp = await self.host.deliver_here(class_name, name, request, chain, timeout)
        self._check(address, partition, before=False)  # the lease may have run out meanwhile
        return resp

    async def call_rpc(
        self,
        caller: str,
        chain: tuple[str, ...],
        address: str,
        method: str,
        args: dict[str, Any],
        timeout: float | None,
    ) -> Any:
        partition = self._partition(address)
        self._check(address, partition, before=True)
        result = await self.host.call_rpc_here(caller, chain, address, method, args, timeout)
        self._check(address, partition, before=False)
        return result
