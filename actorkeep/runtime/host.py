"""The actor host: activations, one event at a time per actor, calls, eviction, alarms.

Every active actor has an ``Activation``: its database, its FIFO of waiting events, its current
instance, and one worker task in the host's nursery that runs the events one after another.
A caller (an HTTP request task, or another actor's worker) appends an event and parks until the
worker hands back the reply with ``trio.lowlevel.reschedule``; a caller that times out or is
cancelled stops waiting, and the event keeps running. See docs/decisions/0001-event-model.md.
"""

from __future__ import annotations

import contextlib
import math
import random
import sqlite3
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import outcome
import structlog
import trio
from trio.lowlevel import Abort, Task, current_task, reschedule, wait_task_rescheduled

from .. import codec
from ..actor import Actor, AlarmInfo
from ..address import check_actor_name, split_address
from ..app import ActorClass, App
from ..calls import ActorsClient, decode_reply
from ..errors import (
    BadRequest,
    CallTimeout,
    Forbidden,
    HostClosed,
    Overloaded,
    Quarantined,
    ReentryError,
    RemoteError,
    StorageDamaged,
)
from ..http import Headers, Request, Response, error_response
from ..sql import Sql
from .alarms import (
    ACTOR_TABLE,
    MAX_RETRIES,
    AlarmIndex,
    AlarmState,
    retry_delay,
    storage_retry_delay,
)
from .budget import ByteBudget
from .clock import Clock
from .faults import FaultHooks
from .hostdb import HostDb, open_host_db
from .rebuild import rebuild
from .registry import Registry
from .storage import IDENTITY_TABLE, Database, StorageBackend, is_damage, out_of_descriptors

if TYPE_CHECKING:
    import sqlalchemy

log = structlog.get_logger("actorkeep")

CALLER_HEADER = "x-actorkeep-caller"
RESERVED_HEADER_PREFIX = "x-actorkeep-"
_STOP = object()
_RESULT_HEADERS = {  # shared: Headers are read-only
    "msgpack": Headers._from_lower({"content-type": codec.MSGPACK}),
    "json": Headers._from_lower({"content-type": codec.JSON}),
}
_DUE_BATCH = 256
#: Host time is compared with the wall clock this often (seconds), and acts on a difference
#: past CLOCK_BOUND (decision 0012); the latest host time is recorded every HIGH_WATER_EVERY.
CLOCK_CHECK_EVERY = 5.0
CLOCK_BOUND = 1.0
HIGH_WATER_EVERY = 60.0
#: Warnings about a wall clock behind host time repeat this often while it lasts.
CLOCK_WARN_EVERY = 600.0
#: Inline calls (decision 0001) run without a scheduler pass; one in this many yields anyway.
INLINE_YIELD_EVERY = 32

_current_actor: ContextVar[Actor] = ContextVar("actorkeep_current_actor")


def current_actor() -> Actor:
    """The actor whose event is running in this task (``RuntimeError`` outside an event)."""
    try:
        return _current_actor.get()
    except LookupError:
        raise RuntimeError("no actor event is running in this task") from None


class Event:
    """One unit of work for an actor: a request, a call, or the alarm."""

    __slots__ = (
        "abandoned",
        "args",
        "chain",
        "encoding",
        "fn",
        "inline",
        "params",
        "request",
        "timeout",
        "waiter",
    )

    def __init__(
        self,
        fn: Callable[..., Any] | None,
        request: Request | None,
        chain: tuple[str, ...],
        params: dict[str, str] | None = None,
        args: dict[str, Any] | None = None,
        encoding: codec.Encoding | None = None,
        inline: bool = False,
    ) -> None:
        self.fn = fn  # None for the alarm
        self.request = request
        self.chain = chain  # addresses whose events wait on this one, outermost first
        self.params = params
        self.args = args  # set for @rpc calls
        self.encoding = encoding
        self.inline = inline  # the handler never suspends (routing.never_suspends)
        self.waiter: Task | None = None
        self.timeout: float | None = None  # set while the waiter's timeout is registered
        self.abandoned = False


def check_timeout(timeout: float | None) -> None:
    """``ValueError`` unless ``timeout`` is None or a number of seconds >= 0."""
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout >= 0
    ):
        raise ValueError(f"timeout must be None or a number of seconds >= 0, not {timeout!r}")


def _abort_park(_: Any) -> Abort:
    return Abort.SUCCEEDED


class CallTimeouts:
    """The deadlines of every waiting caller, watched by one task.

    A cancel scope per call costs more than the rest of a call; instead each waiting event is
    kept in one ``OrderedDict`` per timeout value. Calls of one timeout value arrive in deadline
    order, so each dict is sorted by deadline and adding, removing and finding the earliest are
    O(1).
    """

    def __init__(self) -> None:
        self._by_timeout: dict[float, OrderedDict[Event, float]] = {}
        self._scope: trio.CancelScope | None = None

    def add(self, ev: Event, timeout: float) -> None:
        deadline = trio.current_time() + timeout
        pending = self._by_timeout.get(timeout)
        if pending is None:
            pending = self._by_timeout[timeout] = OrderedDict()
        pending[ev] = deadline
        ev.timeout = timeout
        scope = self._scope
        if scope is not None and deadline < scope.deadline:
            scope.deadline = deadline

    def discard(self, ev: Event) -> None:
        timeout = ev.timeout
        if timeout is not None:
            ev.timeout = None
            pending = self._by_timeout[timeout]
            del pending[ev]
            if not pending:  # callers may use many timeout values: keep only live ones
                del self._by_timeout[timeout]

    async def watch(self) -> None:
        while True:
            now = trio.current_time()
            earliest = math.inf
            for timeout, pending in list(self._by_timeout.items()):
                while pending:
                    ev, deadline = next(iter(pending.items()))
                    if deadline > now:
                        earliest = min(earliest, deadline)
                        break
                    del pending[ev]
                    ev.timeout = None
                    waiter = ev.waiter
                    if waiter is not None:
                        ev.waiter = None
                        ev.abandoned = True
                        reschedule(
                            waiter, outcome.Error(CallTimeout(f"no answer within {timeout} s"))
                        )
                if not pending:
                    del self._by_timeout[timeout]
            with trio.CancelScope(deadline=earliest) as scope:
                self._scope = scope
                await trio.sleep_forever()
            self._scope = None


class _SharedConnection:
    """The actor's sqlite3 connection as SQLAlchemy sees it: it never ends a transaction.

    SQLAlchemy calls ``rollback()`` when it first connects and ``commit()``/``rollback()`` on
    ``Connection.commit()``/``rollback()``; on the shared connection those would end a
    transaction that ``self.sql.transaction()`` opened. Transactions belong to ``self.sql``.
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def commit(self) -> None:
        pass

    def rollback(self) -> None:
        pass

    def close(self) -> None:
        pass  # the host closes the real connection


class Activation:
    """An actor in memory: database, waiting events, instance and worker task."""

    __slots__ = (
        "address",
        "alarm",
        "alarm_touched",
        "class_name",
        "closed",
        "current",
        "db",
        "host",
        "index_durable",
        "instance",
        "last_used",
        "name",
        "parked",
        "queue",
        "sa_engine",
        "spec",
        "sql",
        "task",
    )

    def __init__(self, host: Host, spec: ActorClass, address: str, name: str) -> None:
        self.host = host
        self.spec = spec
        self.address = address
        self.class_name = spec.name
        self.name = name
        self.queue: deque[Event] = deque()
        self.task: Task | None = None
        self.parked = False
        self.closed = False
        self.current: Event | None = None
        self.db: Database | None = None
        self.sql: Sql | None = None
        self.instance: Actor | None = None
        self.alarm: AlarmState | None = None
        self.alarm_touched = False
        self.index_durable = False  # this address has an index entry that power loss keeps
        self.sa_engine: sqlalchemy.Engine | None = None
        self.last_used = trio.current_time()

    # -- database -------------------------------------------------------------------------
    def open_db(self) -> Database:
        """Open the actor's database: ``StorageDamaged`` (or a damage error of SQLite's) if it
        is not what the host knows of it (see registry.py)."""
        host = self.host
        registered = host.registry.has(self.address)
        db = host.storage.open_actor(self.class_name, self.name, existing=registered)
        try:
            conn = db.conn
            if not registered:
                # The database names its actor, so the host database can be rebuilt from it.
                conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {IDENTITY_TABLE} (id INTEGER PRIMARY KEY "
                    "CHECK (id = 0), address TEXT NOT NULL, created_at REAL NOT NULL)"
                )
                conn.execute(
                    f"INSERT OR IGNORE INTO {IDENTITY_TABLE} VALUES (0, ?, ?)",
                    (self.address, host.clock.now()),
                )
            has_alarm_table = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (ACTOR_TABLE,)
            ).fetchone()
            row = None
            if has_alarm_table:
                row = conn.execute(
                    f"SELECT at, scheduled_at, retry_count FROM {ACTOR_TABLE} WHERE id = 0"
                ).fetchone()
        except BaseException:
            db.close()
            raise
        self.db = db
        self.sql = Sql(db)
        if row is not None:
            self.alarm = AlarmState(*row)
            index = host.alarm_index
            entry = index.get(self.address)
            # Heal an index write lost to a crash, but only ever move the entry earlier: the
            # row may be committed and not durable. An early entry wakes the actor, and
            # _run_alarm moves it later once the row is durable.
            if entry is None or entry > self.alarm.at:
                index.put(self.address, self.alarm.at)
                host.poke_alarms(self.alarm.at)
        if not registered:
            host._register_soon(self.address, db)
        return db

    @property
    def where(self) -> str | None:
        """Where the actor's database lives (for logs), if it is open."""
        return self.db.where if self.db is not None else None

    def sqlalchemy_connection(self) -> sqlalchemy.Connection:
        import sqlalchemy
        from sqlalchemy.pool import StaticPool

        assert self.db is not None
        if self.sa_engine is None:
            shared = _SharedConnection(self.db.conn)
            self.sa_engine = sqlalchemy.create_engine(
                "sqlite://", creator=lambda: shared, poolclass=StaticPool, pool_reset_on_return=None
            )
        return self.sa_engine.connect()

    # -- instances ------------------------------------------------------------------------
    def new_instance(self) -> Actor:
        inst = self.spec.cls()
        inst.address = self.address
        inst.class_name = self.class_name
        inst.name = self.name
        inst.options = self.spec.options
        assert self.sql is not None
        inst.sql = self.sql
        inst.actors = ActorsClient(self)
        inst._ak = self
        self.instance = inst
        _current_actor.set(inst)
        return inst

    def discard_instance(self) -> None:
        inst, self.instance = self.instance, None
        if inst is not None and inst._ak_db is not None:
            inst._ak_db.close()

    def rollback(self) -> None:
        if self.db is not None and self.db.conn.in_transaction:
            self.db.conn.execute("ROLLBACK")

    def close(self) -> None:
        self.closed = True
        self.discard_instance()
        if self.sa_engine is not None:
            self.sa_engine.dispose(close=False)
            self.sa_engine = None
        if self.db is not None:
            with contextlib.suppress(Exception):
                self.rollback()
            self.db.close()
            self.db = None

    def chain_for_call(self) -> tuple[str, ...]:
        ev = self.current
        return (*ev.chain, self.address) if ev is not None else (self.address,)

    # -- alarm ----------------------------------------------------------------------------
    def _ensure_writable(self, what: str) -> Database:
        db = self.db
        assert db is not None
        if db.conn.in_transaction:
            raise RuntimeError(f"{what} inside a transaction: end the transaction first")
        return db

    async def set_alarm(
        self,
        at: float,
        scheduled_at: float | None = None,
        retries: int = 0,
        durable: bool = True,
    ) -> None:
        db = self._ensure_writable("set_alarm")
        self.host._clearing.pop(self.address, None)  # the index entry is this alarm's now
        state = AlarmState(at, at if scheduled_at is None else scheduled_at, retries)
        index = self.host.alarm_index
        if self._rearm_at_once(at) or (not durable and self.index_durable):
            # Plain writes of the index and the row. Power loss keeps an index entry for this
            # address (entries go only after a durable deletion), so whatever row survives is
            # woken, at worst at a later time set meanwhile.
            index.put(self.address, at)
            self._write_alarm(db, state)
            return
        # The index first (see alarms.py), and never later than the alarm it replaces until
        # the new one is durable: a crash in between must not delay an acknowledged alarm.
        # Nor later than the entry already there: with no alarm in memory, the entry may still
        # guard a cleared row whose deletion is not durable yet (Host._forget_alarm).
        first = at
        if self.alarm is not None:
            first = min(first, self.alarm.at)
        entry = index.get(self.address)
        if entry is not None:
            first = min(first, entry)
        index.put(self.address, first)
        await index.sync()
        self.index_durable = True
        self._write_alarm(db, state)
        if not durable:
            return  # the row becomes durable with the actor's next durable write
        await db.sync()
        if first < at:
            index.put(self.address, at)  # an early wake-up is harmless: see _run_alarm

    def _rearm_at_once(self, at: float) -> bool:
        """Whether this is the alarm's own event setting it again for now or earlier.

        Then no fsync is needed: until this event ends, the stored alarm is the one that fired,
        which is due, so power loss brings back that alarm (or, if it was set with
        ``durable=False``, what that allows), which fires at once; and ``at`` is not later than
        now, so nothing can fire early. (A push queue re-arms this way after every batch while
        messages are ready.)
        """
        ev = self.current
        return (
            ev is not None
            and ev.fn is None
            and not self.alarm_touched
            and self.alarm is not None
            and at <= self.host.clock.now()
        )

    def _write_alarm(self, db: Database, state: AlarmState) -> None:
        db.conn.execute(
            f"CREATE TABLE IF NOT EXISTS {ACTOR_TABLE} (id INTEGER PRIMARY KEY CHECK (id = 0), "
            "at REAL NOT NULL, scheduled_at REAL NOT NULL, retry_count INTEGER NOT NULL)"
        )
        db.conn.execute(
            f"INSERT OR REPLACE INTO {ACTOR_TABLE} (id, at, scheduled_at, retry_count) "
            "VALUES (0, ?, ?, ?)",
            (state.at, state.scheduled_at, state.retry_count),
        )
        self.alarm = state
        self.alarm_touched = True
        self.host.poke_alarms(state.at)

    def clear_alarm(self) -> None:
        """Delete the alarm's row with a plain write (a crash may bring it back: at least
        once). The index entry stays until the deletion is durable (``Host._forget_alarm``):
        were the entry's removal durable and the row's not, power loss could leave an alarm
        that nothing wakes."""
        db = self.db
        assert db is not None
        if self.alarm is not None:
            db.conn.execute(f"DELETE FROM {ACTOR_TABLE}")
            self.alarm = None
        self.alarm_touched = True

    async def delete_alarm(self) -> None:
        db = self._ensure_writable("delete_alarm")
        self.host._clearing.pop(self.address, None)
        self.alarm_touched = True
        index = self.host.alarm_index
        if self.alarm is None and index.get(self.address) is None:
            # No entry: the row's absence is durable (an entry goes only after it is).
            return
        # With an entry left, the row may be gone only until power loss (a fired alarm whose
        # deletion is not durable yet, or a crash since): make its absence durable too.
        if self.alarm is not None:
            db.conn.execute(f"DELETE FROM {ACTOR_TABLE}")
            self.alarm = None
        await db.sync()
        # Only now the index: were the entry gone and the row not, power loss could leave an
        # alarm that no index entry would ever wake.
        self.host.alarm_index.remove(self.address)
        self.index_durable = False


class Host:
    """Runs the actors of an ``App`` on one trio thread. Use ``async with host.open():``."""

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
        self._activations: OrderedDict[str, Activation] = OrderedDict()
        self._nursery: trio.Nursery | None = None
        self._closing = False
        self._host_db: HostDb | None = None
        self._alarm_index: AlarmIndex | None = None
        self._registry: Registry | None = None
        self._quarantined: dict[str, str] = {}  # address -> why
        self._registering: set[str] = set()
        self._alarm_failures: dict[str, int] = {}  # address -> failures in a row, no handler
        self._fd_warned = -math.inf
        self._fd_refusals = 0
        self._alarm_scope: trio.CancelScope | None = None
        self._poked = math.inf  # the earliest alarm time poked since the scheduler's last scan
        self._alarms_running: set[str] = set()
        self._clearing: dict[str, object] = {}  # address -> token of its pending _forget_alarm
        self._evictor_scope: trio.CancelScope | None = None
        self._timeouts = CallTimeouts()
        self._inline_budget = INLINE_YIELD_EVERY

    def error_id(self) -> str:
        """A fresh id that ties an error an outside client sees to the host's log line."""
        return f"{self.rng.getrandbits(48):012x}"

    def buggify(self, site: str) -> bool:
        """Whether the simulator fires the fault at ``site`` now; always False outside it."""
        return self.faults is not None and self.faults.buggify(site)

    # -- lifecycle ------------------------------------------------------------------------
    @property
    def alarm_index(self) -> AlarmIndex:
        if self._alarm_index is None:
            raise HostClosed("the host is not open")
        return self._alarm_index

    @property
    def registry(self) -> Registry:
        if self._registry is None:
            raise HostClosed("the host is not open")
        return self._registry

    @property
    def quarantined(self) -> dict[str, str]:
        """``address -> reason`` of the actors that take no events (their storage is damaged)."""
        return dict(self._quarantined)

    @contextlib.asynccontextmanager
    async def open(self) -> AsyncIterator[Host]:
        """Open the host: start its alarm scheduler and evictor; close everything on exit."""
        if self._nursery is not None or self._closing:
            raise RuntimeError("a Host can be opened once; make a new one to restart")
        host_db, set_aside = open_host_db(self.storage)
        self._host_db = host_db
        try:
            self._alarm_index = AlarmIndex(host_db)
            self._registry = Registry(host_db)
            if set_aside is not None or (host_db.fresh and self.storage.has_actors()):
                if set_aside is None:
                    log.warning(
                        "the host database is new but actors exist: rebuilding it from them",
                        file=host_db.where,
                    )
                rebuild(self.storage, host_db, self._alarm_index, self._registry, self.clock.now())
            elif self._registry.new and not host_db.fresh:
                log.info("registering the actors of a host database from before the registry")
                rebuild(self.storage, host_db, self._alarm_index, self._registry, self.clock.now())
            if self.clock.follows_wall:
                self._not_before_last_run(host_db)
            await host_db.sync()
            self._quarantined = {a: why for a, (why, _) in self._registry.quarantined().items()}
        except BaseException:
            host_db.close()
            self.storage.close()
            raise
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._alarm_loop)
                nursery.start_soon(self._evictor_loop)
                nursery.start_soon(self._timeouts.watch)
                if self.clock.follows_wall:
                    nursery.start_soon(self._clock_loop)
                try:
                    yield self
                finally:
                    self._closing = True
                    nursery.cancel_scope.cancel()
        finally:
            self._closing = True
            for act in list(self._activations.values()):
                self._retire(act)
            if self.clock.follows_wall:
                with contextlib.suppress(Exception):
                    host_db.set_meta("clock_high_water", self.clock.now())
            host_db.close()
            self.storage.close()

    # -- the clock (decision 0012) ---------------------------------------------------------
    def _not_before_last_run(self, host_db: HostDb) -> None:
        """Host time never goes back across a restart: start at the latest time recorded."""
        high_water = host_db.get_meta("clock_high_water")
        if not isinstance(high_water, int | float):
            return
        behind = high_water - self.clock.now()
        if behind > 0:
            log.warning(
                "the wall clock is behind the last time this host ran: host time starts "
                "from that time instead, so that nothing moves back",
                seconds=round(behind, 3),
            )
            self.clock.step(behind)

    async def _clock_loop(self) -> None:
        """Follow the wall clock forward; never back (decision 0012)."""
        assert self._host_db is not None
        warned = saved = -math.inf
        while True:
            await trio.sleep(CLOCK_CHECK_EVERY)
            offset = self.clock.wall_offset()
            if offset > CLOCK_BOUND:
                self.clock.step(offset)
                log.warning(
                    "the wall clock jumped ahead of host time: host time steps forward to it "
                    "(alarms due by then fire, TTLs that ended are over)",
                    seconds=round(offset, 3),
                )
                self.poke_alarms(self.clock.now())
            elif offset < -CLOCK_BOUND and trio.current_time() - warned >= CLOCK_WARN_EVERY:
                warned = trio.current_time()
                log.warning(
                    "the wall clock is behind host time: host time goes on at its own pace and "
                    "does not step back",
                    seconds=round(-offset, 3),
                )
            if trio.current_time() - saved >= HIGH_WATER_EVERY:
                saved = trio.current_time()
                try:
                    self._host_db.set_meta("clock_high_water", self.clock.now())
                except Exception as exc:
                    log.error("could not record the host time", error=repr(exc))

    @property
    def active_count(self) -> int:
        """How many actors are in memory."""
        return len(self._activations)

    # -- access ---------------------------------------------------------------------------
    def refusal(self, spec: ActorClass, caller: str | None) -> Response | None:
        """The 403 for a caller this class refuses, before any actor is created."""
        if caller is None:
            if spec.name in self._internal:
                return error_response(403, "Forbidden", f"actor class {spec.name!r} is internal")
            if spec.cls.callers_only or spec.allow is not None:
                return error_response(
                    403, "Forbidden", f"actor class {spec.name!r} answers only other actors"
                )
        elif spec.allow is not None and caller.partition("/")[0] not in spec.allow:
            return error_response(
                403, "Forbidden", f"actor class {spec.name!r} does not answer {caller!r}"
            )
        return None

    # -- entry points ---------------------------------------------------------------------
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
        """A call from actor ``caller`` (whose chain of waiting callers is ``chain``)."""
        class_name, name = split_address(address)
        if address in chain:
            raise ReentryError(f"{address} is already in the call chain {' -> '.join(chain)}")
        if not isinstance(body, bytes | bytearray):
            raise TypeError("body must be bytes")
        path, _, query_string = path.partition("?")
        if not path.startswith("/"):
            raise ValueError(f"path must start with '/': {path!r}")
        hdrs = {
            k.lower(): v
            for k, v in (headers or {}).items()
            if not k.lower().startswith(RESERVED_HEADER_PREFIX)
        }
        hdrs[CALLER_HEADER] = caller
        query = parse_query(query_string)
        request = Request(
            method.upper(), path, query, Headers._from_lower(hdrs), bytes(body), caller
        )
        return await self.deliver(class_name, name, request, chain, timeout)

    async def deliver(
        self,
        class_name: str,
        name: str,
        request: Request,
        chain: tuple[str, ...],
        timeout: float | None,
    ) -> Response:
        """Route a request to the actor ``class_name/name`` and wait for its reply.

        Everything that refuses a request (unknown class or route, access, a body that does not
        decode) happens here, before the actor is created. ``max_body`` is the front's limit on
        outside requests; calls between actors carry what the callee itself accepts.
        """
        check_timeout(timeout)
        spec = self.classes.get(class_name)
        if spec is None:
            return error_response(404, "NotFound", f"no actor class {class_name!r}")
        refused = self.refusal(spec, request.caller)
        if refused is not None:
            return refused
        address = f"{class_name}/{name}"
        creates = spec.outside_creates
        if creates is not None and request.caller is None and address not in self._activations:
            try:
                refuse = (
                    not creates(name)
                    and not self.storage.exists(class_name, name)
                    and not self.registry.has(address)  # gone from disk: damage, not absence
                )
            except Exception as exc:  # a bug in the app's create function
                return self._error_reply(exc, "create check failed", address, True)
            if refuse:
                return error_response(404, "NotFound", f"no actor {address}")
        router = spec.router
        rpc = router.rpc_for(request.method, request.path)
        decoded = 0
        if rpc is not None:
            try:
                encoding = codec.encoding_of(request.headers.get("content-type"))
                args, values = codec.decode_args_counted(request.body, encoding)
                rpc.check_args(args)
            except ValueError as exc:
                return error_response(400, "BadRequest", str(exc))
            decoded = values * codec.VALUE_COST
            ev = Event(rpc.fn, request, chain, None, args, encoding, rpc.inline)
        else:
            found = router.match(request.method, request.path)
            if found is None:
                return error_response(
                    404, "NotFound", f"{class_name} has no route {request.method} {request.path}"
                )
            fn, params = found
            inline, parse = router.handlers[fn]
            if parse is not None:
                try:
                    parsed = parse(address, request, **params)
                except ValueError as exc:
                    return error_response(400, "BadRequest", str(exc))
                except Exception as exc:  # a bug in the parse function: answered like one
                    return self._error_reply(exc, "parse failed", address, request.caller is None)
                if isinstance(parsed, Response):
                    return parsed
                request.parsed = parsed
            ev = Event(fn, request, chain, params, inline=inline)
        if request.caller is not None:
            return await self._dispatch(address, spec, name, ev, timeout)
        # From outside: the body and what it decoded to stay in memory until the reply.
        cost = len(request.body) + decoded
        if not self.inflight.take(cost):
            raise Overloaded("too many request bytes in flight on this host")
        try:
            return await self._dispatch(address, spec, name, ev, timeout)
        finally:
            self.inflight.give(cost)

    async def call_rpc(
        self,
        caller: str,
        chain: tuple[str, ...],
        address: str,
        method: str,
        args: dict[str, Any],
        timeout: float | None,
    ) -> Any:
        """``ref.method(**args)`` from actor ``caller``: the result, or the error it means.

        The same rules as ``call`` to ``POST /_rpc/<method>`` with a msgpack body, without
        building an HTTP-shaped request: rpc handlers only see their arguments.
        """
        check_timeout(timeout)
        act = self._activations.get(address)
        if act is not None:
            spec, name = act.spec, act.name
        else:
            class_name, name = split_address(address)
            found_spec = self.classes.get(class_name)
            if found_spec is None:
                raise RemoteError(404, "NotFound", f"no actor class {class_name!r}")
            spec = found_spec
        if address in chain:
            raise ReentryError(f"{address} is already in the call chain {' -> '.join(chain)}")
        if spec.allow is not None and caller.partition("/")[0] not in spec.allow:
            raise Forbidden(f"actor class {spec.name!r} does not answer {caller!r}")
        rpc = spec.router.rpcs.get(method)
        if rpc is None:
            raise RemoteError(404, "NotFound", f"{spec.name} has no route POST /_rpc/{method}")
        copied = codec.unpack(codec.pack(args))  # the callee gets its own copy, as over HTTP
        try:
            rpc.check_args(copied)
        except ValueError as exc:
            raise BadRequest(400, "BadRequest", str(exc)) from None
        ev = Event(rpc.fn, None, chain, None, copied, "msgpack", rpc.inline)
        return decode_reply(await self._dispatch(address, spec, name, ev, timeout))

    async def _dispatch(
        self,
        address: str,
        spec: ActorClass,
        name: str,
        ev: Event,
        timeout: float | None,
        hooked: bool = False,
    ) -> Response:
        if self.faults is not None and ev.chain and not hooked:
            return await self._dispatch_with_faults(self.faults, address, spec, name, ev, timeout)
        if ev.inline:
            # Every call can be cancelled here; and the host yields to the scheduler at least
            # once per INLINE_YIELD_EVERY inline calls, so a loop of them cannot starve others.
            await trio.lowlevel.checkpoint_if_cancelled()
            self._inline_budget -= 1
            if self._inline_budget <= 0:
                self._inline_budget = INLINE_YIELD_EVERY
                await trio.lowlevel.cancel_shielded_checkpoint()
            act = self._activations.get(address)
            if act is not None and act.parked and act.instance is not None:
                return await self._run_inline(act, ev)
        self._enqueue(self._activation(address, spec, name), ev, limit=True)
        return await self._wait(ev, timeout)

    async def _dispatch_with_faults(
        self,
        faults: FaultHooks,
        address: str,
        spec: ActorClass,
        name: str,
        ev: Event,
        timeout: float | None,
    ) -> Response:
        """``_dispatch`` under the simulator: the call may be delayed, refused or lose its
        reply, and an inline-safe handler may run on the worker instead."""
        await faults.before_call(ev.chain, address)
        if ev.inline and faults.buggify("host.no-inline"):
            ev.inline = False
        resp = await self._dispatch(address, spec, name, ev, timeout, hooked=True)
        faults.after_call(ev.chain, address)
        return resp

    async def _run_inline(self, act: Activation, ev: Event) -> Response:
        """Run a handler that cannot suspend in the caller's task, while its actor is idle.

        Its worker is parked with nothing queued, and the handler has no yield point, so it
        runs from start to end with nothing else running: one event at a time and FIFO hold,
        and no timeout or cancellation can reach it. It is what the worker would do, without
        the two task switches (decision 0001).
        """
        inst = act.instance
        assert inst is not None and ev.fn is not None
        act.current = ev
        token = _current_actor.set(inst)
        damaged = False
        try:
            if ev.args is not None:
                result = await ev.fn(inst, **ev.args)
            else:
                result = await ev.fn(inst, ev.request, **(ev.params or {}))
            resp = self._response(act, ev, result)
        except Exception as exc:
            resp = self._failed(act, exc, _from_outside(ev))
            damaged = is_damage(exc)
        finally:
            _current_actor.reset(token)
            act.current = None
            act.last_used = now = trio.current_time()
            if not act.closed:  # quarantined by its failure
                self._activations.move_to_end(act.address)
                self._note_idle(now + self.idle_timeout)
                if self.faults is not None and self.faults.buggify("host.evict-after-event"):
                    self._evict(act)
        if damaged:
            raise Quarantined(_quarantine_message(act.address))
        return resp

    # -- activations and the worker -------------------------------------------------------
    def _activation(self, address: str, spec: ActorClass, name: str) -> Activation:
        if self._closing or self._nursery is None:
            raise HostClosed("the host is closed")
        act = self._activations.get(address)
        if act is not None:
            self._activations.move_to_end(address)
            return act
        if address in self._quarantined:
            raise Quarantined(_quarantine_message(address))
        check_actor_name(name)  # the one place a file can come into being: never trust callers
        act = Activation(self, spec, address, name)
        self._activations[address] = act
        self._nursery.start_soon(self._worker, act, name=f"actor {address}")
        if len(self._activations) > self.max_active:
            self._evict_lru(len(self._activations) - self.max_active)
        return act

    def _enqueue(self, act: Activation, ev: Event, limit: bool) -> None:
        if limit and len(act.queue) >= self.max_pending:
            raise Overloaded(f"{act.address} has {len(act.queue)} waiting events")
        act.queue.append(ev)
        if act.parked:
            act.parked = False
            assert act.task is not None
            reschedule(act.task)

    async def _wait(self, ev: Event, timeout: float | None) -> Response:
        """Park until the worker answers, the timeout passes (``CallTimeout``) or we are
        cancelled. In the last two cases the event is abandoned: skipped if it has not started."""
        ev.waiter = current_task()
        if timeout is not None:
            self._timeouts.add(ev, timeout)

        def abort(_: Any) -> Abort:
            ev.waiter = None
            ev.abandoned = True
            self._timeouts.discard(ev)
            return Abort.SUCCEEDED

        return await wait_task_rescheduled(abort)  # type: ignore[no-any-return]

    def _reply(self, ev: Event, result: outcome.Outcome[Response]) -> None:
        waiter = ev.waiter
        if waiter is not None:
            ev.waiter = None
            self._timeouts.discard(ev)
            reschedule(waiter, result)

    async def _worker(self, act: Activation) -> None:
        act.task = current_task()
        queue = act.queue
        try:
            while True:
                if not queue:
                    if act.closed:
                        return  # evicted while its last event ran
                    act.parked = True
                    if await wait_task_rescheduled(_abort_park) is _STOP:
                        return
                    continue
                ev = queue.popleft()
                if ev.abandoned:  # its caller is gone: skip it, but it was activity
                    act.last_used = now = trio.current_time()
                    self._note_idle(now + self.idle_timeout)
                    continue
                act.current = ev
                try:
                    if ev.fn is None:
                        await self._run_alarm(act)
                    else:
                        self._reply(ev, await self._run(act, ev))
                except BaseException:  # cancelled: the host is closing; answer the caller
                    self._reply(ev, outcome.Error(HostClosed(f"{act.address} was shut down")))
                    raise
                finally:
                    act.current = None
                    act.last_used = now = trio.current_time()
                    if not act.closed:
                        self._activations.move_to_end(act.address)
                        self._note_idle(now + self.idle_timeout)
                        if not queue and self.buggify("host.evict-after-event"):
                            self._evict(act)
        finally:
            self._retire(act)

    def _retire(self, act: Activation) -> None:
        """Forget an activation whose worker has ended; fail the events it will never run."""
        if self._activations.get(act.address) is act:
            del self._activations[act.address]
        while act.queue:  # an outcome is unwrapped once: one each
            self._reply(
                act.queue.popleft(), outcome.Error(HostClosed(f"{act.address} was shut down"))
            )
        act.close()

    async def _instance(self, act: Activation) -> Actor:
        inst = act.instance
        if inst is None:
            if act.db is None:
                act.open_db()
            inst = act.new_instance()
            await inst.setup()
        return inst

    async def _run(self, act: Activation, ev: Event) -> outcome.Outcome[Response]:
        try:
            inst = await self._instance(act)
        except Exception as exc:
            if out_of_descriptors(exc):
                # Nothing of the event ran: the caller may try again, as for any overload.
                self._note_out_of_descriptors(act.address)
                with contextlib.suppress(Exception):
                    act.rollback()
                act.discard_instance()
                return outcome.Error(
                    Overloaded("the host is out of file descriptors for now", retry_after=1.0)
                )
            return self._event_failed(act, ev, exc)
        try:
            assert ev.fn is not None
            if ev.args is not None:
                result = await ev.fn(inst, **ev.args)
            else:
                result = await ev.fn(inst, ev.request, **(ev.params or {}))
            return outcome.Value(self._response(act, ev, result))
        except Exception as exc:
            return self._event_failed(act, ev, exc)

    def _event_failed(
        self, act: Activation, ev: Event, exc: Exception
    ) -> outcome.Outcome[Response]:
        """The reply of an event that raised: a 500, or ``Quarantined`` if its storage is
        damaged (raised to the caller, as for every later event of the actor)."""
        resp = self._failed(act, exc, _from_outside(ev))
        if is_damage(exc):
            return outcome.Error(Quarantined(_quarantine_message(act.address)))
        return outcome.Value(resp)

    def _note_out_of_descriptors(self, address: str) -> None:
        self._fd_refusals += 1
        now = trio.current_time()
        if now - self._fd_warned >= 10.0:
            log.warning(
                "out of file descriptors opening actors: answering 503; lower --max-active "
                "or raise `ulimit -n`",
                address=address,
                refused=self._fd_refusals,
            )
            self._fd_warned, self._fd_refusals = now, 0

    @staticmethod
    def _response(act: Activation, ev: Event, result: Any) -> Response:
        """The reply to an event whose handler returned ``result``."""
        if act.db is not None and act.db.conn.in_transaction:
            raise RuntimeError(
                "the event ended with a transaction still open: commit it before returning "
                "(or use `with self.sql.transaction():`)"
            )
        if ev.encoding is not None:  # @rpc: encode the return value as the request was
            body = codec.encode(result, ev.encoding)
            return Response(200, _RESULT_HEADERS[ev.encoding], body)
        if not isinstance(result, Response):
            assert ev.fn is not None
            raise TypeError(
                f"route handler {ev.fn.__qualname__} returned {type(result).__name__}, "
                "not ak.Response"
            )
        return result

    def _failed(self, act: Activation, exc: Exception, outside: bool = False) -> Response:
        """A failed event: roll back, discard the instance, log, answer 500; or, if the
        failure says the actor's storage is damaged, quarantine it and answer 503."""
        try:
            act.rollback()
        except Exception:
            log.exception("rollback failed", address=act.address, file=act.where)
        act.discard_instance()
        if is_damage(exc):
            return self._quarantine(act, exc)
        return self._error_reply(exc, "event failed", act.address, outside, act.where)

    # -- damaged storage ------------------------------------------------------------------
    def _quarantine(self, act: Activation, exc: Exception) -> Response:
        """Take a damaged actor out of service: it is closed, what waits for it is refused,
        and it takes no event (its alarm does not fire) until an operator releases it."""
        address = act.address
        reason = exc.reason if isinstance(exc, StorageDamaged) else f"SQLite says: {exc}"
        where = getattr(exc, "where", None) or act.where
        log.error(
            "actor quarantined: its storage is damaged",
            address=address,
            reason=reason,
            error_id=self.error_id(),
            **({"file": where} if where is not None else {}),
        )
        self._quarantined[address] = reason
        try:
            self.registry.quarantine(address, reason, self.clock.now())
            self._sync_host_db_soon()
        except Exception:
            log.exception("could not record the quarantine", address=address)
        if self._activations.get(address) is act:
            self._evict(act)
        act.closed = True
        while act.queue:  # an outcome is unwrapped once: one each
            self._reply(
                act.queue.popleft(), outcome.Error(Quarantined(_quarantine_message(address)))
            )
        return error_response(503, "Quarantined", _quarantine_message(address))

    def _sync_host_db_soon(self) -> None:
        """Make the host database's plain writes durable in the background."""
        if self._nursery is not None and not self._closing:
            self._nursery.start_soon(self._sync_host_db)

    async def _sync_host_db(self) -> None:
        assert self._host_db is not None
        try:
            await self._host_db.sync()
        except Exception as exc:
            log.error("host database sync failed", file=self._host_db.where, error=repr(exc))

    def _register_soon(self, address: str, db: Database) -> None:
        """Register a newly opened actor once its database is durable (registry.py)."""
        if address in self._registering or self._nursery is None or self._closing:
            return
        self._registering.add(address)
        self._nursery.start_soon(self._register, address, db)

    async def _register(self, address: str, db: Database) -> None:
        try:
            await db.sync()  # the file and its directory entries survive power loss now
            self.registry.add(address, self.clock.now())
            await self._sync_host_db()
        except Exception as exc:  # evicted before its sync: it is registered when next opened
            log.debug("actor not registered yet", address=address, error=repr(exc))
        finally:
            self._registering.discard(address)

    def _error_reply(
        self, exc: Exception, what: str, address: str, outside: bool, where: str | None = None
    ) -> Response:
        """Log a failure with a fresh error id and answer 500: with the exception to actors
        (and in debug mode), with only the id to outside clients."""
        error_id = self.error_id()
        log.error(
            what,
            address=address,
            error=type(exc).__name__,
            error_id=error_id,
            **({"file": where} if where is not None else {}),
            exc_info=exc,
        )
        if outside and not self.debug:
            return error_response(
                500, "InternalError", f"internal error; the host's log has id {error_id}"
            )
        return error_response(500, type(exc).__name__, str(exc))

    # -- eviction -------------------------------------------------------------------------
    def _evict(self, act: Activation) -> None:
        del self._activations[act.address]
        act.closed = True
        if act.parked:
            act.parked = False
            assert act.task is not None
            reschedule(act.task, outcome.Value(_STOP))

    def _evict_lru(self, count: int) -> None:
        victims: list[Activation] = []
        for act in self._activations.values():
            if len(victims) >= count:
                break
            if act.parked and not act.queue:
                victims.append(act)
        for act in victims:
            self._evict(act)

    def _note_idle(self, deadline: float) -> None:
        scope = self._evictor_scope
        if scope is not None and deadline < scope.deadline:
            scope.deadline = deadline

    async def _evictor_loop(self) -> None:
        while True:
            now = trio.current_time()
            victims: list[Activation] = []
            deadline = math.inf
            for act in self._activations.values():
                if act.current is not None or act.queue or not act.parked:
                    continue  # busy, or its worker has not started yet
                expires = act.last_used + self.idle_timeout
                if expires > now:
                    deadline = expires
                    break
                victims.append(act)
            for act in victims:
                self._evict(act)
            with trio.CancelScope(deadline=deadline) as scope:
                self._evictor_scope = scope
                await trio.sleep_forever()
            self._evictor_scope = None

    # -- alarms ---------------------------------------------------------------------------
    def poke_alarms(self, at: float) -> None:
        """Wake the scheduler if ``at`` is earlier than it planned to wake."""
        self._poked = min(self._poked, at)  # remembered while the scheduler is scanning
        scope = self._alarm_scope
        if scope is not None:
            deadline = self.clock.trio_time(at)
            if deadline < scope.deadline:
                scope.deadline = deadline

    async def _alarm_loop(self) -> None:
        index = self.alarm_index
        while True:
            self._poked = math.inf
            now = self._alarm_horizon()
            after: tuple[float, str] | None = None
            while True:
                rows = index.due(now, after, _DUE_BATCH)
                for address, _ in rows:
                    self._fire(address)
                if len(rows) < _DUE_BATCH:
                    break
                after = (rows[-1][1], rows[-1][0])
                await trio.lowlevel.checkpoint()
            nxt = index.next_after(now)
            if nxt is not None and self.buggify("host.alarm-early-wake"):
                # An early wake-up must be harmless: _run_alarm finds the alarm not yet due.
                self._fire(nxt[1], early=True)
            wake = min(math.inf if nxt is None else nxt[0], self._poked)
            if wake <= now:
                continue  # poked while scanning with an alarm already due: scan again
            with trio.CancelScope(deadline=self.clock.trio_time(wake)) as scope:
                self._alarm_scope = scope
                await trio.sleep_forever()
            self._alarm_scope = None

    def _alarm_horizon(self) -> float:
        """Alarms set for this time or earlier are due (a seam for the simulator's planted
        early-alarm bug)."""
        return self.clock.now()

    def _fire(self, address: str, early: bool = False) -> None:
        if address in self._alarms_running or address in self._quarantined:
            return  # a quarantined actor's alarm stays in the index until it is released
        try:
            class_name, name = split_address(address)
        except ValueError:
            class_name = name = ""
        spec = self.classes.get(class_name)
        if spec is None or not spec.has_alarm:
            # Keep the entry: the class may come back with the next deploy of the app.
            log.warning("alarm for an actor class this app does not serve", address=address)
            self._alarms_running.add(address)
            return
        self._alarms_running.add(address)
        delay = 0.0 if self.faults is None or early else self.faults.alarm_delay(address)
        if delay > 0:
            assert self._nursery is not None
            self._nursery.start_soon(self._fire_late, address, spec, name, delay)
            return
        self._enqueue(self._activation(address, spec, name), Event(None, None, ()), limit=False)

    async def _fire_late(self, address: str, spec: ActorClass, name: str, delay: float) -> None:
        await trio.sleep(delay)
        if self._closing:
            return  # the alarm stays in the index: the next host fires it
        self._enqueue(self._activation(address, spec, name), Event(None, None, ()), limit=False)

    async def _run_alarm(self, act: Activation) -> None:
        """One alarm event. Nothing but cancellation escapes it: when storage fails, the alarm
        stays due and the event is tried again 2 s later, doubling up to 5 minutes, with one
        log line each time; damaged storage quarantines the actor instead."""
        address = act.address
        try:
            if self.buggify("host.alarm-event-fails"):
                raise OSError("buggify: the alarm event hit a storage error")
            if act.db is None:
                act.open_db()
            state = act.alarm
            cleared = False
            if state is None:
                # An index entry that outlived its alarm: drop it once the row's absence is
                # durable (it may be absent only in a state that power loss would undo).
                assert act.db is not None
                await act.db.sync()
                if act.alarm is None:
                    self.alarm_index.remove(address)
                    act.index_durable = False
            elif state.at > self._alarm_horizon():
                # Moved later by an earlier event: move the entry only once that row is durable
                # (it may come from a plain set, or one a crash interrupted).
                assert act.db is not None
                await act.db.sync()
                self.alarm_index.put(address, state.at)
            else:
                cleared = await self._fire_alarm(act, state)
        except Exception as exc:
            if is_damage(exc):
                self._failed(act, exc)  # quarantined: its alarm waits in the index
                self._alarms_running.discard(address)
                return
            self._alarm_storage_failed(act, exc)
            return
        self._alarm_failures.pop(address, None)
        if cleared:
            # Registered now, before the actor's next event can set the alarm again.
            token = self._clearing[address] = object()
            assert self._nursery is not None
            self._nursery.start_soon(self._forget_alarm, act, token)
            return
        self._alarms_running.discard(address)
        if act.alarm is not None:
            self.poke_alarms(act.alarm.at)

    async def _fire_alarm(self, act: Activation, state: AlarmState) -> bool:
        """Run the handler; True if the alarm is now cleared (its row deleted)."""
        act.alarm_touched = False
        try:
            inst = await self._instance(act)
            await inst.alarm(AlarmInfo(state.scheduled_at, state.retry_count))  # type: ignore[attr-defined]
            assert act.db is not None
            if act.db.conn.in_transaction:
                raise RuntimeError(
                    "the alarm event ended with a transaction still open: commit it before "
                    "returning (or use `with self.sql.transaction():`)"
                )
        except Exception as exc:
            self._failed(act, exc)  # rolls back
            if act.address in self._quarantined:
                return False  # its storage is damaged: the alarm stays as it was
            return await self._retry_alarm(act, state)
        if not act.alarm_touched:
            act.clear_alarm()
            return True
        return False

    async def _forget_alarm(self, act: Activation, token: object) -> None:
        """After an alarm was cleared: make the row's deletion durable, then drop the index
        entry, unless the alarm was set again meanwhile. The actor goes on taking events; its
        address stays out of the scheduler's scans until this ends."""
        address = act.address
        try:
            assert act.db is not None
            await act.db.sync()
            if self._clearing.get(address) is token:
                self.alarm_index.remove(address)
                act.index_durable = False
        except Exception as exc:
            # Closed (evicted) or failing storage: keep the entry. Its next wake-up finds no
            # alarm and drops it then (see _run_alarm). Nothing escapes into the host.
            log.info("kept a cleared alarm's index entry", address=address, error=repr(exc))
        finally:
            if self._clearing.get(address) is token:
                del self._clearing[address]
            self._alarms_running.discard(address)
        self.poke_alarms(self.clock.now())  # an alarm set meanwhile may be due

    def _alarm_storage_failed(self, act: Activation, exc: Exception) -> None:
        """The alarm event failed outside its handler (storage): roll back, and try again
        later, backing off; one log line per try, the traceback with the first."""
        address = act.address
        failures = self._alarm_failures.get(address, 0) + 1
        self._alarm_failures[address] = failures
        delay = storage_retry_delay(failures)
        # The storage that failed may fail the rollback too; the next try starts afresh.
        with contextlib.suppress(Exception):
            act.rollback()
        act.discard_instance()
        log.error(
            "alarm event failed before its handler ran; trying again later",
            address=address,
            error=repr(exc),
            failures=failures,
            retry_in=delay,
            **({"file": act.where} if act.where is not None else {}),
            exc_info=exc if failures == 1 else None,
        )
        assert self._nursery is not None
        self._nursery.start_soon(self._alarm_cooldown, address, delay)

    async def _alarm_cooldown(self, address: str, delay: float) -> None:
        await trio.sleep(delay)
        self._alarms_running.discard(address)
        self.poke_alarms(self.clock.now())

    async def _retry_alarm(self, act: Activation, state: AlarmState) -> bool:
        """After a failed alarm event: the retry replaces any alarm the event set. True if
        the alarm was dropped (cleared) instead."""
        if state.retry_count < MAX_RETRIES:
            retry_at = self.clock.now() + retry_delay(state.retry_count)
            await act.set_alarm(retry_at, state.scheduled_at, state.retry_count + 1)
            return False
        act.clear_alarm()
        log.error(
            "alarm dropped after its last retry",
            address=act.address,
            scheduled_at=state.scheduled_at,
            retries=state.retry_count,
        )
        return True


def _quarantine_message(address: str) -> str:
    return (
        f"actor {address} is quarantined: its storage is damaged; it takes no events until "
        "an operator releases it (the host's log says what is wrong)"
    )


def _from_outside(ev: Event) -> bool:
    return ev.request is not None and ev.request.caller is None


def parse_query(query_string: str) -> dict[str, str]:
    """``a=1&b=2`` -> ``{"a": "1", "b": "2"}``; the first value of a repeated key wins."""
    if not query_string:
        return {}
    from urllib.parse import parse_qsl

    query: dict[str, str] = {}
    for key, value in parse_qsl(query_string, keep_blank_values=True):
        query.setdefault(key, value)
    return query
