"""The app of the migrations scenario, in the three versions the run deploys one after another.

A ledger holds entries (``entry``: an id the client chose, an amount) and a ``journal`` to
which every migration adds its number, so that each migration's effect is there to count:

1. (SQL) the tables; 2. (SQL) an index. The first version has these two and stores dollars.
3. ``to_cents`` (a function): every amount times 100, an effect that doubles if it runs twice.
   The second version's (``to_cents_strict``) also refuses a negative amount (a refund) half-way
   through: on a ledger with a refund it fails, every time, and the ledger stays at version 2
   until the third version, whose ``to_cents`` takes refunds, is deployed.
4. (SQL) another index. The second and third versions store cents.

Every event reports what it saw (``mig.event``: the version, the journal, the migrations its
class declares), and each run of ``to_cents`` to its end reports itself (``mig.ran``).
"""

from __future__ import annotations

from typing import Any

import actorkeep as ak
from actorkeep.runtime.damage import IDENTITY_TABLE

from ..world import World

LEDGER = "ledger"
#: The message of the second version's third migration on a ledger with a refund.
REFUND_REFUSED = "a refund cannot be converted"

V1: list[ak.Migration] = [
    """
    CREATE TABLE entry (id TEXT PRIMARY KEY, amount INTEGER NOT NULL);
    CREATE TABLE journal (number INTEGER NOT NULL);
    INSERT INTO journal VALUES (1);
    """,
    "CREATE INDEX entry_by_amount ON entry (amount); INSERT INTO journal VALUES (2);",
]
LAST = "CREATE INDEX journal_by_number ON journal (number); INSERT INTO journal VALUES (4);"


class Recorder:
    """The world's ear inside the app."""

    def __init__(self) -> None:
        self.world: World | None = None

    def observe(self, kind: str, **detail: Any) -> None:
        world = self.world
        assert world is not None
        world.history.observe(kind, world.now(), **detail)


def make_apps(recorder: Recorder) -> list[ak.App]:
    """The three versions of the app, in the order they are deployed."""

    def converts(strict: bool) -> ak.Migration:
        def to_cents(sql: ak.MigrationSql) -> None:
            sql.exec("UPDATE entry SET amount = amount * 100")
            if strict and sql.exec("SELECT 1 FROM entry WHERE amount < 0").fetchone():
                raise ValueError(REFUND_REFUSED)
            sql.exec("INSERT INTO journal VALUES (3)")
            (address,) = sql.exec(f"SELECT address FROM {IDENTITY_TABLE}").fetchone()
            recorder.observe("mig.ran", address=address, number=3)

        to_cents.__name__ = "to_cents_strict" if strict else "to_cents"
        return to_cents

    def version(declared: list[ak.Migration], scale: int) -> ak.App:
        class Ledger(ak.Actor):
            migrations = declared

            def look(self) -> dict[str, Any]:
                """What this event sees of the schema, reported and returned."""
                seen = {
                    "version": self.sql.exec("PRAGMA user_version").fetchone()[0],
                    "journal": [n for (n,) in self.sql.exec("SELECT number FROM journal")],
                }
                recorder.observe("mig.event", address=self.address, declared=len(declared), **seen)
                return seen

            @ak.rpc
            async def add(self, id: str, dollars: int) -> dict[str, Any]:
                seen = self.look()
                await self.sql.exec_durable(
                    "INSERT INTO entry (id, amount) VALUES (?, ?)", (id, dollars * scale)
                )
                return seen

            @ak.rpc
            async def read(self) -> dict[str, Any]:
                seen = self.look()
                entries = self.sql.exec("SELECT id, amount FROM entry ORDER BY id")
                return {**seen, "entries": {i: a for i, a in entries}}

        app = ak.App()
        app.mount(Ledger, LEDGER)
        return app

    return [
        version(V1, 1),
        version([*V1, converts(strict=True), LAST], 100),
        version([*V1, converts(strict=False), LAST], 100),
    ]
