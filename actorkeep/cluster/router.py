"""The router of a cluster host (decisions 0016 and 0017).

An event for an actor whose partition this host holds runs here, checked against the lease by
the host's own clock before the event and again before the reply leaves, so that no answer
leaves a host after its lease ran out (and a durable write whose commit has not ended when the
lease runs out fails then, ``ClusterDatabase.sync``: its callers are not held longer). An event
for an actor owned elsewhere goes to the owner's internal port (``peers.py``), one hop, with its
caller and call chain. While nobody serves the partition (a failover, a handover), or the owner
says it no longer holds it, the router reads the owners again and tries until the call's
deadline (``retry_for`` when it has none), then answers 503 with Retry-After
(``NotServedHere``)."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import trio

from ..errors import OutcomeUnknown
from ..http import Request, Response
from ..routing import Operation
from ..runtime.router import Target
from ..runtime.sockets import ServedElsewhere
from .backend import ClusterStorage
from .database import NotServedHere
from .partitions import partition_of
from .peer_requests import Elsewhere
from .peers import Peers, Unreachable
from .records import Lease

T = TypeVar("T")

#: Addresses whose partition the router remembers (FNV-1a in Python costs a few µs a call).
PARTITION_CACHE = 65_536
#: How often at most the router reads the owners again while it waits for one.
REFRESH_EVERY = 0.1
_FIRST_PAUSE, _LONGEST_PAUSE = 0.02, 0.25


class ClusterRouter:
    """``Host(..., router=lambda host: ClusterRouter(host, storage, peers))``; without
    ``peers`` the host serves only what it owns (503 for the rest)."""

    def __init__(
        self,
        host: Target,
        storage: ClusterStorage,
        peers: Peers | None = None,
        retry_for: float | None = None,
    ) -> None:
        self.host = host
        self._storage = storage
        storage.evict = host.evict  # a hand-over takes the partition's actors out of memory
        self._keeper = storage.keeper
        self._peers = peers
        #: How long a call without a deadline waits for its partition's owner.
        self.retry_for = 2 * storage.keeper.settings.ttl if retry_for is None else retry_for
        self._refreshed = -float("inf")
        self._partitions: dict[str, int] = {}
        # Actors whose event had a call refused by ``may_leave``: its answer cannot stand.
        self._refused: dict[str, bool] = {}

    def _partition(self, address: str) -> int:
        partition = self._partitions.get(address)
        if partition is None:
            if len(self._partitions) >= PARTITION_CACHE:
                self._partitions.clear()
            partition = self._partitions[address] = partition_of(
                address, self._storage.store.partitions
            )
        return partition

    def _check(self, address: str, partition: int, before: bool) -> None:
        # A partition being handed over takes no new event; what runs finishes under it.
        keeper = self._keeper
        lease = keeper.accepts(partition) if before else keeper.lease_for(partition)
        if lease is None:
            if before:
                raise Elsewhere(address)
            # The event ran (and what the gate let through is durable): only its reply stays.
            raise OutcomeUnknown(
                f"{address}: the lease ran out while its event ran; the call may have run"
            )
        opened = self._storage.opened_under(address)
        # In memory from before the partition left this host and came back, what the actor
        # holds may be stale: out of memory with it, and the event opens it afresh (restored
        # from the store). If it is busy, or the epoch changed while the event ran: 503.
        stale = opened is not None and opened != lease.epoch
        if stale and not before:
            raise OutcomeUnknown(f"{address}: its partition moved while its event ran")
        if stale and not self.host.evict(address):
            raise NotServedHere(address)

    async def _within_lease(
        self, address: str, partition: int, event: Callable[[], Awaitable[T]]
    ) -> T:
        self._check(address, partition, before=True)
        self._keeper.working(partition, +1)
        try:
            try:
                result = await event()
            except Exception as exc:
                self._was_refused(address, exc)
                raise
            await self._storage.until_renewed(partition)
            self._check(address, partition, before=False)  # the lease may have run out
            self._was_refused(address)
            return result
        finally:
            self._keeper.working(partition, -1)

    def _was_refused(self, address: str, exc: Exception | None = None) -> None:
        """A call of the event was refused (``may_leave``): whatever it answers or raises,
        it could not finish here, and what it wrote before may be durable."""
        if self._refused and self._refused.pop(address, False):
            raise OutcomeUnknown(f"{address} was not served here while its event ran") from exc

    def _refresh_owners(self) -> None:
        if trio.current_time() - self._refreshed >= REFRESH_EVERY:
            self._refreshed = trio.current_time()
            self._storage.refresh_owners_soon()

    async def _route(
        self,
        address: str,
        timeout: float | None,
        here: Callable[[float | None], Awaitable[T]],
        there: Callable[[str, float | None], Awaitable[T]],
    ) -> T:
        partition = self._partition(address)
        start = trio.current_time()
        end = start + (self.retry_for if timeout is None else timeout)
        pause = _FIRST_PAUSE
        while True:
            left = None if timeout is None else max(end - trio.current_time(), 1e-3)
            if self._keeper.accepts(partition) is not None:
                try:
                    return await here(left)
                except Elsewhere:  # the lease ran out just now
                    pass
            else:
                peer = self._keeper.owner_of(partition)
                if peer is not None and self._peers is not None:
                    try:
                        return await there(peer, left)
                    except (Elsewhere, Unreachable):
                        pass  # it moved, or the owner cannot be reached: look again
            if trio.current_time() + pause > end:
                raise NotServedHere(address)
            self._refresh_owners()  # in the background: the store may not answer for a while
            await trio.sleep(pause)
            pause = min(2 * pause, _LONGEST_PAUSE)

    def serves(self, address: str) -> bool:
        """Whether this host may start an event of ``address`` now: it holds the partition by
        its own clock, not being handed over, under the epoch the actor's database was opened
        with (if it is open)."""
        return self._holds(address, self._keeper.accepts(self._partition(address)))

    def _holds(self, address: str, lease: Lease | None) -> bool:
        if lease is None:
            return False
        opened = self._storage.opened_under(address)
        return opened is None or opened == lease.epoch

    async def may_leave(self, caller: str) -> None:
        """A call an actor of this host makes is one of its outputs: it leaves only while the
        host holds the caller's partition under the epoch its database was opened with (a
        late renewal is waited for: ``ClusterStorage.until_renewed``). An event that began
        under the lease may call after it ran out; its writes are fenced, and this stops what
        it would tell others."""
        partition = self._partition(caller)
        if self._storage.opened_under(caller) is None or self._holds(
            caller, self._keeper.lease_for(partition)
        ):
            return
        await self._storage.until_renewed(partition)
        if not self._holds(caller, self._keeper.lease_for(partition)):
            self._refused[caller] = True
            raise NotServedHere(caller)

    # -- what the host calls: anywhere in the cluster -------------------------------------
    async def deliver(
        self,
        class_name: str,
        name: str,
        request: Request,
        chain: tuple[str, ...],
        timeout: float | None,
    ) -> Response:
        if chain:
            await self.may_leave(chain[-1])
        address = f"{class_name}/{name}"
        if self._keeper.accepts(self._partition(address)) is not None:  # the common case
            with contextlib.suppress(Elsewhere):  # the lease ran out just now: route it
                return await self.deliver_local(class_name, name, request, chain, timeout)

        async def here(left: float | None) -> Response:
            return await self.deliver_local(class_name, name, request, chain, left)

        async def there(peer: str, left: float | None) -> Response:
            assert self._peers is not None
            if request.upgrade is not None:  # a WebSocket: the front relays it to the owner
                raise ServedElsewhere(peer)
            return await self._peers.deliver(peer, class_name, name, request, chain, left)

        return await self._route(address, timeout, here, there)

    async def call_rpc(
        self,
        caller: str,
        chain: tuple[str, ...],
        address: str,
        method: str,
        args: dict[str, Any],
        timeout: float | None,
    ) -> Any:
        await self.may_leave(caller)
        if self._keeper.accepts(self._partition(address)) is not None:  # the common case
            with contextlib.suppress(Elsewhere):  # the lease ran out just now: route it
                return await self.call_rpc_local(caller, chain, address, method, args, timeout)

        async def here(left: float | None) -> Any:
            return await self.call_rpc_local(caller, chain, address, method, args, left)

        async def there(peer: str, left: float | None) -> Any:
            assert self._peers is not None
            return await self._peers.call_rpc(peer, caller, chain, address, method, args, left)

        return await self._route(address, timeout, here, there)

    async def call_op(
        self,
        caller: str,
        chain: tuple[str, ...],
        address: str,
        op: Operation,
        values: Mapping[str, Any],
        timeout: float | None,
    ) -> Response:
        # The frame goes as values (decision 0028): to an actor of this host, and packed once
        # into the request to another host.
        if chain:
            await self.may_leave(chain[-1])
        if self._keeper.accepts(self._partition(address)) is not None:  # the common case
            with contextlib.suppress(Elsewhere):  # the lease ran out just now: route it
                return await self.call_op_local(caller, chain, address, op, values, timeout)

        async def here(left: float | None) -> Response:
            return await self.call_op_local(caller, chain, address, op, values, left)

        async def there(peer: str, left: float | None) -> Response:
            assert self._peers is not None
            return await self._peers.call_op(peer, caller, chain, address, op, values, left)

        return await self._route(address, timeout, here, there)

    # -- what the other hosts call: only what this host owns ------------------------------
    async def deliver_local(
        self,
        class_name: str,
        name: str,
        request: Request,
        chain: tuple[str, ...],
        timeout: float | None,
    ) -> Response:
        """The event on this host if it owns the actor's partition; ``Elsewhere`` if not."""
        address = f"{class_name}/{name}"

        def event() -> Awaitable[Response]:
            return self.host.deliver_here(class_name, name, request, chain, timeout)

        return await self._within_lease(address, self._partition(address), event)

    async def call_op_local(
        self,
        caller: str,
        chain: tuple[str, ...],
        address: str,
        op: Operation,
        values: Mapping[str, Any],
        timeout: float | None,
    ) -> Response:
        """The operation on this host if it owns the actor's partition; ``Elsewhere`` if not."""

        def event() -> Awaitable[Response]:
            return self.host.call_op_here(caller, chain, address, op, values, timeout)

        return await self._within_lease(address, self._partition(address), event)

    async def call_rpc_local(
        self,
        caller: str,
        chain: tuple[str, ...],
        address: str,
        method: str,
        args: dict[str, Any],
        timeout: float | None,
    ) -> Any:
        """The rpc on this host if it owns the actor's partition; ``Elsewhere`` if not."""

        def event() -> Awaitable[Any]:
            return self.host.call_rpc_here(caller, chain, address, method, args, timeout)

        return await self._within_lease(address, self._partition(address), event)
