"""``ClusterWorld``: the hosts of a cluster and the cluster's store in one seeded trio run.

    world = sim.cluster.ClusterWorld(app, seed=7, hosts=3)

Each host is a real ``Host`` with the cluster's real storage backend, lease keeper, router and
internal protocol (``actorkeep.cluster``), over the simulator's parts instead of PostgreSQL and
TCP: the store is a ``MemoryCluster`` reached through a ``StoreLink`` per host (seeded latency,
lost replies, failover), the hosts talk over a ``SimNetwork`` (seeded delays, cuts), and each
host's monotonic clock drifts from the store's within ``DRIFT``. Actors' working copies are
real SQLite files under a temporary directory, one per host incarnation (a restarted host is a
new owner with an empty disk, as on a replaced machine); their I/O runs on the trio thread.

The world plays the clients as ``World`` does (``rpc``, ``request``, ``invoke``): each
operation enters the cluster through a live host drawn from the seed, which serves it or
forwards it to the owner. Faults (``timed_faults``): a host killed (kill -9: its unshipped plain
writes are lost, recorded as a power loss of the files it held), paused past its lease and
resumed with stale beliefs (SIGSTOP), cut from the other hosts or from the store, and a
failover of the store itself. ``heal`` ends them; the next ``wait_up`` waits until every
partition has an owner again.

Every reply an actor's owner lets out (to the world or to another host), and every call an
actor makes, is checked at that moment against the store: the host must own the actor's
partition there, under a lease not yet expired by the store's clock, and by its own clock; and
the store must accept no write under an old epoch (``observers.py``, ``checks.py``).
"""

from __future__ import annotations

import contextvars
import hashlib
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import trio

from actorkeep.app import App
from actorkeep.cluster.backend import ClusterStorage
from actorkeep.cluster.committer import Committer
from actorkeep.cluster.keeper import LeaseSettings
from actorkeep.cluster.partitions import partition_of
from actorkeep.cluster.peers import Peers, serve_connection
from actorkeep.cluster.records import StoreError
from actorkeep.errors import CallTimeout, Overloaded
from actorkeep.http import Response
from actorkeep.runtime.host import Host
from actorkeep.runtime.router import Target

from ..faults import Faults
from ..history import Op, Status
from ..world import ANCHOR, WORLD_CALLER, Incarnation, World
from .network import SimNetwork
from .observers import ObservedKeeper, ObservedRouter, ObservedStorage, ObservedStore
from .store import MemoryCluster, StoreLink

T = TypeVar("T")

#: The leases of a simulated cluster: short, so that failovers take little virtual time.
SIM_LEASE = LeaseSettings(ttl=1.5, margin=0.5)
#: Each host's clock runs at a rate within this fraction of the store's (0.5%: 7.5 ms over a
#: 1.5 s lease, well inside the margin).
DRIFT = 0.005
#: Partitions of a simulated cluster.
SIM_PARTITIONS = 16
INTERNAL_PORT = 7000
#: How long a supervisor waits before it starts again a host that could not start.
RESTART_EVERY = 0.5
#: How long after ``heal`` every partition must have an owner again (liveness).
OWNED_WITHIN = 5 * SIM_LEASE.ttl

_entry: contextvars.ContextVar[ClusterIncarnation | None] = contextvars.ContextVar(
    "sim_cluster_entry", default=None
)
#: The host incarnation whose work the current task does (inherited by the tasks it starts).
_running_on: contextvars.ContextVar[ClusterIncarnation | None] = contextvars.ContextVar(
    "sim_cluster_running_on", default=None
)


class ClusterIncarnation(Incarnation):
    """One run of one cluster host, from start to crash or stop."""

    def __init__(
        self,
        number: int,
        machine: int,
        host: Host,
        storage: ClusterStorage,
        link: StoreLink,
        peers: Peers,
    ) -> None:
        super().__init__(number, host, None)
        self.machine = machine
        self.name = storage.store.host_id
        self.address = f"{self.name}:{INTERNAL_PORT}"
        self.storage = storage
        self.link = link
        self.peers = peers
        self.router: ObservedRouter | None = None
        self.nursery: trio.Nursery | None = None
        self.resumed: trio.Event | None = None  # set: paused until it is set
        #: The host's own monotonic clock (drifting from the store's), once it is made.
        self.clock: Callable[[], float] = trio.current_time

    async def unpaused(self) -> None:
        """Until this host runs (a paused host takes no request and lets no reply out)."""
        while self.resumed is not None:
            await self.resumed.wait()


class ClusterWorld(World):
    """``hosts`` cluster hosts running ``app`` over one simulated store, fully determined by
    ``seed``."""

    def __init__(
        self,
        app: App,
        seed: int,
        *,
        hosts: int = 3,
        faults: Faults | None = None,
        anchor: float = ANCHOR,
        host_options: Mapping[str, Any] | None = None,
        lease: LeaseSettings = SIM_LEASE,
        partitions: int = SIM_PARTITIONS,
        lost_replies: float = 0.0,
        drops: float = 0.0,
        router_class: type[ObservedRouter] | None = None,
        store_class: type[ObservedStore] | None = None,
        keeper_class: type[ObservedKeeper] | None = None,
        committer_class: type[Committer] | None = None,
    ) -> None:
        self._last_started: Incarnation | None = None
        super().__init__(app, seed, faults=faults, anchor=anchor, host_options=host_options)
        #: The hosts' router (a planted bug's, in the checkers' own tests).
        self.router_class = ObservedRouter if router_class is None else router_class
        #: The hosts' handle on the store (a planted bug's, in the checkers' own tests).
        self.store_class = ObservedStore if store_class is None else store_class
        #: The hosts' lease keeper (a planted bug's, in the checkers' own tests).
        self.keeper_class = ObservedKeeper if keeper_class is None else keeper_class
        #: The hosts' group commit (a planted bug's, in the checkers' own tests).
        self.committer_class = Committer if committer_class is None else committer_class
        if not 1 <= hosts <= 16:
            raise ValueError("a simulated cluster has 1 to 16 hosts")
        self.machines = hosts
        self.lease = lease
        self.lost_replies = lost_replies
        self.drops = drops
        self.cluster = MemoryCluster(
            partitions, clock=trio.current_time, secret=self.rng("secret").randbytes(32)
        )
        self.net = SimNetwork(
            self.rng("network"),
            drop=drops,
            drops=self.rng("network-drop"),
            on_reset=lambda a, b: self.history.fault("reset", self.now(), between=[a, b]),
        )
        self.live: dict[int, ClusterIncarnation] = {}  # by machine
        self._all: list[ClusterIncarnation] = []
        self.replies = 0  # replies checked against the store
        self._pick = self.rng("entry-host")
        self._root: Path | None = None
        self._healed = False
        self._settled = False
        self._handed: set[tuple[int, int]] = set()  # (partition, epoch) handed over cleanly

    @property
    def current(self) -> Incarnation | None:
        """The host incarnation whose work the calling task does (the consumer of a push
        queue asks which host delivered to it); outside any host's work, the last started."""
        running = _running_on.get()
        return running if running is not None else self._last_started

    @current.setter
    def current(self, inc: Incarnation | None) -> None:
        self._last_started = inc

    # -- running ----------------------------------------------------------------------------
    async def _main(self, main: Callable[[World], Awaitable[T]]) -> T:
        self._root = Path(tempfile.mkdtemp(prefix="actorkeep-sim-"))
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await nursery.start(self.net.run)
                for machine in range(self.machines):
                    await self.restart_host(machine, 0.0, note=False)
                result = await main(self)
                await self.stop()
                nursery.cancel_scope.cancel()
            return result
        finally:
            shutil.rmtree(self._root, ignore_errors=True)

    async def start(self) -> Incarnation:
        """Start the first machine that has no running host."""
        for machine in range(self.machines):
            if machine not in self.live:
                return await self.start_host(machine)
        raise RuntimeError("every machine runs a host")

    async def start_host(self, machine: int) -> ClusterIncarnation:
        """Start a new host incarnation on ``machine`` (a new owner, with an empty disk)."""
        if machine in self.live:
            raise RuntimeError(f"machine {machine} already runs a host")
        assert self._nursery is not None and self._root is not None, "inside World.run"
        self.incarnations += 1
        n = self.incarnations
        name = f"h{machine}.{n}"
        drift = self.rng(f"clock/{n}")
        rate, offset = 1.0 + drift.uniform(-DRIFT, DRIFT), drift.uniform(0.0, 1000.0)

        def clock() -> float:
            return offset + rate * trio.current_time()

        store = self.store_class(self.cluster, name, clock)
        store.world = self
        keeper = self.keeper_class(store, self.lease, clock, world=self, number=n)
        keeper.address = f"{name}:{INTERNAL_PORT}"
        link = StoreLink(
            self.cluster,
            self.rng(f"store-link/{n}"),
            lost_replies=self.lost_replies,
            lost_requests=self.drops,
        )
        storage = ObservedStorage(
            self._root / name,
            store,
            keeper,
            run_store=link.run,
            files_in_thread=False,
            world=self,
        )
        storage.number = n
        storage.committer_class = self.committer_class
        peers = Peers(store.secret, connect=self.net.connector(name), nonce=self._nonce(n))
        made: list[ObservedRouter] = []

        def router(target: Target) -> ObservedRouter:
            made.append(self.router_class(target, storage, peers, self))
            return made[-1]

        host = Host(
            self.app,
            storage,
            clock=self.clock,
            rng=self.rng(f"host/{n}"),
            faults=self.hooks,
            router=router,
            alarm_index=lambda _: storage.alarms,
            **self.host_options,
        )
        inc = ClusterIncarnation(n, machine, host, storage, link, peers)
        inc.clock = clock
        self._all.append(inc)
        inc.router = made[0]
        inc.router.incarnation = inc
        await self._nursery.start(self._run_cluster_host, inc)
        self.live[machine] = inc
        self.current = inc
        self._up.set()
        return inc

    def _nonce(self, n: int) -> Callable[[int], bytes]:
        rng = self.rng(f"nonce/{n}")
        return rng.randbytes

    async def _run_cluster_host(
        self, inc: ClusterIncarnation, task_status: trio.TaskStatus[None]
    ) -> None:
        secret = inc.storage.store.secret
        nonce = self._nonce(-inc.number)

        async def accept(stream: trio.abc.Stream) -> None:
            # The connection is served by the host's own tasks: they die with it.
            assert inc.router is not None
            _running_on.set(inc)
            try:
                assert inc.nursery is not None
                inc.nursery.start_soon(serve_connection, stream, secret, inc.router, nonce)
            except (AssertionError, RuntimeError):  # the host is gone
                await stream.aclose()

        _running_on.set(inc)
        try:
            with inc.scope:
                async with trio.open_nursery() as beside:
                    inc.nursery = beside
                    await beside.start(inc.peers.run)
                    self.net.listen(inc.address, accept)
                    await beside.start(inc.storage.run)
                    async with inc.host.open():
                        task_status.started()
                        await inc.stop.wait()
                    await inc.storage.settle()
                    beside.cancel_scope.cancel()
        except BaseException:
            if inc.alive:  # a killed host dies with whatever its tasks hit: that is the kill
                raise
        finally:
            inc.nursery = None
            self.net.stop_listening(inc.address)
            self.quarantined.update(inc.host.quarantined)
            inc.done.set()

    async def stop(self) -> None:
        """Stop every host gracefully (they hand their partitions over)."""
        for machine in sorted(self.live):
            await self.stop_host(machine)

    async def stop_host(self, machine: int) -> None:
        inc = self.live.pop(machine, None)
        if inc is None:
            return
        inc.alive = False
        self._resume(inc)
        inc.stop.set()
        await inc.done.wait()
        self.history.fault("stop", self.now(), host=inc.number)
        self._update_up()

    def _update_up(self) -> None:
        if not self.live and self._up.is_set():
            self._up = trio.Event()

    # -- faults -----------------------------------------------------------------------------
    def crash(
        self,
        power_loss: bool = False,
        restart_after: float | None = None,
        machine: int | None = None,
    ) -> bool:
        """Kill a host (``machine``, or one drawn from the seed) as kill -9 would: it stops at
        once, its connections break, nothing it asks of the store runs any more. What it had
        not shipped is lost: a power loss of every file it held (for plain writes, a host's
        death is what power loss is to a single host). ``power_loss`` changes nothing here."""
        if machine is None:
            if not self.live:
                return False
            machine = self._fault_rng.choice(sorted(self.live))
        inc = self.live.pop(machine, None)
        if inc is None:
            return False
        inc.alive = False
        self.crashes += 1
        inc.link.kill()
        self.net.down(inc.name)
        self._resume(inc)
        held = sorted(f"actors/{c}/{n}" for c, n in inc.storage.files.actors())
        # Not ``host=``: to the checkers that says the incarnation's unknown operations can no
        # longer take effect, but one it forwarded may still run on its owner.
        self.history.fault("power-loss", self.now(), killed=inc.number, rolled_back=held)
        inc.scope.cancel()
        self._update_up()
        if restart_after is not None:
            assert self._nursery is not None
            self._nursery.start_soon(self.restart_host, machine, restart_after, inc)
        return True

    async def restart(self, downtime: float = 0.0) -> Incarnation:
        """Start the first machine without a host, after ``downtime``."""
        if downtime > 0:
            await trio.sleep(downtime)
        return await self.start()

    async def deploy(self, app: App, downtime: float = 0.0) -> Incarnation:
        """Stop every host gracefully, then start each machine's again, after ``downtime``,
        running ``app`` (not a rolling deploy: no host of the old version serves beside one of
        the new)."""
        self.app = app
        self.history.fault("deploy", self.now())
        while stale := sorted(m for m, inc in self.live.items() if inc.host.app is not app):
            for machine in stale:
                await self.stop_host(machine)
        if downtime > 0:
            await trio.sleep(downtime)
        for machine in range(self.machines):
            await self.restart_host(machine, 0.0)
        return await self.wait_up()

    async def restart_host(
        self,
        machine: int,
        downtime: float,
        dead: ClusterIncarnation | None = None,
        note: bool = True,
    ) -> ClusterIncarnation:
        """Start ``machine``'s host again after ``downtime`` (once ``dead`` has died), as a
        process supervisor would: again and again while its first tick finds no store (it
        failed over, or the tick's reply was lost)."""
        if dead is not None:
            await dead.done.wait()
        if downtime > 0:
            await trio.sleep(downtime)
        while True:
            if machine in self.live:
                return self.live[machine]
            try:
                new = await self.start_host(machine)
            except BaseException as exc:
                if not _only_store_errors(exc):
                    raise
                # Its first tick found no store (failing over): as a process supervisor
                # would, start it again shortly.
                self.history.note(
                    f"machine {machine}: the host could not start, the store did not answer"
                )
                await trio.sleep(RESTART_EVERY)
                continue
            if note:
                self.history.fault("restart", self.now(), host=new.number)
            return new

    def pause(self, machine: int) -> ClusterIncarnation | None:
        """Stop ``machine``'s host as SIGSTOP would: nothing reaches it or leaves it (network,
        store, clients) until ``resume``; its clock runs on meanwhile."""
        inc = self.live.get(machine)
        if inc is None or inc.resumed is not None:
            return None
        inc.resumed = trio.Event()
        inc.link.pause()
        self.net.hold(inc.name)
        self.history.fault("pause", self.now(), host=inc.number)
        return inc

    def resume(self, machine: int) -> None:
        inc = self.live.get(machine)
        if inc is not None and inc.resumed is not None:
            self._resume(inc)
            self.history.fault("resume", self.now(), host=inc.number)

    def _resume(self, inc: ClusterIncarnation) -> None:
        if inc.resumed is not None:
            inc.resumed.set()
            inc.resumed = None
        inc.link.resume()
        self.net.release(inc.name)

    async def timed_faults(self, rng: Any, count: int, span: float, power_p: float) -> None:
        """``count`` cluster faults at random moments over ``span`` virtual seconds: a host
        killed and restarted, paused (sometimes past its lease) and resumed, cut from the other
        hosts or from the store for a while, or a failover of the store."""
        ttl = self.lease.ttl
        for _ in range(count):
            await trio.sleep(rng.uniform(0.0, span / max(count, 1)))
            if self._healed or not self.live:
                return
            machine = rng.choice(sorted(self.live))
            kind = rng.choice(("kill", "kill", "pause", "cut", "store-cut", "store-failover"))
            lasts = rng.uniform(0.0, 2.5 * ttl)
            if kind == "kill":
                self.crash(machine=machine, restart_after=rng.uniform(0.0, 0.5))
            elif kind == "pause":
                if self.pause(machine) is not None:
                    await trio.sleep(lasts)
                    self.resume(machine)
                    self.back("resumed")
            elif kind == "cut":
                inc = self.live[machine]
                for other in self.live.values():
                    if other is not inc:
                        self.net.cut(inc.name, other.name)
                self.history.fault("cut", self.now(), host=inc.number, seconds=lasts)
                await trio.sleep(lasts)
                self.net.heal()
                self.back("links healed")
            elif kind == "store-cut":
                inc = self.live[machine]
                inc.link.cut = True
                self.history.fault("store-cut", self.now(), host=inc.number, seconds=lasts)
                await trio.sleep(lasts)
                inc.link.cut = False
                self.back("the store reached again")
            else:
                seconds = rng.uniform(0.0, ttl)
                self.cluster.fail_over(seconds)
                self.history.fault("store-failover", self.now(), seconds=seconds)
                await trio.sleep(seconds)
                self.back("the store failed over")

    def back(self, why: str) -> None:
        """The cluster serves again after a disruption: recorded as a restart, the moment
        from which the alarm checker gives due alarms their second (a host's restart, to it)."""
        self.history.fault("restart", self.now(), why=why)

    def heal(self) -> None:
        """No more faults: links heal, paused hosts resume, the store answers."""
        super().heal()
        self._healed = True
        self.lost_replies = self.drops = 0.0
        self.net.drop = 0.0
        self.net.heal()
        for inc in self.live.values():
            inc.link.cut = False
            inc.link.lost_replies = inc.link.lost_requests = 0.0
            self._resume(inc)
        self.back("healed")

    # -- reaching the app -------------------------------------------------------------------
    async def wait_up(self) -> Incarnation:
        """The host an operation enters by: the one ``invoke`` chose, or a live one drawn from
        the seed (waiting for one if none runs). After ``heal``, first until every partition
        has a running owner (liveness)."""
        chosen = _entry.get()
        if chosen is not None and chosen.alive:
            return chosen
        if self._healed and not self._settled:
            await self._until_owned()
        while True:
            running = [inc for _, inc in sorted(self.live.items()) if inc.resumed is None]
            if running:
                return self._pick.choice(running)
            await self._up.wait()
            await trio.sleep(0.01)

    async def _until_owned(self) -> None:
        """Until every partition has a running owner, and the owners stayed the same for a
        whole lease (a host the faults left behind gives its partitions up, or has them
        taken, within one)."""
        self._settled = True
        started = self.now()
        with trio.move_on_after(OWNED_WITHIN):
            steady: tuple[float, dict[int, tuple[str | None, int]]] | None = None
            while True:
                running = {inc.name for inc in self.live.values() if inc.resumed is None}
                owners = {p: (row.owner, row.epoch) for p, row in self.cluster.leases.items()}
                owned = all(
                    self.cluster.live(row) and row.owner in running
                    for row in self.cluster.leases.values()
                )
                if not owned or steady is None or steady[1] != owners:
                    steady = (self.now(), owners) if owned else None
                elif self.now() - steady[0] >= self.lease.ttl:
                    self.history.observe("cluster.owned", self.now(), ok=True)
                    return
                await trio.sleep(0.05)
        self.history.observe("cluster.owned", self.now(), ok=False, waited=self.now() - started)

    async def invoke(
        self,
        process: str,
        kind: str,
        args: dict[str, Any],
        action: Callable[[], Awaitable[Any]],
        *,
        classify: Callable[[Any], tuple[Status, Any]] | None = None,
        timeout: float = 120.0,
    ) -> Op:
        inc = await self.wait_up()
        assert isinstance(inc, ClusterIncarnation)
        token = _entry.set(inc)
        try:
            return await super().invoke(
                process, kind, args, action, classify=classify, timeout=timeout
            )
        finally:
            _entry.reset(token)

    def excused(self, exc: BaseException) -> bool:
        """Before ``heal``, a 503 or a timeout is what a failover looks like to a client: its
        outcome is unknown, not an error of the host."""
        return not self._healed and isinstance(exc, Overloaded | CallTimeout)

    def describe(self, exc: BaseException) -> str:
        text = super().describe(exc)
        return text if self._root is None else text.replace(str(self._root), "<data>")

    async def rpc_via(
        self, machine: int, address: str, method: str, timeout: float | None = 30.0, **args: Any
    ) -> Any:
        """``rpc`` entering the cluster by the host of ``machine``."""
        token = _entry.set(self.live[machine])
        try:
            return await self.rpc(address, method, timeout, **args)
        finally:
            _entry.reset(token)

    async def _through(self, call: Callable[[Host], Awaitable[T]]) -> T:
        inc = await self.wait_up()
        assert isinstance(inc, ClusterIncarnation)
        await inc.unpaused()
        token = _running_on.set(inc)
        try:
            result = await call(inc.host)
        finally:
            _running_on.reset(token)
        await inc.unpaused()  # a paused host lets no reply out
        return result

    async def rpc(
        self, address: str, method: str, timeout: float | None = 30.0, **args: Any
    ) -> Any:
        """Call ``@rpc method`` of ``address`` as ``sim-world/world``, through a host."""
        return await self._through(
            lambda host: host.call_rpc(
                WORLD_CALLER, (WORLD_CALLER,), address, method, args, timeout
            )
        )

    async def call_as(
        self,
        caller: str,
        address: str,
        method: str,
        path: str,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
        timeout: float | None = 30.0,
    ) -> Response:
        return await self._through(
            lambda host: host.call_as(caller, address, method, path, body, headers, timeout)
        )

    def handed_over(self, partition: int, epoch: int) -> None:
        """The owner of ``partition`` under ``epoch`` finished handing it over and released
        it: its actors' files are all in the store."""
        self._handed.add((partition, epoch))

    def was_handed_over(self, partition: int, epoch: int) -> bool:
        return (partition, epoch) in self._handed

    def actors_in(self, partitions: set[int]) -> list[str]:
        """The files (``actors/<class>/<name>``) of every actor any host incarnation ever
        opened whose partition is in ``partitions``."""
        found = set()
        for inc in self._all:
            for class_name, name in inc.storage.files.actors():
                address = f"{class_name}/{name}"
                if partition_of(address, self.cluster.partitions) in partitions:
                    found.add(f"actors/{address}")
        return sorted(found)

    # -- checking ---------------------------------------------------------------------------
    def reply_leaves(self, inc: ClusterIncarnation, address: str, what: str = "reply") -> None:
        """The reply of an event of ``address`` (or a call it makes: ``what="call"``) leaves
        ``inc``'s router: the store must say that ``inc`` owns its partition under a live
        lease, and ``inc``'s own clock too."""
        self.replies += 1
        partition = partition_of(address, self.cluster.partitions)
        row = self.cluster.leases[partition]
        owner_ok = row.owner == inc.name and self.cluster.live(row)
        own_clock_ok = inc.storage.keeper.lease_for(partition) is not None
        if not (owner_ok and own_clock_ok and inc.alive):
            self.history.observe(
                "cluster.stale-reply",
                self.now(),
                what=what,
                host=inc.number,
                address=address,
                owner=row.owner,
                epoch=row.epoch,
                expired=not self.cluster.live(row),
                own_clock_ok=own_clock_ok,
                alive=inc.alive,
            )

    def trace_hash(self) -> str:
        """SHA-256 over the history, the scheduler's steps and everything the store holds."""
        h = hashlib.sha256()
        h.update(self.history.digest().encode())
        h.update(f"steps={self.steps.steps} crashes={self.crashes}".encode())
        c = self.cluster
        for address in sorted(c.frames):
            for seq, (partition, epoch, data) in sorted(c.frames[address].items()):
                h.update(f"{address}/{seq}/{partition}/{epoch}".encode())
                h.update(hashlib.sha256(data).digest())
        for address in sorted(c.images):
            partition, epoch, seq, image = c.images[address]
            h.update(f"{address}/{partition}/{epoch}/{seq}".encode())
            h.update(hashlib.sha256(image).digest())
        h.update(repr(sorted(c.alarms.items())).encode())
        h.update(repr([(p, r.owner, r.epoch) for p, r in sorted(c.leases.items())]).encode())
        return h.hexdigest()


def _only_store_errors(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return all(_only_store_errors(e) for e in exc.exceptions)
    return isinstance(exc, StoreError)
