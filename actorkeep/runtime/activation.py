"""``Activation``: one actor in memory (its database, its inbox of events, its instance).

It is also the actor's ``ActorContext``: what ``ak.Actor`` and ``self.actors`` ask of the
host goes through it. One worker task of the host runs its events one after another.
"""

from __future__ import annotations

import contextlib
import random
import sqlite3
from collections import deque
from collections.abc import Callable, Coroutine, Mapping
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, Any, Protocol

import trio
from trio.lowlevel import Task

from ..actor import Actor
from ..app import ActorClass
from ..calls import ActorsClient
from ..http import Response
from ..routing import Operation
from ..sql import Sql
from ..ws import WebSocket
from .alarm_store import ACTOR_TABLE as ALARM_TABLE
from .alarm_store import AlarmState, read_alarm
from .clock import Clock
from .gate import Gate
from .handoff import Event
from .registry import Registry
from .stats import HostStats
from .storage import IDENTITY_TABLE, Database, StorageBackend

if TYPE_CHECKING:
    import sqlalchemy

_current_actor: ContextVar[Actor] = ContextVar("actorkeep_current_actor")


def current_actor() -> Actor:
    """The actor whose event is running in this task (``RuntimeError`` outside an event)."""
    try:
        return _current_actor.get()
    except LookupError:
        raise RuntimeError("no actor event is running in this task") from None


#: ``set_current_actor(inst)``: make ``inst`` the current actor of this task (an inline event
#: runs in its caller's task); ``reset_current_actor(token)`` with the token it returns undoes
#: it. The context variable's own methods: no frame on the inline path.
set_current_actor: Callable[[Actor], Token[Actor]] = _current_actor.set
reset_current_actor: Callable[[Token[Actor]], None] = _current_actor.reset


class ActorAlarms(Protocol):
    """What an activation needs of the alarm scheduler (alarms.py)."""

    def opened(self, act: Activation, state: AlarmState) -> None: ...

    async def set(
        self, act: Activation, at: float, *, durable: bool = True, wait: bool = True
    ) -> None: ...

    async def delete(self, act: Activation, *, wait: bool = True) -> None: ...


class SocketIndex(Protocol):
    """The host's WebSockets (sockets.py), as an activation reads them."""

    def of(self, address: str, tag: str | None = None) -> list[WebSocket]: ...


class ActivationHost(Protocol):
    """What an activation needs of its host."""

    storage: StorageBackend
    clock: Clock
    rng: random.Random
    stats: HostStats

    @property
    def registry(self) -> Registry: ...

    @property
    def alarms(self) -> ActorAlarms: ...

    @property
    def sockets(self) -> SocketIndex: ...

    def buggify(self, site: str) -> bool: ...

    def register_soon(
        self, address: str, sync: Callable[[], Coroutine[Any, Any, None]]
    ) -> None: ...

    def new_gate(self, act: Activation, db: Database) -> Gate: ...

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
    ) -> Coroutine[Any, Any, Response]: ...

    async def call_rpc(
        self,
        caller: str,
        chain: tuple[str, ...],
        address: str,
        method: str,
        args: dict[str, Any],
        timeout: float | None,
    ) -> Any: ...

    def call_op(
        self,
        caller: str,
        chain: tuple[str, ...],
        address: str,
        op: Operation,
        values: Mapping[str, Any],
        timeout: float | None,
    ) -> Coroutine[Any, Any, Response]: ...


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
        "actor_class",
        "address",
        "alarm",
        "alarm_touched",
        "checkpointing",
        "class_name",
        "class_stats",
        "closed",
        "current",
        "db",
        "gate",
        "host",
        "inbox",
        "index_durable",
        "instance",
        "last_used",
        "name",
        "parked",
        "reset_pending",
        "sa_engine",
        "sql",
        "task",
    )

    def __init__(
        self, host: ActivationHost, actor_class: ActorClass, address: str, name: str
    ) -> None:
        self.host = host
        self.actor_class = actor_class
        self.address = address
        self.class_name = actor_class.name
        self.class_stats = host.stats.of_class(actor_class.name)
        self.name = name
        self.inbox: deque[Event] = deque()
        self.task: Task | None = None
        self.parked = False  # the worker waits for an event
        self.closed = False  # out of the table: its worker ends after the running event
        self.current: Event | None = None
        self.db: Database | None = None
        self.gate: Gate | None = None  # the database's output gate, while it is open
        self.reset_pending = False  # a sync failed: close the database once no event runs
        self.checkpointing = False  # a checkpoint of its log is under way
        self.sql: Sql | None = None
        self.instance: Actor | None = None
        self.alarm: AlarmState | None = None
        self.alarm_touched = False  # the running event set, cleared or deleted the alarm
        self.index_durable = False  # this address has an index entry that power loss keeps
        self.sa_engine: sqlalchemy.Engine | None = None
        self.last_used = trio.current_time()

    # -- database -------------------------------------------------------------------------
    def open_db(self) -> Database:
        """Open the actor's database: ``StorageDamaged`` (or a damage error of SQLite's) if it
        is not what the host knows of it (see registry.py)."""
        host = self.host
        registered = host.registry.has(self.address)
        existed = registered or host.storage.exists(self.class_name, self.name)
        db = host.storage.open_actor(self.class_name, self.name, existing=registered)
        host.stats.opens += 1
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
            state = read_alarm(conn)
        except BaseException:
            db.close()
            raise
        self.db = db
        self.gate = gate = host.new_gate(self, db)
        if existed:
            # What the file holds may not be durable (written before a crash, refused by a
            # failed sync, closed without a sync): nothing leaves before a sync covers it.
            gate.write()
        self.sql = Sql(db.conn, gate)
        # What the file holds decides, not what an earlier open of it held: a file restored
        # from the cluster's store after a failed sync may lack the row (or hold another).
        self.alarm = None
        if state is not None:
            host.alarms.opened(self, state)
        if not registered:
            host.register_soon(self.address, gate.sync)
        return db

    async def sync(self) -> None:
        """Make every write of the actor committed so far durable (through its gate)."""
        gate = self.gate
        if gate is None:
            raise RuntimeError(f"{self.address}: its database is closed")
        await gate.sync()

    async def open(self) -> None:
        """Open the actor's database unless it is open, once an earlier database of the actor
        has finished closing (storage.py)."""
        await self.host.storage.ready(self.class_name, self.name)
        if self.db is None:
            self.open_db()

    @property
    def where(self) -> str | None:
        """Where the actor's database lives (for logs), if it is open."""
        return self.db.where if self.db is not None else None

    def rollback(self) -> None:
        """Roll back the handler's open transaction. A run's (decision 0030) holds whole
        statements of earlier events: it commits, as their statements would have alone."""
        try:
            if self.sql is not None:
                self.sql.settle()
        finally:
            if self.db is not None and self.db.conn.in_transaction:
                self.db.conn.execute("ROLLBACK")
            if self.sql is not None:
                self.sql.rolled_back()

    def close(self) -> None:
        self.closed = True
        self.close_db()

    def close_db(self) -> None:
        """Discard the instance and close the database (a sync in flight still ends, and
        releases or refuses what its gate holds)."""
        self.discard_instance()
        if self.sa_engine is not None:
            self.sa_engine.dispose(close=False)
            self.sa_engine = None
        if self.db is not None:
            with contextlib.suppress(Exception):
                self.rollback()
            self.db.close()
            self.db = None
            self.gate = None
            self.sql = None
        self.reset_pending = False

    # -- instances ------------------------------------------------------------------------
    def new_instance(self) -> Actor:
        inst = self.actor_class.cls()
        inst.address = self.address
        inst.class_name = self.class_name
        inst.name = self.name
        inst.options = self.actor_class.options
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

    # -- the actor's context (context.ActorContext) ----------------------------------------
    def now(self) -> float:
        return self.host.clock.now()

    @property
    def rng(self) -> random.Random:
        return self.host.rng

    def buggify(self, site: str) -> bool:
        return self.host.buggify(site)

    def count(self, counter: str, n: int, label: str) -> None:
        self.host.stats.count(self.actor_class.name, counter, label, n)

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

    async def set_alarm(self, at: float, *, durable: bool, wait: bool) -> None:
        await self.host.alarms.set(self, at, durable=durable, wait=wait)

    def get_alarm(self) -> float | None:
        return self.alarm.at if self.alarm is not None else None

    async def delete_alarm(self, *, wait: bool) -> None:
        await self.host.alarms.delete(self, wait=wait)

    async def delete_all(self) -> None:
        db = self.db
        if db is None or self.gate is None or self.sql is None:
            raise RuntimeError(f"{self.address}: its database is closed")
        self.sql.settle()  # a run's transaction commits first (decision 0030)
        conn = db.conn
        if conn.in_transaction:
            raise RuntimeError("delete_all() cannot run inside a transaction: commit it first")
        found = conn.execute(
            "SELECT type, name FROM sqlite_master WHERE type IN ('table', 'view', 'trigger') "
            "AND lower(substr(name, 1, 7)) != 'sqlite_' AND name NOT IN (?, ?)",
            (IDENTITY_TABLE, ALARM_TABLE),
        ).fetchall()
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Tables that refer to each other go in one transaction: check their keys at the end.
            conn.execute("PRAGMA defer_foreign_keys = ON")
            for kind, name in sorted(found, key=lambda row: row[0] == "table"):  # tables last
                quoted = '"' + name.replace('"', '""') + '"'
                conn.execute(f"DROP {kind.upper()} IF EXISTS {quoted}")
            conn.execute("PRAGMA user_version = 0")  # a schema version of the tables dropped
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        await self.host.alarms.delete(self, wait=True)
        await self.sync()  # the drops, when there was no alarm to delete
        self.discard_instance()  # the next event sets up a new instance on the empty database

    def websockets(self, tag: str | None) -> list[WebSocket]:
        return self.host.sockets.of(self.address, tag)

    def chain_for_call(self) -> tuple[str, ...]:
        """The call chain of a call this actor makes now."""
        ev = self.current
        return (*ev.chain, self.address) if ev is not None else (self.address,)

    def call(
        self,
        address: str,
        method: str,
        path: str,
        body: bytes,
        headers: Mapping[str, str] | None,
        timeout: float | None,
    ) -> Coroutine[Any, Any, Response]:
        chain = self.chain_for_call()
        call = self.host.call(self.address, chain, address, method, path, body, headers, timeout)
        gate = self.gate
        if gate is not None and gate.closed:
            return _after_gate(gate, call)
        return call

    def call_rpc(
        self, address: str, method: str, args: dict[str, Any], timeout: float | None
    ) -> Coroutine[Any, Any, Any]:
        chain = self.chain_for_call()
        call = self.host.call_rpc(self.address, chain, address, method, args, timeout)
        gate = self.gate
        if gate is not None and gate.closed:
            return _after_gate(gate, call)
        return call

    def call_op(
        self, address: str, op: Operation, values: Mapping[str, Any], timeout: float | None
    ) -> Coroutine[Any, Any, Response]:
        chain = self.chain_for_call()
        call = self.host.call_op(self.address, chain, address, op, values, timeout)
        gate = self.gate
        if gate is not None and gate.closed:
            return _after_gate(gate, call)
        return call


async def _after_gate(gate: Gate, call: Coroutine[Any, Any, Any]) -> Any:
    """A call that leaves once the writes before it are durable (the output gate)."""
    try:
        await gate.wait()
    except BaseException:
        call.close()
        raise
    return await call
