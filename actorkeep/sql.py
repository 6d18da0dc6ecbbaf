"""``self.sql``: statements on the actor's own database (docs/reference.md §3)."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any, Literal, Protocol, overload

Params = Sequence[Any] | dict[str, Any]
_ENDS = frozenset({"COMMIT", "END", "COMMIT TRANSACTION", "END TRANSACTION"})


class Written:
    """The outcome of ``exec_durable``: the statement has run to completion and is durable."""

    __slots__ = ("lastrowid", "rowcount", "rows")

    def __init__(self, rows: list[Any], lastrowid: int | None, rowcount: int) -> None:
        self.rows = rows
        self.lastrowid = lastrowid
        self.rowcount = rowcount

    def fetchone(self) -> Any:
        return self.rows[0] if self.rows else None

    def fetchall(self) -> list[Any]:
        return self.rows


class DurablePoint(Protocol):
    """What ``Sql`` needs of the actor's output gate (runtime/gate.py)."""

    def write(self) -> None:
        """A gated write has committed."""

    async def sync(self) -> None:
        """Until every write committed so far is durable."""


#: What a run's transaction takes: gated writes of these kinds, plain reads (decision 0030).
_GATED_IN_RUN = frozenset({"INSERT", "UPDATE", "DELETE", "REPLACE"})
_READ = frozenset({"SELECT"})
_FIRST_WORD = re.compile(r"\s*([A-Za-z]+)")
_first_words: dict[str, str] = {}


def _first_word(sql: str) -> str:
    """The statement's first keyword, upper case ("" if it starts otherwise, a comment say)."""
    word = _first_words.get(sql)
    if word is None:
        found = _FIRST_WORD.match(sql)
        word = found.group(1).upper() if found else ""
        if len(_first_words) >= 1024:
            _first_words.clear()
        _first_words[sql] = word
    return word


class HeldPoint(DurablePoint, Protocol):
    """What a run of events in one transaction needs of the gate (``Sql.begin_run``)."""

    def hold_syncs(self, settle: Callable[[], None]) -> None: ...

    def release_syncs(self) -> None: ...

    def fail(self, exc: BaseException) -> None: ...


class RunLost(sqlite3.OperationalError):
    """The transaction of a run of events ended before the host committed it (a statement
    SQLite rolls the whole transaction back for: an ``INSERT OR ROLLBACK`` that conflicts, a
    full disk): the gated writes it held are not acknowledged."""


class Sql:
    """Runs statements on one actor's database. Autocommit unless inside ``transaction()``.

    Three ways to write (docs/storage.md): ``exec(sql)`` is plain (survives a crash of the
    process, not power loss); ``exec(sql, durable=True)`` is gated (durable before anyone
    hears of it: the actor's replies and calls wait for it, the actor does not); ``await
    exec_durable(sql)`` and ``await sync()`` are durable when they return.
    """

    __slots__ = ("_conn", "_gate", "_gate_commit", "_run")

    def __init__(self, conn: sqlite3.Connection, gate: DurablePoint) -> None:
        self._conn = conn
        self._gate = gate
        self._gate_commit = False  # the open transaction commits gated
        self._run: HeldPoint | None = None  # the gate, while a run of events is open

    # -- runs: events of one actor in one transaction (decision 0030) ---------------------
    def begin_run(self, gate: HeldPoint) -> None:
        """Open the transaction the next events of the actor share (the host's, between
        events, with no transaction open). Until ``settle``, a gated write counts at once
        (its event's reply waits) and commits with the run; a plain write, a transaction,
        a wait for durability or anything the host must see committed settles first."""
        self._conn.execute("BEGIN")
        self._run = gate
        gate.hold_syncs(self.settle)

    @property
    def in_run(self) -> bool:
        """Whether a run's transaction is open."""
        return self._run is not None

    def settle(self) -> None:
        """Commit the run's transaction, if one is open, and let its sync start. If it was
        lost, or its commit fails, the gate refuses what its writes hold (``RunLost``)."""
        gate = self._run
        if gate is None:
            return
        self._run = None
        conn = self._conn
        try:
            if not conn.in_transaction:
                raise RunLost("the transaction of a run of events ended before its commit")
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            gate.fail(exc)  # first: nothing the run held may be acknowledged
            with suppress(sqlite3.Error):  # the failure may have closed the connection
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            raise
        gate.release_syncs()

    @overload
    def exec(
        self, sql: str, params: Params = ..., *, durable: Literal[False] = ...
    ) -> sqlite3.Cursor: ...

    @overload
    def exec(self, sql: str, params: Params = ..., *, durable: Literal[True]) -> Written: ...

    def exec(
        self, sql: str, params: Params = (), *, durable: bool = False
    ) -> sqlite3.Cursor | Written:
        """Run one statement now. Once it has run to completion its effect survives a crash of
        the process (a ``RETURNING`` statement completes when its rows have been fetched).

        ``durable=True``: a gated write. The statement runs to completion (its rows are
        fetched into the ``Written`` returned) and commits now; it is durable before any
        reply or call of the actor that follows it leaves. Inside a transaction it makes the
        transaction's commit gated.
        """
        conn = self._conn
        if self._run is not None:
            return self._exec_in_run(sql, params, durable)
        if not durable:
            cur = conn.execute(sql, params)
            if self._gate_commit and not conn.in_transaction:
                self._end_gated()  # this statement ended a transaction that commits gated
            return cur
        if conn.in_transaction:
            cur = conn.execute(sql, params)
            rows = cur.fetchall()
            self._gate_commit = True
            if not conn.in_transaction:
                self._end_gated()
            return Written(rows, cur.lastrowid, cur.rowcount)
        cur = conn.execute(sql, params)
        rows = cur.fetchall()  # runs the statement to completion, which commits it
        self._gate.write()
        return Written(rows, cur.lastrowid, cur.rowcount)

    def _exec_in_run(self, sql: str, params: Params, durable: bool) -> sqlite3.Cursor | Written:
        # In the run's transaction: a gated INSERT, UPDATE, DELETE or REPLACE (its reply waits
        # for the run's commit and sync), or a plain SELECT. Anything else commits the run
        # first and runs as outside one: a plain write must be committed before its reply can
        # leave, and a PRAGMA, VACUUM, SAVEPOINT or BEGIN must not land in the run's
        # transaction.
        if _first_word(sql) not in (_GATED_IN_RUN if durable else _READ):
            self.settle()
            return self.exec(sql, params, durable=True) if durable else self.exec(sql, params)
        conn = self._conn
        try:
            cur = conn.execute(sql, params)
        except sqlite3.Error:
            if not conn.in_transaction:  # SQLite rolled the whole transaction back
                self.settle()  # raises RunLost
            raise
        if not durable:
            return cur
        rows = cur.fetchall()
        if not conn.in_transaction:  # an ON CONFLICT ROLLBACK rolled the run back
            self.settle()  # raises RunLost
        self._gate.write()  # counted now: its reply waits for the run's commit and sync
        return Written(rows, cur.lastrowid, cur.rowcount)

    def _end_gated(self) -> None:
        self._gate_commit = False
        self._gate.write()

    async def exec_durable(self, sql: str, params: Params = ()) -> Written:
        """Run one statement to completion and return once it survives power loss.

        Inside a transaction only ``"COMMIT"`` is accepted: it ends the transaction durably.
        """
        self.settle()
        conn = self._conn
        if conn.in_transaction and sql.strip().rstrip(";").strip().upper() not in _ENDS:
            raise RuntimeError(
                "exec_durable inside a transaction: run its statements with exec() and end it "
                "with await exec_durable('COMMIT')"
            )
        cur = conn.execute(sql, params)
        rows = cur.fetchall()  # runs the statement to completion, which commits it
        written = Written(rows, cur.lastrowid, cur.rowcount)
        if self._gate_commit:
            self._end_gated()
        await self._gate.sync()
        return written

    async def sync(self) -> None:
        """Make every earlier write of this actor durable (one fsync for many plain writes)."""
        await self._gate.sync()

    @contextmanager
    def transaction(self, *, durable: bool = False) -> Iterator[None]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT``, or ``ROLLBACK`` if the block raises.
        ``durable=True``: the commit is a gated write."""
        self.settle()
        conn = self._conn
        if conn.in_transaction:
            raise RuntimeError("a transaction is already open")
        conn.execute("BEGIN IMMEDIATE")
        self._gate_commit = durable
        try:
            yield
        except BaseException:
            self._gate_commit = False
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        if conn.in_transaction:  # the block may have ended it with exec_durable("COMMIT")
            conn.execute("COMMIT")
        if self._gate_commit:
            self._end_gated()

    def rolled_back(self) -> None:
        """The host rolled back the open transaction (a failed event): nothing to gate."""
        self._gate_commit = False

    @property
    def in_transaction(self) -> bool:
        """Whether a transaction of the handler's is open (a run's is the host's)."""
        return self._run is None and self._conn.in_transaction
