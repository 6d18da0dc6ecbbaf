"""Planted bugs in the runtime's migrate path (``Host(migrator=...)``), each a way to get
"one transaction with its version, durable before the actor answers" wrong."""

from __future__ import annotations

import sqlite3

from actorkeep.errors import MigrationError
from actorkeep.migrations import Step, run
from actorkeep.runtime.activation import Activation
from actorkeep.runtime.gate import Gate
from actorkeep.runtime.migrate import Migrator

from ..bugs import GATE_BUGS


def _run(conn: sqlite3.Connection, step: Step, address: str) -> None:
    """The migration's statements or function on ``conn`` as it is, with no transaction of
    its own; ``MigrationError`` naming it if it fails."""
    try:
        run(conn, step)
    except Exception as exc:
        raise MigrationError(
            f"{address}: {step.label()} failed: {type(exc).__name__}: {exc}",
            address=address,
            version=step.number - 1,
            number=step.number,
            name=step.name,
        ) from exc


class VersionApart(Migrator):
    """Commits each migration and makes it durable, then sets the version in a commit of its
    own: a crash between the two leaves the migration applied at the version before it, and
    the next activation applies it again."""

    async def apply(self, act: Activation, step: Step) -> None:
        assert act.db is not None
        conn = act.db.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            _run(conn, step, act.address)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        await act.sync()
        conn.execute(f"PRAGMA user_version = {step.number}")


class Unsynced(Migrator):
    """Applies the migrations but answers before they are durable: power loss after an
    answer that saw them can undo them, and the next activation runs them again."""

    async def settle(self, act: Activation) -> None:
        return None


class NoTransaction(Migrator):
    """Runs a migration's statements each in a commit of its own, not in one transaction with
    its version: one that fails half-way keeps what it did before it failed, and does it again
    when it is retried."""

    async def apply(self, act: Activation, step: Step) -> None:
        assert act.db is not None
        _run(act.db.conn, step, act.address)
        act.db.conn.execute(f"PRAGMA user_version = {step.number}")


MIGRATION_BUGS: dict[str, type[Migrator] | type[Gate]] = {
    "migration-version-apart": VersionApart,
    "migration-unsynced": Unsynced,
    "migration-no-transaction": NoTransaction,
    **GATE_BUGS,
}
