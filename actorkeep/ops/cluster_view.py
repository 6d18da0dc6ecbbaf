"""What the operator sees of a cluster (``serve --cluster``): its hosts, every partition's owner
and epoch, where an actor lives, and the actors with durable state anywhere in it. Read from
PostgreSQL on connections of their own, in a thread (docs/operations.md)."""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any, Protocol

import trio

from .inspect import InspectError

_READERS = trio.CapacityLimiter(2)


class ClusterSource(Protocol):
    """What ``cluster.store_view.StoreView`` answers (ops does not import the cluster: it
    needs psycopg, which a single host goes without)."""

    host_id: str
    partitions: int

    def view(self) -> dict[str, Any]: ...

    def partition_of(self, address: str) -> int: ...

    def known(self, address: str) -> bool: ...

    def addresses(self, low: str, high: str | None, after: str | None, limit: int) -> list[str]: ...


class ClusterView:
    """The cluster of ``store``; ``held``: the partitions this host serves now."""

    def __init__(self, store: ClusterSource, held: Callable[[], int]) -> None:
        self.store = store
        self.held = held

    async def overview(self) -> dict[str, Any]:
        """The hosts, each with the partitions it holds, and every partition's lease."""
        view = await trio.to_thread.run_sync(self.store.view, limiter=_READERS)
        live = [x for x in view["leases"] if x["owner"] and (x["expires_in"] or 0) > 0]
        owned = collections.Counter(x["owner"] for x in live)
        for host in view["hosts"]:
            host["partitions"] = owned.get(host["host_id"], 0)
            host["this"] = host["host_id"] == view["host_id"]
        view["unowned"] = view["partitions"] - len(live)
        view["held_here"] = self.held()
        return view

    async def where(self, address: str) -> dict[str, Any]:
        """The partition of ``address``, its owner and epoch, and the owner's address."""
        try:
            partition = self.store.partition_of(address)
        except ValueError as exc:
            raise InspectError(str(exc)) from None
        view = await trio.to_thread.run_sync(self.store.view, limiter=_READERS)
        lease = view["leases"][partition]
        live = lease["owner"] is not None and (lease["expires_in"] or 0) > 0
        owner = lease["owner"] if live else None
        addresses = {h["host_id"]: h["address"] for h in view["hosts"]}
        return {
            "partition": partition,
            "owner": owner,
            "owner_address": addresses.get(owner) if owner else None,
            "epoch": lease["epoch"],
            "here": owner == view["host_id"],
        }

    async def known(self, address: str) -> bool:
        """Whether ``address`` has durable state anywhere in the cluster."""
        return await trio.to_thread.run_sync(self.store.known, address, limiter=_READERS)

    async def addresses(self, prefix: str, after: str | None, limit: int) -> list[str]:
        """Actors with durable state in the cluster whose address starts with ``prefix``."""
        high = _after_prefix(prefix) if prefix else None
        return await trio.to_thread.run_sync(
            self.store.addresses, prefix, high, after, limit, limiter=_READERS
        )


def _after_prefix(prefix: str) -> str | None:
    """The least string above every string starting with ``prefix`` (None: none is)."""
    for i in range(len(prefix) - 1, -1, -1):
        if ord(prefix[i]) < 0x10FFFF:
            return prefix[:i] + chr(ord(prefix[i]) + 1)
    return None
