"""What a data directory holds, read without writing it: actors by prefix, one actor's tables
and alarm, a read-only query on an actor's database (docs/operations.md).

The admin API calls these inside a running host (``admin.py``), the CLI on a directory no host
serves (``commands.py``). Reading an actor's database never writes it (``read`` says how, and
when it may create SQLite's ``-shm`` file).
"""

from __future__ import annotations

import base64
import math
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

from ..address import actor_path, check_class_name, split_address
from ..runtime.alarm_store import ACTOR_TABLE, read_alarm
from ..runtime.damage import IDENTITY_TABLE, read_address
from ..runtime.registry import Registry

DEFAULT_PAGE = 100
MAX_PAGE = 1000
#: Rows a query returns at most, and their bytes; the answer says when there were more.
MAX_ROWS = 1000
MAX_ANSWER_BYTES = 16 << 20
#: Rows counted per table by ``show``; past them it says "over".
MAX_COUNT = 1_000_000
#: SQLite virtual-machine steps a query may take (a second or so): then it is stopped.
MAX_STEPS = 20_000_000
_STEP_CHECK = 10_000
#: The tables the runtime keeps in every actor's database.
INTERNAL_TABLES = frozenset({IDENTITY_TABLE, ACTOR_TABLE})
_ADDRESS_CHARS = frozenset(
    "abcdefghijklmnopqrstuvwxyz0123456789-/ABCDEFGHIJKLMNOPQRSTUVWXYZ._~:@+="
)
_MAX_ADDRESS = 64 + 1 + 200
T = TypeVar("T")


class InspectError(ValueError):
    """A request the inspector refuses, or a query SQLite refused: the message says why."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def address_prefix(class_name: str | None, prefix: str) -> str:
    """The address prefix that ``ls [CLASS] [--prefix P]`` lists (``InspectError`` if no
    address could start with it)."""
    if class_name is not None:
        try:
            check_class_name(class_name)
        except ValueError as exc:
            raise InspectError(str(exc)) from None
        prefix = f"{class_name}/{prefix}"
    if len(prefix) > _MAX_ADDRESS or not set(prefix) <= _ADDRESS_CHARS:
        raise InspectError(f"no actor address starts with {prefix!r}")
    return prefix


def page_size(limit: int | None) -> int:
    """``limit`` checked: 1 to ``MAX_PAGE``, ``DEFAULT_PAGE`` when None."""
    if limit is None:
        return DEFAULT_PAGE
    if not 1 <= limit <= MAX_PAGE:
        raise InspectError(f"limit must be 1-{MAX_PAGE}, got {limit}")
    return limit


def list_actors(registry: Registry, prefix: str, after: str | None, limit: int) -> dict[str, Any]:
    """A page of the registered actors whose address starts with ``prefix``, after the address
    ``after``: ``{"actors": [{"address", "created_at"}], "next": cursor or None}``."""
    rows = registry.page(prefix, after, limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    return {
        "actors": [{"address": address, "created_at": created} for address, created in rows],
        "next": rows[-1][0] if more else None,
    }


def list_alarms(rows: Sequence[tuple[str, float]], limit: int) -> dict[str, Any]:
    """A page of alarm entries (``(address, at)``, one more than ``limit`` asked for)."""
    more = len(rows) > limit
    rows = rows[:limit]
    return {
        "alarms": [{"address": address, "at": at} for address, at in rows],
        "next": f"{rows[-1][1]!r} {rows[-1][0]}" if more else None,
    }


def alarm_cursor(after: str | None) -> tuple[float, str] | None:
    """The ``next`` of an alarm page read back (``InspectError`` if it is not one)."""
    if after is None:
        return None
    at, _, address = after.partition(" ")
    try:
        split_address(address)
        return float(at), address
    except ValueError:
        raise InspectError(f"not an alarm cursor: {after!r}") from None


def database_path(actors_root: Path, address: str) -> Path:
    """The database file of ``address`` (``InspectError`` if it is not an address)."""
    try:
        class_name, name = split_address(address)
    except ValueError as exc:
        raise InspectError(str(exc)) from None
    return actor_path(actors_root, class_name, name)


@contextmanager
def open_read_only(
    path: Path, max_steps: int = MAX_STEPS, immutable: bool = False
) -> Iterator[sqlite3.Connection]:
    """A connection to the database at ``path`` that cannot write, whose statements are
    stopped after ``max_steps`` steps (``InspectError`` 404 if there is no database).
    ``immutable``: read the file alone, taking no lock and creating no file (``read``)."""
    try:
        if path.stat().st_size == 0:
            raise InspectError("the actor's database is empty", 404)
    except FileNotFoundError:
        raise InspectError("no such actor", 404) from None
    uri = f"file:{quote(str(path))}?mode=ro" + ("&immutable=1" if immutable else "")
    try:
        conn = sqlite3.connect(uri, uri=True, isolation_level=None)
    except sqlite3.Error as exc:
        raise InspectError(f"cannot open the actor's database: {exc}", 500) from None
    try:
        conn.execute("PRAGMA query_only=1")
        conn.set_authorizer(_only_reads)
        # No value past the answer's size (randomblob(1e9) would be one step).
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_ANSWER_BYTES)
        steps = [0]

        def progress() -> int:
            steps[0] += _STEP_CHECK
            return 1 if steps[0] > max_steps else 0

        conn.set_progress_handler(progress, _STEP_CHECK)
        yield conn
    finally:
        conn.close()


def read(path: Path, fn: Callable[[sqlite3.Connection], T], max_steps: int = MAX_STEPS) -> T:
    """``fn(conn)`` on a read-only connection to the database at ``path``.

    A database with a write-ahead log is read beside its host, in the log's snapshot (SQLite
    creates its ``-shm`` index if the log has none, as after a crash). One without is read
    *immutable*, which creates no ``-wal`` or ``-shm`` file (plain read-only would, and leave
    them); if the file changed meanwhile or a log appeared (a host opened the actor and wrote
    it), the read is done again beside the log, whose snapshot is consistent.
    """
    wal = path.with_name(path.name + "-wal")
    if wal.exists():
        with open_read_only(path, max_steps) as conn:
            return fn(conn)
    before = _identity(path)

    def changed() -> bool:
        return wal.exists() or _identity(path) != before

    try:
        with open_read_only(path, max_steps, immutable=True) as conn:
            result = fn(conn)
    except InspectError:
        if not changed():
            raise
    else:
        if not changed():
            return result
    with open_read_only(path, max_steps) as conn:
        return fn(conn)


def _identity(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


_READS = frozenset(
    {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
)


def _only_reads(action: int, *_: object) -> int:
    return sqlite3.SQLITE_OK if action in _READS else sqlite3.SQLITE_DENY


def describe_actor(actors_root: Path, address: str) -> dict[str, Any]:
    """One actor's database: its file's size, its tables with their row counts (None when
    counting took too long), its alarm and when it was created."""
    path = database_path(actors_root, address)
    size = _size(path) + _size(path.with_name(path.name + "-wal"))

    def look(conn: sqlite3.Connection) -> tuple[list[dict[str, Any]], Any, Any]:
        try:
            names = [
                row[0]
                for row in conn.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table' "
                    "AND lower(substr(name, 1, 7)) != 'sqlite_' ORDER BY name"
                )
            ]
            tables = [
                {"name": name, "rows": _count(conn, name), "internal": name in INTERNAL_TABLES}
                for name in names
            ]
            return tables, read_alarm(conn), read_address(conn)
        except sqlite3.Error as exc:
            raise InspectError(f"cannot read the actor's database: {exc}", 500) from None

    tables, alarm, identity = read(path, look)
    return {
        "address": address,
        "file": str(path),
        "bytes": size,
        "created_at": identity[1] if identity else None,
        "tables": tables,
        "alarm": None
        if alarm is None
        else {"at": alarm.at, "scheduled_at": alarm.scheduled_at, "retries": alarm.retry_count},
    }


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _count(conn: sqlite3.Connection, table: str) -> int | None:
    """The table's rows, or None past ``MAX_COUNT`` (counted row by row, so that the step
    budget holds: a bare ``count(*)`` is one step however big the table)."""
    quoted = '"' + table.replace('"', '""') + '"'
    try:
        (n,) = conn.execute(
            f"SELECT count(*) FROM (SELECT 1 FROM {quoted} LIMIT {MAX_COUNT + 1})"
        ).fetchone()
    except sqlite3.OperationalError:  # interrupted, or a virtual table reads refuse
        return None
    return int(n) if n <= MAX_COUNT else None


def query(
    actors_root: Path,
    address: str,
    sql: str,
    params: Sequence[object] = (),
    max_rows: int = MAX_ROWS,
    max_steps: int = MAX_STEPS,
) -> dict[str, Any]:
    """Run one read-only statement on an actor's database: ``{"columns", "rows",
    "truncated"}``, values as JSON can carry them (``jsonable``)."""
    if not isinstance(sql, str) or not sql.strip():
        raise InspectError("want one SQL statement")
    if not isinstance(params, list | tuple) or not all(_bindable(p) for p in params):
        raise InspectError("params must be a list of 64-bit integers, numbers, strings and nulls")
    if not _encodable(sql):
        raise InspectError("the SQL is not valid Unicode text")

    def run(conn: sqlite3.Connection) -> tuple[list[str], list[Any], bool]:
        # Row by row: a value may be up to MAX_ANSWER_BYTES, so rows are kept only while the
        # answer stays within it, not read by the thousand first.
        rows: list[Any] = []
        size = 0
        try:
            cursor = conn.execute(sql, params)
            for row in cursor:
                size += sum(len(v) if isinstance(v, str | bytes) else 8 for v in row)
                if len(rows) == max_rows or size > MAX_ANSWER_BYTES:
                    return [d[0] for d in cursor.description or ()], rows, True
                rows.append(row)
        except sqlite3.DatabaseError as exc:
            if "interrupted" in str(exc):
                raise InspectError(
                    f"the query took over {max_steps:,} SQLite steps and was stopped: narrow it "
                    "(a WHERE on an indexed column, a LIMIT)"
                ) from None
            if "not authorized" in str(exc) or "readonly" in str(exc):
                raise InspectError(f"only reads are allowed: {exc}") from None
            raise InspectError(f"SQLite refused the query: {exc}") from None
        except (sqlite3.ProgrammingError, sqlite3.Warning) as exc:  # e.g. two statements
            raise InspectError(f"SQLite refused the query: {exc}") from None
        return [d[0] for d in cursor.description or ()], rows, False

    columns, rows, truncated = read(database_path(actors_root, address), run, max_steps)
    out = [[jsonable(v) for v in row] for row in rows]
    return {"columns": columns, "rows": out, "truncated": truncated}


def _bindable(value: object) -> bool:
    if value is None or isinstance(value, float):
        return True
    if isinstance(value, int) and not isinstance(value, bool):
        return -(1 << 63) <= value < 1 << 63
    return isinstance(value, str) and _encodable(value)


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:  # a lone surrogate: SQLite takes UTF-8 only
        return False
    return True


def jsonable(value: object) -> object:
    """A SQLite value as JSON carries it: blobs as ``{"base64": ...}``, infinities as
    ``{"float": "inf"}`` (or ``"-inf"``)."""
    if isinstance(value, bytes):
        return {"base64": base64.b64encode(value).decode()}
    if isinstance(value, float) and math.isinf(value):
        return {"float": "inf" if value > 0 else "-inf"}
    return value
