"""``self.sql``: statements on the actor's own database (docs/reference.md §3)."""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

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


class Sql:
    """Runs statements on one actor's database. Autocommit unless inside ``transaction()``.

    ``sync()`` is the database's: it makes every write committed so far durable.
    """

    __slots__ = ("_conn", "_sync")

    def __init__(self, conn: sqlite3.Connection, sync: Callable[[], Awaitable[None]]) -> None:
        self._conn = conn
        self._sync = sync

    def exec(self, sql: str, params: Params = ()) -> sqlite3.Cursor:
        """Run one statement now. Once it has run to completion its effect survives a crash of
        the process (a ``RETURNING`` statement completes when its rows have been fetched)."""
        return self._conn.execute(sql, params)

    async def exec_durable(self, sql: str, params: Params = ()) -> Written:
        """Run one statement to completion and return once it survives power loss.

        Inside a transaction only ``"COMMIT"`` is accepted: it ends the transaction durably.
        """
        conn = self._conn
        if conn.in_transaction and sql.strip().rstrip(";").strip().upper() not in _ENDS:
            raise RuntimeError(
                "exec_durable inside a transaction: run its statements with exec() and end it "
                "with await exec_durable('COMMIT')"
            )
        cur = conn.execute(sql, params)
        rows = cur.fetchall()  # runs the statement to completion, which commits it
        written = Written(rows, cur.lastrowid, cur.rowcount)
        await self._sync()
        return written

    async def sync(self) -> None:
        """Make every earlier write of this actor durable (one fsync for many plain writes)."""
        await self._sync()

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT``, or ``ROLLBACK`` if the block raises."""
        conn = self._conn
        if conn.in_transaction:
            raise RuntimeError("a transaction is already open")
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        if conn.in_transaction:  # the block may have ended it with exec_durable("COMMIT")
            conn.execute("COMMIT")

    @property
    def in_transaction(self) -> bool:
        return self._conn.in_transaction
