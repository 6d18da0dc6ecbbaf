"""The actor host: opens its storage, routes events to activations, runs them one at a time.

Every active actor has an ``Activation`` (activation.py) in the table (activations.py) and
one worker task in the host's nursery that runs its events one after another. A caller (an
HTTP request task, or another actor's worker) appends an event and parks until the worker
hands back the reply (handoff.py). The alarm scheduler (alarms.py) fires alarms as events of
the same kind. See docs/decisions/0001-event-model.md and 0014-layout.md.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncIterator, Awaitable, Coroutine, Mapping
from typing import Any

import outcome
import structlog
import trio
from trio.lowlevel import current_task

from .. import codec
from ..actor import Actor
from ..address import check_actor_name, split_address
from ..app import ActorClass, App
from ..calls import decode_reply
from ..errors import (
    BadRequest,
    Forbidden,
    HostClosed,
    Overloaded,
    Quarantined,
    ReentryError,
    RemoteError,
)
from ..http import (
    CALLER_HEADER,
    Headers,
    Request,
    Response,
    call_headers,
    error_response,
    parse_query,
)
from .activation import Activation, reset_current_actor, set_current_actor
from .activations import Activations
from .alarms import AlarmIndex, AlarmScheduler, LocalAlarmIndex
from .budget import ByteBudget
from .clock import Clock, WallClockGuard
from .failures import Failures, quarantine_message
from .faults import FaultHooks
from .handoff import STOP, CallTimeouts, Event, check_timeout, park, wake
from .hostdb import HostDb, open_host_db
from .intake import creation_refused, event_for
from .rebuild import rebuild_if_needed
from .registry import Quarantine, Registrar, Registry
from .router import LocalRouter, Router
from .storage import Database, StorageBackend, is_damage, out_of_descriptors

log = structlog.get_logger("actorkeep")

_RESULT_HEADERS = {  # shared: Headers are read-only
    "msgpack": Headers({"content-type": codec.MSGPACK}),
    "json": Headers({"content-type": codec.JSON}),
}
#: Inline calls (decision 0001) run without a scheduler pass; one in this many yields anyway.
INLINE_YIELD_EVERY = 32

__all__ = ["CALLER_HEADER", "Host"]


class Host:
    """Runs the actors of an ``App`` on one trio thread. Use ``async with host.open():``.

    ``alarm_scheduler`` is the class of the alarm scheduler: a subclass of
    ``AlarmScheduler`` only for the simulator's planted bugs.
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
        self.faults = faults
        #: Show outside clients the exception of a failed event (never in production).
        self.debug = debug
        self.classes = app.classes
        self._internal = {c for c, a in app.classes.items() if a.access == "internal"}
        for class_name, rule in (access or {}).items():
            if class_name not in app.classes:
                raise ValueError(f"--access names unknown actor class {class_name!r}")
            if rule not in ("internal", "public"):
                raise ValueError(f"access for {class_name!r} must be 'internal' or 'public'")
            (self._internal.add if rule == "internal" else self._internal.discard)(class_name)
        self.router: Router = LocalRouter(self)
        self.activations = Activations(idle_timeout, max_active, self._start_worker)
        self._scheduler_class = alarm_scheduler
        self._nursery: trio.Nursery | None = None
        self._closing = False
        self._host_db: HostDb | None = None
        self._alarms: AlarmScheduler | None = None
        self._registry: Registry | None = None
        self._registrar: Registrar | None = None
        self._quarantine: Quarantine | None = None
        self._failures = Failures(self.rng, debug, self._take_out, self._saved)
        self._timeouts = CallTimeouts()
        self._inline_budget = INLINE_YIELD_EVERY

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
            index = LocalAlarmIndex(host_db)
            self._registry = registry = Registry(host_db)
            rebuild_if_needed(
                self.storage, host_db, index, registry, self.clock.now(), set_aside is not None
            )
            if self.clock.follows_wall:
                guard.not_before_last_run()
            await host_db.sync()
            self._quarantine = quarantine = Quarantine(registry, self.clock.now)
            self._failures.quarantine_record = quarantine
            self._registrar = Registrar(registry, self.clock.now, self._sync_host_db, self._spawn)
            self._alarms = self._scheduler_class(
                index, self.clock, self, self._fire_alarm, quarantine, self.buggify
            )
        except BaseException:
            host_db.close()
            self.storage.close()
            raise
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._alarms.start_soon = nursery.start_soon
                nursery.start_soon(self._alarms.loop)
                nursery.start_soon(self.activations.evictor_loop)
                nursery.start_soon(self._timeouts.watch)
                if self.clock.follows_wall:
                    nursery.start_soon(guard.watch)
                try:
                    yield self
                finally:
                    self._closing = True
                    nursery.cancel_scope.cancel()
        finally:
            self._closing = True
            for act in self.activations:
                self._retire(act)
            if self.clock.follows_wall:
                guard.record()
            host_db.close()
            self.storage.close()

    # -- entry points ---------------------------------------------------------------------
    def refusal(self, actor_class: ActorClass, caller: str | None) -> Response | None:
        """The 403 for a caller this class refuses, before any actor is created."""
        name = actor_class.name
        if caller is None:
            if name in self._internal:
                return error_response(403, "Forbidden", f"actor class {name!r} is internal")
            if actor_class.cls.callers_only or actor_class.allow is not None:
                return error_response(
                    403, "Forbidden", f"actor class {name!r} answers only other actors"
                )
        elif actor_class.allow is not None and caller.partition("/")[0] not in actor_class.allow:
            refused = f"actor class {name!r} does not answer {caller!r}"
            return error_response(403, "Forbidden", refused)
        return None

    async def call(
        self,
        caller: str,
        chain: tuple[str, ...],
        address: str,
        method: str,
        path: str,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
        timeout: float | None = 30.0,
    ) -> Response:
        """An HTTP-shaped call from actor ``caller`` (whose chain of waiting callers is
        ``chain``). ``ReentryError`` at once if ``address`` is in the chain."""
        class_name, name = split_address(address)
        _check_reentry(address, chain)
        if not isinstance(body, bytes | bytearray):
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
        return await self.router.deliver(class_name, name, request, chain, timeout)

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
        refused = self.refusal(actor_class, request.caller)
        if refused is not None:
            return refused
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
            return await self._dispatch(address, actor_class, name, ev, timeout)
        # From outside: the body and what it decodes to stay in memory until the reply.
        cost = len(request.body) + decoded
        if cost > self.inflight.limit:
            return error_response(
                413, "PayloadTooLarge", "the request needs more memory than this host allows"
            )
        if not self.inflight.take(cost):
            raise Overloaded("too many request bytes in flight on this host")
        try:
            return await self._dispatch(address, actor_class, name, ev, timeout)
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
        return self.router.call_rpc(caller, chain, address, method, args, timeout)

    async def call_rpc_here(
        self,
        caller: str,
        chain: tuple[str, ...],
        address: str,
        method: str,
        args: dict[str, Any],
        timeout: float | None,
    ) -> Any:
        """``call_rpc`` on this host. The same rules as ``call`` to ``POST /_rpc/<method>``
        with a msgpack body, without building an HTTP-shaped request: rpc handlers only see
        their arguments."""
        check_timeout(timeout)
        act = self.activations.get(address)
        if act is not None:
            actor_class, name = act.actor_class, act.name
        else:
            class_name, name = split_address(address)
            found = self.classes.get(class_name)
            if found is None:
                raise RemoteError(404, "NotFound", f"no actor class {class_name!r}")
            actor_class = found
        _check_reentry(address, chain)
        if actor_class.allow is not None and caller.partition("/")[0] not in actor_class.allow:
            raise Forbidden(f"actor class {actor_class.name!r} does not answer {caller!r}")
        rpc = actor_class.routes.rpcs.get(method)
        if rpc is None:
            no_route = f"{actor_class.name} has no route POST /_rpc/{method}"
            raise RemoteError(404, "NotFound", no_route)
        copied = codec.unpack(codec.pack(args))  # the callee gets its own copy, as over HTTP
        try:
            rpc.check_args(copied)
        except ValueError as exc:
            raise BadRequest(400, "BadRequest", str(exc)) from None
        ev = Event("rpc", rpc.fn, None, chain, None, copied, "msgpack", rpc.inline)
        return decode_reply(await self._dispatch(address, actor_class, name, ev, timeout))

    # -- dispatch -------------------------------------------------------------------------
    async def _dispatch(
        self,
        address: str,
        actor_class: ActorClass,
        name: str,
        ev: Event,
        timeout: float | None,
        hooked: bool = False,
    ) -> Response:
        if self.faults is not None and ev.chain and not hooked:
            # Under the simulator: the call may be delayed, refused or lose its reply, and an
            # inline-safe handler may run on the worker instead.
            await self.faults.before_call(ev.chain, address)
            if ev.inline and self.faults.buggify("host.no-inline"):
                ev.inline = False
            resp = await self._dispatch(address, actor_class, name, ev, timeout, hooked=True)
            self.faults.after_call(ev.chain, address)
            return resp
        if ev.inline:
            # Every call can be cancelled here; and the host yields to the scheduler at least
            # once per INLINE_YIELD_EVERY inline calls, so a loop of them cannot starve others.
            await trio.lowlevel.checkpoint_if_cancelled()
            self._inline_budget -= 1
            if self._inline_budget <= 0:
                self._inline_budget = INLINE_YIELD_EVERY
                await trio.lowlevel.cancel_shielded_checkpoint()
            act = self.activations.get(address)
            if act is not None and act.parked and act.instance is not None:
                return await self._run_inline(act, ev)
        self._enqueue(self._activation(address, actor_class, name), ev, limit=True)
        return await self._timeouts.wait_reply(ev, timeout)

    async def _run_inline(self, act: Activation, ev: Event) -> Response:
        """Run a handler that cannot suspend in the caller's task, while its actor is idle.

        Its worker is parked with nothing queued, and the handler has no yield point, so it
        runs from start to end with nothing else running: one event at a time and FIFO hold,
        and no timeout or cancellation can reach it. It is what the worker would do, without
        the two task switches (decision 0001).
        """
        inst = act.instance
        assert inst is not None
        act.current = ev
        damaged = False
        token = set_current_actor(inst)
        try:
            resp = self._response(act, ev, await _handler_call(inst, ev))
        except Exception as exc:
            resp = self._failures.failed(act, exc, ev.from_outside)
            damaged = is_damage(exc)
        finally:
            reset_current_actor(token)
            self._after_event(act)
        if damaged:
            raise Quarantined(quarantine_message(act.address))
        return resp

    def _activation(self, address: str, actor_class: ActorClass, name: str) -> Activation:
        if self._closing or self._nursery is None:
            raise HostClosed("the host is closed")
        act = self.activations.get(address)
        if act is not None:
            self.activations.touch(act)
            return act
        if self._quarantine is not None and address in self._quarantine:
            raise Quarantined(quarantine_message(address))
        check_actor_name(name)  # the one place a file can come into being: never trust callers
        act = Activation(self, actor_class, address, name)
        self.activations.add(act)
        return act

    def _start_worker(self, act: Activation) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(self._worker, act, name=f"actor {act.address}")

    def _enqueue(self, act: Activation, ev: Event, limit: bool) -> None:
        if limit and len(act.inbox) >= self.max_pending:
            raise Overloaded(f"{act.address} has {len(act.inbox)} waiting events")
        act.inbox.append(ev)
        if act.parked:
            act.parked = False
            assert act.task is not None
            wake(act.task)

    async def _worker(self, act: Activation) -> None:
        act.task = current_task()
        inbox = act.inbox
        try:
            while True:
                if not inbox:
                    if act.closed:
                        return  # evicted while its last event ran
                    act.parked = True
                    if await park() is STOP:
                        return
                    continue
                ev = inbox.popleft()
                if ev.abandoned:  # its caller is gone: skip it, but it was activity
                    self.activations.used(act)
                    continue
                act.current = ev
                try:
                    if ev.kind == "alarm":
                        await self.alarms.run(act)
                    else:
                        self._timeouts.reply(ev, await self._run(act, ev))
                except BaseException:  # cancelled: the host is closing; answer the caller
                    closed = HostClosed(f"{act.address} was shut down")
                    self._timeouts.reply(ev, outcome.Error(closed))
                    raise
                finally:
                    self._after_event(act)
        finally:
            self._retire(act)

    def _after_event(self, act: Activation) -> None:
        act.current = None
        self.activations.used(act)
        if not act.closed and not act.inbox and self.buggify("host.evict-after-event"):
            self.activations.evict(act)

    def _retire(self, act: Activation) -> None:
        """Forget an activation whose worker has ended; fail the events it will never run."""
        self.activations.forget(act)
        while act.inbox:  # an outcome is unwrapped once: one each
            closed = HostClosed(f"{act.address} was shut down")
            self._timeouts.reply(act.inbox.popleft(), outcome.Error(closed))
        act.close()

    async def open_instance(self, act: Activation) -> Actor:
        """The actor's instance: its database opened and ``setup()`` run if need be."""
        inst = act.instance
        if inst is None:
            if act.db is None:
                act.open_db()
            inst = act.new_instance()
            await inst.setup()
        return inst

    async def _run(self, act: Activation, ev: Event) -> outcome.Outcome[Response]:
        try:
            inst = await self.open_instance(act)
        except Exception as exc:
            if out_of_descriptors(exc):
                # Nothing of the event ran: the caller may try again, as for any overload.
                self._failures.out_of_descriptors(act.address)
                with contextlib.suppress(Exception):
                    act.rollback()
                act.discard_instance()
                busy = Overloaded("the host is out of file descriptors for now", retry_after=1.0)
                return outcome.Error(busy)
            return self._event_failed(act, ev, exc)
        try:
            return outcome.Value(self._response(act, ev, await _handler_call(inst, ev)))
        except Exception as exc:
            return self._event_failed(act, ev, exc)

    @staticmethod
    def _response(act: Activation, ev: Event, result: Any) -> Response:
        """The reply to an event whose handler returned ``result``."""
        if act.db is not None and act.db.conn.in_transaction:
            raise RuntimeError(
                "the event ended with a transaction still open: commit it before returning "
                "(or use `with self.sql.transaction():`)"
            )
        if ev.encoding is not None:  # @rpc: encode the return value as the request was
            return Response(200, _RESULT_HEADERS[ev.encoding], codec.encode(result, ev.encoding))
        if not isinstance(result, Response):
            assert ev.fn is not None
            raise TypeError(
                f"route handler {ev.fn.__qualname__} returned {type(result).__name__}, "
                "not ak.Response"
            )
        return result

    # -- failures (failures.py) ----------------------------------------------------------
    def _event_failed(
        self, act: Activation, ev: Event, exc: Exception
    ) -> outcome.Outcome[Response]:
        """The reply of an event that raised: a 500, or ``Quarantined`` if its storage is
        damaged (raised to the caller, as for every later event of the actor)."""
        resp = self._failures.failed(act, exc, ev.from_outside)
        if is_damage(exc):
            return outcome.Error(Quarantined(quarantine_message(act.address)))
        return outcome.Value(resp)

    def fail(self, act: Activation, exc: Exception) -> None:
        """A failed alarm event (alarms.AlarmRunner): as any failed event, nobody to answer."""
        self._failures.failed(act, exc)

    def _take_out(self, act: Activation, message: str) -> None:
        """A quarantined actor leaves memory; what waits for it is refused."""
        self.activations.evict(act)
        while act.inbox:  # an outcome is unwrapped once: one each
            self._timeouts.reply(act.inbox.popleft(), outcome.Error(Quarantined(message)))

    def _saved(self) -> None:
        self._spawn(self._sync_host_db)

    async def _sync_host_db(self) -> None:
        assert self._host_db is not None
        try:
            await self._host_db.sync()
        except Exception as exc:
            log.error("host database sync failed", file=self._host_db.where, error=repr(exc))

    def register_soon(self, address: str, db: Database) -> None:
        """Register a newly opened actor once its database is durable (registry.py)."""
        if self._registrar is not None:
            self._registrar.soon(address, db)

    def _spawn(self, fn: Any, *args: Any) -> None:
        if self._nursery is not None and not self._closing:
            self._nursery.start_soon(fn, *args)

    # -- alarms (alarms.py) ---------------------------------------------------------------
    def _fire_alarm(self, address: str, early: bool) -> None:
        """Hand a due alarm to its actor (the scheduler marked it running)."""
        try:
            class_name, name = split_address(address)
        except ValueError:
            class_name = name = ""
        actor_class = self.classes.get(class_name)
        if actor_class is None or not actor_class.has_alarm:
            # Keep the entry (and it stays marked running): the class may come back with the
            # next deploy of the app.
            log.warning("alarm for an actor class this app does not serve", address=address)
            return
        delay = 0.0 if self.faults is None or early else self.faults.alarm_delay(address)
        if delay > 0:
            self._spawn(self._fire_late, address, actor_class, name, delay)
            return
        self._enqueue(self._activation(address, actor_class, name), Event.alarm(), limit=False)

    async def _fire_late(
        self, address: str, actor_class: ActorClass, name: str, delay: float
    ) -> None:
        await trio.sleep(delay)
        if self._closing:
            return  # the alarm stays in the index: the next host fires it
        act = self._activation(address, actor_class, name)
        self._enqueue(act, Event.alarm(), limit=False)


def _handler_call(inst: Actor, ev: Event) -> Awaitable[Any]:
    """The handler's coroutine for ``ev``: an ``@rpc`` method takes its arguments, a route
    the request and its path parameters."""
    assert ev.fn is not None
    if ev.args is not None:
        return ev.fn(inst, **ev.args)  # type: ignore[no-any-return]
    return ev.fn(inst, ev.request, **(ev.params or {}))  # type: ignore[no-any-return]


def _check_reentry(address: str, chain: tuple[str, ...]) -> None:
    if address in chain:
        raise ReentryError(f"{address} is already in the call chain {' -> '.join(chain)}")
