"""Versions of one app for ``actorkeep migrate --dry-run`` (tests/test_cli_migrate.py): ``v1``
as deployed, ``v2`` with two more migrations, ``broken`` whose third migration fails."""

from __future__ import annotations

import actorkeep as ak

V1: list[ak.Migration] = [
    "CREATE TABLE note (id INTEGER PRIMARY KEY, body TEXT NOT NULL)",
]


def add_words(sql: ak.MigrationSql) -> None:
    sql.exec("ALTER TABLE note ADD COLUMN words INTEGER NOT NULL DEFAULT 0")
    rows = sql.exec("SELECT id, body FROM note").fetchall()
    sql.executemany(
        "UPDATE note SET words = ? WHERE id = ?", [(len(b.split()), i) for i, b in rows]
    )


def make(declared: list[ak.Migration]) -> ak.App:
    """An app whose class ``notes`` has the migrations ``declared``, and a class ``plain``
    that has none."""
    app = ak.App()

    class Notes(ak.Actor):
        migrations = declared

        @ak.rpc
        async def add(self, body: str) -> None:
            await self.sql.exec_durable("INSERT INTO note (body) VALUES (?)", (body,))

    class Plain(ak.Actor):
        @ak.rpc
        async def touch(self) -> None:
            await self.sql.exec_durable("CREATE TABLE IF NOT EXISTS t (x)")

    app.mount(Notes, "notes")
    app.mount(Plain, "plain")
    return app


v1 = make(V1)
v2 = make([*V1, add_words, "CREATE INDEX note_words ON note (words)"])
broken = make([*V1, "ALTER TABLE note ADD COLUMN words INTEGER", "ALTER TABLE nope ADD x"])
#: Its second migration breaks a foreign key: the host's connections enforce them, so it fails.
dangling = make(
    [
        *V1,
        "CREATE TABLE tag (note INTEGER NOT NULL REFERENCES note (id), tag TEXT)",
        "INSERT INTO tag VALUES (999, 'orphan')",
    ]
)
