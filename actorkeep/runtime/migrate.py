"""Applying an actor class's migrations when the host makes an instance of it
(docs/migrations.md; the declarations and the transaction are ``actorkeep/migrations.py``)."""

from __future__ import annotations

from ..errors import MigrationError
from ..migrations import Step, apply, pending
from .activation import Activation


class Migrator:
    """Brings an actor's database to its class's last migration before any instance runs on
    it. The host makes one (``Host(migrator=...)``: a subclass only for the simulator's
    planted bugs)."""

    async def migrate(self, act: Activation) -> None:
        """Apply the migrations the actor's database lacks, each in its own transaction with
        its version, then make them durable: ``MigrationError`` if one fails (the database
        stays at the version before it) or the database is newer than the class (a
        downgrade)."""
        steps = act.actor_class.cls._ak_migration_steps
        if not steps:
            return  # a class without migrations: user_version is the app's own
        db = act.db
        assert db is not None, "migrate() runs on an open database"
        _, todo = pending(db.conn, steps, act.address)
        if not todo:
            return
        try:
            for step in todo:
                await self.apply(act, step)
        except MigrationError:
            await self.settle(act)  # the ones before it stay: durable, as the error says
            raise
        # One fsync for them all: each commit is atomic, so power loss before it leaves the
        # database at one of the versions in between, which the next open carries on from.
        await self.settle(act)

    async def apply(self, act: Activation, step: Step) -> None:
        """Run ``step`` and set the version it brings, in one transaction (committed)."""
        assert act.db is not None
        apply(act.db.conn, step, act.address)

    async def settle(self, act: Activation) -> None:
        """Make the migrations applied durable, before the actor's instance is made (its
        replies could reveal them)."""
        await act.sync()
