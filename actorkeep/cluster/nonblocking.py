"""A host's commits on its event loop (decision 0016, amended at stop 42): the store's commit
statement sent on the commits' own connection in libpq's nonblocking mode, its reply awaited
with trio (through a cancellation, once it is sent). A commit then costs no hand-off to a
thread and back, and the thread no turn at the interpreter lock while the actors' events run.
Opening the connection again (after PostgreSQL restarted or failed over) blocks, so it runs
in a thread.

The statements are the store's own (``COMMIT_ONE``, ``COMMIT_FRAMES``), prepared once a
connection with their ``%(name)s`` parameters numbered; the parameters go in PostgreSQL's
binary format, with their types given (one-dimensional arrays for ``COMMIT_FRAMES``).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

import psycopg
import trio
from psycopg import pq

from .connections import Link, NotSent, ended_by_server
from .records import AlarmChange, Write
from .store import COMMIT_FRAMES, COMMIT_ONE, check_held, commit_statement

#: ``run(fn)``: ``fn()`` in a thread, awaited.
RunInThread = Callable[[Callable[[], Any]], Awaitable[Any]]

# PostgreSQL's type ids: each scalar type, and its one-dimensional array.
_INT4, _INT8, _FLOAT8, _TEXT, _BYTEA = 23, 20, 701, 25, 17
_ARRAY_OF: Final = {_INT4: 1007, _INT8: 1016, _FLOAT8: 1022, _TEXT: 1009, _BYTEA: 1001}
_NUMBERS: Final = {
    _INT4: struct.Struct(">i"),
    _INT8: struct.Struct(">q"),
    _FLOAT8: struct.Struct(">d"),
}
_LENGTH = struct.Struct(">i")
_ARRAY_HEAD = struct.Struct(">iiIii")  # dimensions, has nulls, element type, length, lower bound
_EMPTY_ARRAY = struct.Struct(">iiI")  # no dimensions, no nulls, element type

#: Each statement's parameters: name -> (element type, whether an array).
_TYPES: Final[dict[str, dict[str, tuple[int, bool]]]] = {
    COMMIT_ONE: {
        "partition": (_INT4, False),
        "epoch": (_INT8, False),
        "address": (_TEXT, False),
        "seq": (_INT8, False),
        "data": (_BYTEA, False),
    },
    COMMIT_FRAMES: {
        "parts": (_INT4, True),
        "epochs": (_INT8, True),
        "n": (_INT8, False),
        "addresses": (_TEXT, True),
        "seqs": (_INT8, True),
        "partitions": (_INT4, True),
        "frame_epochs": (_INT8, True),
        "data": (_BYTEA, True),
        "put_addresses": (_TEXT, True),
        "put_partitions": (_INT4, True),
        "put_at": (_FLOAT8, True),
        "dropped": (_TEXT, True),
    },
}


def numbered(query: str) -> tuple[bytes, list[str]]:
    """``query`` with its ``%(name)s`` (or ``%(name)b``) parameters as ``$1``, ``$2``...; the
    names, in that order."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"

    if "%%" in query:
        raise ValueError("a query with a literal % is not numbered here")
    return re.sub(r"%\((\w+)\)[sb]", number, query).encode(), names


def _scalar(kind: int, value: Any) -> bytes:
    number = _NUMBERS.get(kind)
    if number is not None:
        return number.pack(value)
    return value.encode() if kind == _TEXT else bytes(value)


def encode(kind: int, array: bool, value: Any) -> bytes:
    """``value`` in PostgreSQL's binary format for ``kind`` (an array of them if ``array``)."""
    if not array:
        return _scalar(kind, value)
    if not value:
        return _EMPTY_ARRAY.pack(0, 0, kind)
    items = [_scalar(kind, item) for item in value]
    parts = [_ARRAY_HEAD.pack(1, 0, kind, len(items), 1)]
    for item in items:
        parts += (_LENGTH.pack(len(item)), item)
    return b"".join(parts)


def held_partitions(value: bytes | None) -> list[int]:
    """``array_agg(partition)`` as text (``{1,5}``, or NULL) as a list."""
    if value is None or value == b"{}":
        return []
    return [int(p) for p in value.strip(b"{}").split(b",")]


class _Prepared:
    __slots__ = ("formats", "kinds", "name", "names", "sql", "types")

    def __init__(self, name: bytes, query: str) -> None:
        self.name = name
        self.sql, self.names = numbered(query)
        self.kinds = [_TYPES[query][n] for n in self.names]
        self.types = [_ARRAY_OF[k] if array else k for k, array in self.kinds]
        self.formats = [pq.Format.BINARY] * len(self.names)


_STATEMENTS: Final = {
    COMMIT_ONE: _Prepared(b"actorkeep_commit_one", COMMIT_ONE),
    COMMIT_FRAMES: _Prepared(b"actorkeep_commit_frames", COMMIT_FRAMES),
}


class NonblockingCommits:
    """``commit`` for the committer, on the trio thread, over ``link`` (the store's commits'
    connection, used by nothing else once this runs). ``in_thread`` opens it again when it is
    broken or the server ended it."""

    def __init__(self, link: Link, in_thread: RunInThread) -> None:
        self._link = link
        self._in_thread = in_thread
        self._ready: psycopg.Connection[Any] | None = None  # the connection prepared

    async def commit(self, writes: Sequence[Write], alarms: Sequence[AlarmChange]) -> None:
        """As ``ClusterStore.commit``: ``Fenced``; ``NotSent`` if the connection could not be
        opened (nothing was sent); another error if its outcome is unknown. Once sent, the
        statement's end is awaited even if the caller is cancelled, as a commit in a thread
        was: its outcome is then known."""
        statement = commit_statement(writes, alarms)
        if statement is None:
            return
        query, params, parts = statement
        prepared = _STATEMENTS[query]
        values = [
            encode(kind, array, params[name])
            for name, (kind, array) in zip(prepared.names, prepared.kinds, strict=True)
        ]
        conn = await self._connection()
        await trio.lowlevel.checkpoint_if_cancelled()  # cancelled: nothing is sent
        pgconn = conn.pgconn
        try:
            pgconn.send_query_prepared(
                prepared.name, values, param_formats=prepared.formats, result_format=pq.Format.TEXT
            )
            with trio.CancelScope(shield=True):
                results = await _results(pgconn)
        except BaseException:
            conn.close()  # in an unknown state: the next commit opens another
            raise
        failed = [r for r in results if r.status != pq.ExecStatus.TUPLES_OK]
        if failed or len(results) != 1:
            # An error at the commit itself follows the statement's rows: the transaction
            # rolled back, but this is read as unknown, as any failed statement is.
            message = failed[0].get_error_message() if failed else f"{len(results)} results"
            raise psycopg.OperationalError(f"a commit failed: {message}")
        check_held(parts, held_partitions(results[0].get_value(0, 0)))

    async def _connection(self) -> psycopg.Connection[Any]:
        conn = self._ready
        if conn is not None and _usable(conn):
            return conn
        self._ready = None
        try:
            self._ready = await self._in_thread(self._prepare)
        except psycopg.OperationalError as exc:
            if isinstance(exc, NotSent):
                raise
            raise NotSent(f"could not prepare the commits on the cluster's store: {exc}") from exc
        return self._ready

    def _prepare(self) -> psycopg.Connection[Any]:
        """In a thread: the link's connection (opened again if it must be), its statements
        prepared, in nonblocking mode."""
        with self._link.use() as conn:
            # Text goes as UTF-8 bytes, which the server reads in the client's encoding.
            conn.execute("SET client_encoding TO 'UTF8'")
            pgconn = conn.pgconn
            for prepared in _STATEMENTS.values():
                result = pgconn.prepare(prepared.name, prepared.sql, prepared.types)
                if result.status != pq.ExecStatus.COMMAND_OK:
                    conn.close()
                    message = result.get_error_message()
                    raise psycopg.OperationalError(f"could not prepare a commit: {message}")
            pgconn.nonblocking = 1  # as psycopg leaves it: the point is not to block
            return conn


def _usable(conn: psycopg.Connection[Any]) -> bool:
    """Whether ``conn`` can take a statement now: open, idle, and not written to by the server
    while it was idle (``ended_by_server``: then it is opened again, as ``Link`` does)."""
    if conn.closed or ended_by_server(conn):
        return False
    pgconn = conn.pgconn
    return pgconn.transaction_status == pq.TransactionStatus.IDLE and not pgconn.is_busy()


async def _results(pgconn: pq.abc.PGconn) -> list[pq.abc.PGresult]:
    """Every result of the statement just sent on ``pgconn`` (nonblocking), once it ended."""
    fd = pgconn.socket
    while pgconn.flush():
        await trio.lowlevel.wait_writable(fd)
    results: list[pq.abc.PGresult] = []
    while True:
        pgconn.consume_input()
        if pgconn.is_busy():
            await trio.lowlevel.wait_readable(fd)
            continue
        result = pgconn.get_result()
        if result is None:
            return results
        results.append(result)
