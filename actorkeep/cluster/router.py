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

    def _check(self, address: str) -> None:
        partition = partition_of(address, self._storage.store.partitions)
        if self._storage.keeper.lease_for(partition) is None:
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
        self._check(address)
        resp = await self.host.deliver_here(class_name, name, request, chain, timeout)
        self._check(address)  # the lease may have run out while the event ran
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
        self._check(address)
        result = await self.host.call_rpc_here(caller, chain, address, method, args, timeout)
        self._check(address)
        return result
