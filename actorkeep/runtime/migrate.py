"""Applying an actor class's migrations when the host makes an instance of it
(docs/migrations.md; the declarations and the transaction are ``actorkeep/migrations.py``)."""

from __future__ import annotations

from ..migrations import apply, pending
from .activation import Activation


async def migrate(act: Activation) -> None:
    """Bring the actor's database to its class's last migration, durably, before any
    instance runs on it. ``MigrationError`` if a migration fails (the database stays at the
    version before it) or the database is newer than the class (a downgrade)."""
    steps = act.actor_class.cls._ak_migration_steps
    if not steps:
        return  # a class without migrations: user_version is the app's own
    db = act.db
    assert db is not None, "migrate() runs on an open database"
    _, todo = pending(db.conn, steps, act.address)
    if not todo:
        return
    for step in todo:
        apply(db.conn, step, act.address)
    # One fsync for them all: each commit is atomic, so power loss before it leaves the
    # database at one of the versions in between, which the next open carries on from.
    await act.sync()
