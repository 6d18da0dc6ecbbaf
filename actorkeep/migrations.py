"""Per-actor schema migrations (docs/migrations.md).

An actor class lists its migrations in order, ``migrations = ["CREATE TABLE ...", fn, ...]``:
SQL text (one or more statements) or a function ``fn(sql: ak.MigrationSql) -> None``. An
actor's database is at version ``PRAGMA user_version``, the number of migrations applied to
it. The host applies the missing ones when it makes an instance of the actor, before
``setup()``, each in its own transaction together with the bump of ``user_version``, so a
crash or a power loss leaves a database at one version or the next, never in between.

This module checks the declarations (at class definition) and applies migrations to a
``sqlite3`` connection; the host (``runtime/migrate.py``) and ``actorkeep migrate``
(``ops/migrate.py``) both go through ``apply``.
"""

from __future__ import annotations

import inspect
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import MigrationError

#: Migration functions get this; SQL text is run statement by statement.
MigrationFn = Callable[["MigrationSql"], None]
Migration = str | MigrationFn

_NAME_WIDTH = 60
#: What a migration may not do: end or open the runtime's transaction, touch other files, or
#: set the version the runtime keeps.
_DENIED = {
    sqlite3.SQLITE_TRANSACTION: "BEGIN, COMMIT or ROLLBACK",
    sqlite3.SQLITE_ATTACH: "ATTACH",
    sqlite3.SQLITE_DETACH: "DETACH",
}


@dataclass(frozen=True)
class Step:
    """One declared migration: ``number`` is the version it brings the database to."""

    number: int
    name: str
    statements: tuple[str, ...] = ()
    fn: MigrationFn | None = None

    def label(self) -> str:
        """``"migration 2 (split_name)"``, as errors name it."""
        return f"migration {self.number} ({self.name})"


class MigrationSql:
    """What a migration function gets: statements on the actor's database, inside the
    transaction the migration runs in (it commits with the version bump, or rolls back)."""

    __slots__ = ("_conn",)

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def exec(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> sqlite3.Cursor:
        """Run one statement (``sqlite3.Cursor``: fetch rows from it as usual)."""
        return self._conn.execute(sql, params)

    def executemany(self, sql: str, rows: Any) -> sqlite3.Cursor:
        """Run one statement once per parameter set of ``rows``."""
        return self._conn.executemany(sql, rows)


def split_statements(text: str) -> list[str]:
    """The statements of ``text`` (split where SQLite would end one: ``;`` outside strings,
    comments and trigger bodies); ``ValueError`` if the last one is incomplete."""
    out: list[str] = []
    buf = ""
    pieces = text.split(";")
    for i, piece in enumerate(pieces):
        buf += piece
        if i == len(pieces) - 1:
            break
        buf += ";"
        if sqlite3.complete_statement(buf):
            if _has_code(buf):
                out.append(buf.strip())
            buf = ""
    if _has_code(buf):
        if not sqlite3.complete_statement(buf + ";"):
            raise ValueError(f"incomplete SQL statement: {buf.strip()[:_NAME_WIDTH]!r}")
        out.append(buf.strip() + ";")  # the last statement, without its semicolon
    return out


def _has_code(sql: str) -> bool:
    """Whether ``sql`` holds more than blanks and comments."""
    lines = [line.split("--", 1)[0] for line in sql.splitlines()]
    text = " ".join(lines)
    while "/*" in text:
        head, _, rest = text.partition("/*")
        text = head + " " + rest.partition("*/")[2]
    return bool(text.strip(" \t\r\n;"))


def _name_of(migration: Migration) -> str:
    if isinstance(migration, str):
        for line in migration.splitlines():
            line = line.strip()
            if line and not line.startswith("--"):
                return line if len(line) <= _NAME_WIDTH else line[: _NAME_WIDTH - 3] + "..."
        return "(empty)"
    return getattr(migration, "__name__", None) or repr(migration)


def check_migrations(owner: str, migrations: object) -> tuple[Step, ...]:
    """The declared ``migrations`` of class ``owner`` as steps; ``TypeError`` or
    ``ValueError`` (naming the migration) for a declaration that could not run."""
    if isinstance(migrations, str | bytes) or not isinstance(migrations, list | tuple):
        raise TypeError(
            f"{owner}.migrations must be a list of SQL strings and functions, not "
            f"{type(migrations).__name__}"
        )
    steps: list[Step] = []
    for number, migration in enumerate(migrations, start=1):
        where = f"{owner}.migrations[{number - 1}] (migration {number})"
        if isinstance(migration, str):
            try:
                statements = split_statements(migration)
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
            if not statements:
                raise ValueError(f"{where} has no SQL statement")
            steps.append(Step(number, _name_of(migration), tuple(statements)))
        elif callable(migration):
            if inspect.iscoroutinefunction(migration):
                raise TypeError(
                    f"{where} is async: a migration function is a plain def, run inside the "
                    "migration's transaction"
                )
            steps.append(Step(number, _name_of(migration), fn=migration))
        else:
            raise TypeError(
                f"{where} must be SQL text or a function of ak.MigrationSql, not "
                f"{type(migration).__name__}"
            )
    return tuple(steps)


def version_of(conn: sqlite3.Connection) -> int:
    """The database's schema version: ``PRAGMA user_version``."""
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def pending(
    conn: sqlite3.Connection, steps: Sequence[Step], address: str
) -> tuple[int, list[Step]]:
    """The database's version and the steps it lacks; ``MigrationError`` if it is at a
    version past the last step (a newer app migrated it: a downgrade)."""
    version = version_of(conn)
    if version > len(steps):
        raise MigrationError(
            f"{address}: its database is at version {version}, but its class declares "
            f"{len(steps)} migrations: a newer version of the app migrated it, and a downgrade "
            "is refused (deploy the newer app again)",
            address=address,
            version=version,
        )
    if version < 0:
        raise MigrationError(
            f"{address}: its database is at version {version} (PRAGMA user_version), which no "
            "migration makes",
            address=address,
            version=version,
        )
    return version, list(steps[version:])


def run(conn: sqlite3.Connection, step: Step) -> None:
    """The migration's statements, or its function, on ``conn`` as it is (no transaction of
    its own, no version: ``apply`` gives both)."""
    if step.fn is not None:
        step.fn(MigrationSql(conn))
    else:
        for statement in step.statements:
            conn.execute(statement)


def apply(conn: sqlite3.Connection, step: Step, address: str) -> None:
    """Run ``step`` and set ``user_version`` to its number in one transaction, committed
    (not synced: the caller makes it durable). On failure everything is rolled back and
    ``MigrationError`` names the migration."""
    if conn.in_transaction:
        raise RuntimeError(f"{address}: a migration cannot start inside an open transaction")
    denied: list[str] = []

    def authorize(action: int, arg1: str | None, arg2: str | None, *_: object) -> int:
        what = _DENIED.get(action)
        setting = action == sqlite3.SQLITE_PRAGMA and arg2 is not None
        if what is None and setting and (arg1 or "").lower() == "user_version":
            what = "PRAGMA user_version = ..."
        if what is None:
            return sqlite3.SQLITE_OK
        denied.append(what)
        return sqlite3.SQLITE_DENY

    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.set_authorizer(authorize)
        try:
            run(conn, step)
        finally:
            conn.set_authorizer(None)
        if not conn.in_transaction:
            raise RuntimeError("it ended the migration's transaction")
        conn.execute(f"PRAGMA user_version = {step.number}")
        conn.execute("COMMIT")
    except Exception as exc:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        why = f"{type(exc).__name__}: {exc}"
        if denied:
            why += (
                f" ({denied[0]} is not allowed in a migration: it runs in the transaction "
                "the runtime opens, which sets the version)"
            )
        raise MigrationError(
            f"{address}: {step.label()} failed: {why}; the database stays at version "
            f"{step.number - 1}",
            address=address,
            version=step.number - 1,
            number=step.number,
            name=step.name,
        ) from exc
