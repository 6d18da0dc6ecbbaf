"""The actor host: opens its storage, takes requests and calls, runs events one at a time.

``Host.open`` checks (and if need be rebuilds) the host database, then starts the alarm
scheduler (alarms.py), the evictor and the dispatcher (dispatch.py: one worker task per active
actor). Every request and call comes in here (``deliver_here``, ``call_rpc_here``, by way of
the router), is refused or turned into an event before any actor is created (access.py,
intake.py), and goes to the dispatcher. See docs/decisions/0001-event-model.md and
0014-layout.md.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from typing import Any

import structlog
import trio

from ..actor import Actor
from ..address import split_address
from ..app import App
from ..errors import (
    HostClosed,
    Overloaded,
)
from ..http import (
    CALLER_HEADER,
    Request,
    Response,
    call_headers,
    error_response,
    parse_query,
)
from ..routing import Operation
from .access import Access, check_reentry
from .activation import Activation
from .alarms import AlarmIndex, AlarmScheduler, LocalAlarmIndex
from .budget import ByteBudget
from .burst import BurstLog
from .clock import Clock, WallClockGuard
from .direct import DirectCalls
from .dispatch import Dispatcher
from .failures import Failures
from .faults import FaultHooks
from .gate import Gate
from .handoff import CallTimeouts, check_timeout
from .hostdb import HostDb, open_host_db
from .intake import creation_refused, event_for
from .migrate import Migrator
from .rebuild import rebuild_if_needed
from .registry import Quarantine, Registrar, Registry
from .removal import Remover
from .router import LocalRouter, Router, Target
from .sockets import GOING_AWAY, SocketLimits, Sockets
from .stats import HostStats
from .storage import Database, StorageBackend

log = structlog.get_logger("actorkeep")


__all__ = ["CALLER_HEADER", "Host"]

#: On a clean close, the host waits up to this long for the syncs that hold replies.
DRAIN_SECONDS = 10.0


class Host:
    """Runs the actors of an ``App`` on one trio thread. Use ``async with host.open():``.

    ``alarm_scheduler`` is the class of the alarm scheduler, ``gate`` that of the actors'
    output gates, ``remover`` that of ``remove()`` and ``migrator`` that of what applies
    migrations at activation: subclasses only for the simulator's planted bugs.
    ``router(host)`` makes the router every call and outside request goes through
    (``LocalRouter``: this host serves every address; the cluster's checks its leases and
    forwards the rest), and ``alarm_index(host_db)`` the alarm index (``LocalAlarmIndex``,
    in the host database; the cluster's is in PostgreSQL).
    """

    def __init__(
        self,
        app: App,
        storage: StorageBackend,
        *,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        idle_timeout: float = 30.0,
        max_active: int = 10_000,
        max_pending: int = 1_000,
        max_body: int = 1 << 20,
        max_inflight_bytes: int = 64 << 20,
        access: Mapping[str, str] | None = None,
        faults: FaultHooks | None = None,
        debug: bool = False,
        alarm_scheduler: type[AlarmScheduler] = AlarmScheduler,
        gate: type[Gate] = Gate,
        router: Callable[[Target], Router] = LocalRouter,
        alarm_index: Callable[[HostDb], AlarmIndex] = LocalAlarmIndex,
        remover: type[Remover] = Remover,
        migrator: type[Migrator] = Migrator,
        socket_limits: SocketLimits | None = None,
    ) -> None:
        if idle_timeout <= 0 or max_active < 1 or max_pending < 1 or max_body < 0:
            raise ValueError("idle_timeout, max_active, max_pending and max_body must be positive")
        if max_inflight_bytes < max_body:
            raise ValueError("max_inflight_bytes must be at least max_body")
        self.app = app
        self.storage = storage
        self.clock = clock if clock is not None else Clock()
        self.rng = rng if rng is not None else random.Random()
        self.idle_timeout = idle_timeout
        self.max_active = max_active
        self.max_pending = max_pending
        self.max_body = max_body
        #: Bytes of outside requests in flight: bodies and what they decode to.
        self.inflight = ByteBudget(max_inflight_bytes)
        self.inflight.burst = BurstLog(
            "refusing requests: the bytes in flight are at --max-inflight", trio.current_time
        )
        self.faults = faults
        #: Show outside clients the exception of a failed event (never in production).
        self.debug = debug
        self.classes = app.classes
        self.access = Access(app.classes, access)
        #: The open WebSockets of the host's actors (sockets.py).
        self.sockets = Sockets(app.classes, socket_limits)
        self._scheduler_class = alarm_scheduler
        self._index_class = alarm_index
        self._remover_class = remover
        self._nursery: trio.Nursery | None = None
        self._closing = False
        self._host_db: HostDb | None = None
        self._alarms: AlarmScheduler | None = None
        self._registry: Registry | None = None
        self._registrar: Registrar | None = None
        self._quarantine: Quarantine | None = None
        self._remover: Remover | None = None
        #: What the host counts as it runs (read by the metrics endpoint).
        self.stats = HostStats()
        self._failures = Failures(self.rng, debug, self._take_out, self._saved)
        self._timeouts = CallTimeouts(self.stats)
        self.dispatcher = Dispatcher(
            self,
            app.classes,
            idle_timeout,
            max_active,
            self._timeouts,
            self._failures,
            faults,
            max_pending,
            gate,
            self.stats,
            self.sockets,
            migrator(),
        )
        self.activations = self.dispatcher.activations
        direct = DirectCalls(
            app.classes, self.activations, self.access, self.dispatcher, self.stats
        )
        #: ``call_rpc`` and ``call_op`` on this host (direct.py; the router's local way).
        self.call_rpc_here = direct.rpc
        self.call_op_here = direct.op
        #: Where every call and outside request goes (``router(host)``; a cluster's checks
        #: which host serves the address).
        self.router: Router = router(self)
        self.sockets.serves = self.router.serves

    def error_id(self) -> str:
        """A fresh id that ties an error an outside client sees to the host's log line."""
        return self._failures.error_id()

    def buggify(self, site: str) -> bool:
        """Whether the simulator fires the fault at ``site`` now; always False outside it."""
        return self.faults is not None and self.faults.buggify(site)

    # -- lifecycle ------------------------------------------------------------------------
    @property
    def alarms(self) -> AlarmScheduler:
        if self._alarms is None:
            raise HostClosed("the host is not open")
        return self._alarms

    @property
    def alarm_index(self) -> AlarmIndex:
        return self.alarms.index

    @property
    def registry(self) -> Registry:
        if self._registry is None:
            raise HostClosed("the host is not open")
        return self._registry

    @property
    def quarantined(self) -> dict[str, str]:
        """``address -> reason`` of the actors that take no events (their storage is damaged)."""
        return dict(self._quarantine.reasons) if self._quarantine is not None else {}

    @property
    def active_count(self) -> int:
        """How many actors are in memory."""
        return len(self.activations)

    @contextlib.asynccontextmanager
    async def open(self) -> AsyncIterator[Host]:
        """Open the host: check and (if need be) rebuild its database, start the alarm
        scheduler and the evictor; close everything on exit."""
        if self._nursery is not None or self._closing:
            raise RuntimeError("a Host can be opened once; make a new one to restart")
        host_db, set_aside = open_host_db(self.storage)
        self._host_db = host_db
        guard = WallClockGuard(
            self.clock,
            load=lambda: host_db.get_meta("clock_high_water"),
            save=lambda t: host_db.set_meta("clock_high_water", t),
            stepped=lambda: self.alarms.poke(self.clock.now()),
        )
        try:
            index = self._index_class(host_db)
            self._registry = registry = Registry(host_db)
            rebuilt = rebuild_if_needed(
                self.storage, host_db, index, registry, self.clock.now(), set_aside is not None
            )
            if rebuilt is not None:
                # The registry names these actors from now on: their files must be durable
                # before it is (a registered actor whose file is gone is damage).
                await self.storage.sync_all()
            if self.clock.follows_wall:
                guard.not_before_last_run()
            await host_db.sync()
            self._quarantine = quarantine = Quarantine(registry, self.clock.now)
            self._failures.quarantine_record = quarantine
            self._registrar = Registrar(registry, self.clock.now, self._sync_host_db, self._spawn)
            self._alarms = self._scheduler_class(
                index, self.clock, self, self.dispatcher.fire_alarm, quarantine, self.buggify
            )
            self._alarms.stats = self.stats
            self._remover = self._remover_class(
                self.classes,
                self.router.serves,
                self.dispatcher,
                self._alarms,
                registry,
                self._registrar,
                quarantine,
                self.storage,
                host_db.sync,
            )
        except BaseException:
            host_db.close()
            self.storage.close()
            raise
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self.dispatcher.start(nursery, quarantine, self._alarms)
                self._alarms.start_soon = nursery.start_soon
                nursery.start_soon(self._alarms.loop)
                nursery.start_soon(self.activations.evictor_loop)
                nursery.start_soon(self._timeouts.watch)
                if self.clock.follows_wall:
                    nursery.start_soon(guard.watch)
                try:
                    yield self
                    with trio.CancelScope(shield=True) as drain:
                        drain.deadline = trio.current_time() + DRAIN_SECONDS
                        await self.dispatcher.drain_gates()
                finally:
                    self._closing = self.dispatcher.closing = True
                    nursery.cancel_scope.cancel()
        finally:
            self._closing = self.dispatcher.closing = True
            self.sockets.close_all(GOING_AWAY, "the host is shutting down")
            for act in self.activations:
                self.dispatcher.retire(act)
            if self.clock.follows_wall:
                guard.record()
            host_db.close()
            self.storage.close()

    # -- entry points ---------------------------------------------------------------------
    def call(
        self,
        caller: str,
        chain: tuple[str, ...],
        address: str,
        method: str,
        path: str,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
        timeout: float | None = 30.0,
    ) -> Coroutine[Any, Any, Response]:
        """An HTTP-shaped call from actor ``caller`` (whose chain of waiting callers is
        ``chain``): the router's coroutine for it. A bad address, path or body, and
        ``ReentryError`` if ``address`` is in the chain, are raised at once."""
        class_name, name = split_address(address)
        self.stats.calls += 1
        if address in chain:
            self.stats.reentry_refused += 1
            check_reentry(address, chain)
        if type(body) is not bytes and not isinstance(body, bytes | bytearray):
            raise TypeError("body must be bytes")
        query: dict[str, str] = {}
        if "?" in path:
            path, _, query_string = path.partition("?")
            query = parse_query(query_string)
        if not path.startswith("/"):
            raise ValueError(f"path must start with '/': {path!r}")
        if type(body) is not bytes:
            body = bytes(body)
        request = Request(method.upper(), path, query, call_headers(caller, headers), body, caller)
        return self.router.deliver(class_name, name, request, chain, timeout)

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
        """A call from the actor ``caller`` (which need not exist) to ``address``, with no
        chain behind it: for tests, the simulator and tools."""
        split_address(caller)
        return await self.call(caller, (caller,), address, method, path, body, headers, timeout)

    def deliver(
        self,
        class_name: str,
        name: str,
        request: Request,
        chain: tuple[str, ...],
        timeout: float | None,
    ) -> Coroutine[Any, Any, Response]:
        """Take a request to the actor ``class_name/name``, wherever it lives; its reply."""
        return self.router.deliver(class_name, name, request, chain, timeout)

    async def deliver_here(
        self,
        class_name: str,
        name: str,
        request: Request,
        chain: tuple[str, ...],
        timeout: float | None,
    ) -> Response:
        """Run a request on the actor ``class_name/name`` of this host and wait for its reply.

        Everything that refuses a request (unknown class or route, access, who may create the
        actor, a body that does not decode) happens here, before the actor is created.
        ``max_body`` is the front's limit on outside requests; calls between actors carry what
        the callee itself accepts.
        """
        check_timeout(timeout)
        actor_class = self.classes.get(class_name)
        if actor_class is None:
            return error_response(404, "NotFound", f"no actor class {class_name!r}")
        if request.caller is None or actor_class.allow is not None:  # else: no rule applies
            forbidden = self.access.refusal(actor_class, request.caller)
            if forbidden is not None:
                return error_response(403, "Forbidden", forbidden)
        address = f"{class_name}/{name}"
        outside = request.caller is None
        error_reply = self._failures.error_reply
        if outside and actor_class.outside_creates is not None and address not in self.activations:
            refused = creation_refused(
                actor_class,
                address,
                name,
                # Gone from disk but registered: damage (quarantined when opened), not absence.
                lambda: self.storage.exists(class_name, name) or self.registry.has(address),
                error_reply,
            )
            if refused is not None:
                return refused
        ev, decoded = event_for(actor_class, address, request, chain, error_reply)
        if isinstance(ev, Response):
            return ev
        if not outside:
            return await self.dispatcher.dispatch(address, actor_class, name, ev, timeout)
        # From outside: the body and what it decodes to stay in memory until the reply.
        cost = len(request.body) + decoded
        if cost > self.inflight.limit:
            return error_response(
                413, "PayloadTooLarge", "the request needs more memory than this host allows"
            )
        if not self.inflight.take(cost):
            raise Overloaded("too many request bytes in flight on this host")
        try:
            return await self.dispatcher.dispatch(address, actor_class, name, ev, timeout)
        finally:
            self.inflight.give(cost)

    def call_rpc(
        self,
        caller: str,
        chain: tuple[str, ...],
        address: str,
        method: str,
        args: dict[str, Any],
        timeout: float | None,
    ) -> Coroutine[Any, Any, Any]:
        """``ref.method(**args)`` from actor ``caller``: the result, or the error it means."""
        self.stats.calls += 1
        return self.router.call_rpc(caller, chain, address, method, args, timeout)

    def call_op(
        self,
        caller: str,
        chain: tuple[str, ...],
        address: str,
        op: Operation,
        values: Mapping[str, Any],
        timeout: float | None,
    ) -> Coroutine[Any, Any, Response]:
        """A protocol operation of ``address`` (``actorkeep.wire``) from actor ``caller``, with
        ``values`` as its frame: a ``ValueReply`` or the error ``Response`` (``DirectCalls.op``;
        in a cluster an actor elsewhere answers over the wire, with its frame packed)."""
        self.stats.calls += 1
        return self.router.call_op(caller, chain, address, op, values, timeout)

    async def remove(self, address: str, known: bool = False) -> int:
        """Delete an idle actor: its alarm, its registry entry, its database (removal.py).
        How many bytes its files held here. ``known``: the caller knows it exists (a
        cluster's store says so) though this host may hold no copy. ``RemoteError`` (400,
        404, 409) when it cannot."""
        if self._remover is None:
            raise HostClosed("the host is not open")
        return await self._remover.remove(address, known)

    # -- what the activations and the alarm scheduler ask of the host ---------------------
    def evict(self, address: str) -> bool:
        """Take the actor at ``address`` out of memory if it is idle (no event running or
        waiting, no sync running or held): its database closes, and its next event opens it
        afresh. Whether it is out of memory now."""
        return self.dispatcher.evict_idle(address)

    async def open_instance(self, act: Activation) -> Actor:
        """The actor's instance: its database opened and ``setup()`` run if need be."""
        return await self.dispatcher.open_instance(act)

    def fail(self, act: Activation, exc: Exception) -> None:
        """A failed alarm event (alarms.AlarmRunner): as any failed event, nobody to answer."""
        self._failures.failed(act, exc)

    def serves(self, address: str) -> bool:
        """Whether this host may run the events of ``address`` now (alarms.AlarmRunner)."""
        return self.router.serves(address)

    def _take_out(self, act: Activation, message: str) -> None:
        self.dispatcher.take_out(act, message)

    def _saved(self) -> None:
        self._spawn(self._sync_host_db)

    async def _sync_host_db(self) -> None:
        assert self._host_db is not None
        try:
            await self._host_db.sync()
        except Exception as exc:
            log.error("host database sync failed", file=self._host_db.where, error=repr(exc))

    def register_soon(self, address: str, sync: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Register a newly opened actor once ``sync()`` made its database durable
        (registry.py)."""
        if self._registrar is not None:
            self._registrar.soon(address, sync)

    def new_gate(self, act: Activation, db: Database) -> Gate:
        """The output gate of an actor's newly opened database (gate.py)."""
        return self.dispatcher.new_gate(act, db)

    def _spawn(self, fn: Any, *args: Any) -> None:
        if self._nursery is not None and not self._closing:
            self._nursery.start_soon(fn, *args)
