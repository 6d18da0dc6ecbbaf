"""What the cluster world puts between its hosts and their real parts to watch them: the
router (every reply and call let out, checked against the store), the store handle (every
write it accepted under an old epoch), the storage backend and the lease keeper (each working
copy given up, each partition taken over: a power loss of those files, for the checkers)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from actorkeep.cluster.backend import ClusterStorage
from actorkeep.cluster.keeper import LeaseKeeper
from actorkeep.cluster.peers import Peers
from actorkeep.cluster.records import AlarmChange, Write
from actorkeep.cluster.router import ClusterRouter
from actorkeep.http import Request, Response
from actorkeep.routing import Operation
from actorkeep.runtime.router import Target

from ..history import History
from .store import MemoryStore


class Host(Protocol):
    """What the observers need of a host incarnation (``ClusterIncarnation``)."""

    storage: ClusterStorage


class Watcher(Protocol):
    """Where the observers report (``ClusterWorld``)."""

    history: History

    def now(self) -> float: ...

    def reply_leaves(self, inc: Any, address: str, what: str = "reply") -> None: ...

    def back(self, why: str) -> None: ...

    def actors_in(self, partitions: set[int]) -> list[str]: ...

    def handed_over(self, partition: int, epoch: int) -> None: ...

    def was_handed_over(self, partition: int, epoch: int) -> bool: ...


class ObservedRouter(ClusterRouter):
    """The cluster's router, with every reply of an actor this host serves checked against
    the store at the moment it leaves the router (``Watcher.reply_leaves``)."""

    def __init__(
        self,
        host: Target,
        storage: ClusterStorage,
        peers: Peers,
        world: Watcher,
    ) -> None:
        super().__init__(host, storage, peers)
        self._world = world
        #: The incarnation this router is of (set once it is made, after its host).
        self.incarnation: Host | None = None

    def _leaves(self, address: str) -> None:
        assert self.incarnation is not None
        self._world.reply_leaves(self.incarnation, address)

    async def may_leave(self, caller: str) -> None:
        await super().may_leave(caller)
        assert self.incarnation is not None
        if self.incarnation.storage.opened_under(caller) is not None:
            self._world.reply_leaves(self.incarnation, caller, "call")

    async def deliver_local(
        self,
        class_name: str,
        name: str,
        request: Request,
        chain: tuple[str, ...],
        timeout: float | None,
    ) -> Response:
        response = await super().deliver_local(class_name, name, request, chain, timeout)
        self._leaves(f"{class_name}/{name}")
        return response

    async def call_op_local(
        self,
        caller: str,
        chain: tuple[str, ...],
        address: str,
        op: Operation,
        values: Mapping[str, Any],
        timeout: float | None,
    ) -> Response:
        response = await super().call_op_local(caller, chain, address, op, values, timeout)
        self._leaves(address)
        return response

    async def call_rpc_local(
        self,
        caller: str,
        chain: tuple[str, ...],
        address: str,
        method: str,
        args: dict[str, Any],
        timeout: float | None,
    ) -> Any:
        result = await super().call_rpc_local(caller, chain, address, method, args, timeout)
        self._leaves(address)
        return result


class ObservedStore(MemoryStore):
    """A host's handle on the simulated store, telling the world of every write it accepted
    under an epoch its partition no longer has (fencing failed)."""

    world: Watcher | None = None

    def commit(self, writes: Sequence[Write], alarms: Sequence[AlarmChange] = ()) -> None:
        rows = self.cluster.leases
        stale = sorted(
            {w.address for w in writes if rows[w.partition].epoch != w.epoch}
            | {a.address for a in alarms if rows[a.partition].epoch != a.epoch}
        )
        super().commit(writes, alarms)
        if stale:
            self._accepted(stale)

    def compact(self, partition: int, epoch: int, address: str, seq: int, image: bytes) -> None:
        stale = self.cluster.leases[partition].epoch != epoch
        super().compact(partition, epoch, address, seq, image)
        if stale:
            self._accepted([address])

    def _accepted(self, addresses: list[str]) -> None:
        assert self.world is not None
        self.world.history.observe(
            "cluster.stale-commit", self.world.now(), by=self.host_id, addresses=addresses
        )


class ObservedStorage(ClusterStorage):
    """The cluster's storage backend, telling the world each time an actor's local file is
    given up: what the store did not have of it (plain writes) is lost, as by a power loss of
    that file on a single host."""

    def __init__(self, *args: Any, world: Watcher, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._world = world
        self.number = 0  # the incarnation's, once it is made

    def forget(self, address: str) -> None:
        super().forget(address)
        self._world.history.fault(
            "power-loss",
            self._world.now(),
            by=self.number,
            rolled_back=[f"actors/{address}"],
            why="the local file is given up",
        )


class ObservedKeeper(LeaseKeeper):
    """The lease keeper, telling the world of each partition its host takes: what the store
    did not have of the partition's actors (plain writes not shipped by their last owner) is
    lost, as by a power loss of their files, before the new owner serves them. Not after a
    hand-over the last owner finished (its actors closed, their closes committed): that one
    must lose nothing, and the checkers hold it to that."""

    def __init__(
        self, store: MemoryStore, *args: Any, world: Watcher, number: int, **kwargs: Any
    ) -> None:
        super().__init__(store, *args, **kwargs)
        self._on = store
        self._world = world
        self._number = number
        self._done: frozenset[int] = frozenset()

    def handed(self, partitions: frozenset[int]) -> None:
        super().handed(partitions)
        self._done = partitions

    def tick(self) -> None:
        held = self.held
        before = {(p, lease.epoch) for p, lease in held.items()}
        finished = {p: held[p].epoch for p in self.leaving & self._done}
        super().tick()
        for p, epoch in finished.items():
            if p not in self.held and self._on.lease_of(p) == (None, epoch):  # released
                self._world.handed_over(p, epoch)
        # By epoch: a lease lost and taken again in one tick restores its actors all the same.
        taken = {p for p, lease in self.held.items() if (p, lease.epoch) not in before}
        if taken:
            self._world.back("partitions taken over")
            lossy = {p for p in taken if not self._world.was_handed_over(p, self.held[p].epoch - 1)}
            files = self._world.actors_in(lossy)
            if files:
                self._world.history.fault(
                    "power-loss",
                    self._world.now(),
                    by=self._number,
                    rolled_back=files,
                    why="partitions taken over",
                )
