"""Per-actor schema migrations (docs/migrations.md): declared on the class, applied at the
actor's first event of each instance, one transaction each with ``PRAGMA user_version``."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import actorkeep as ak
from actorkeep.address import actor_path
from actorkeep.migrations import check_migrations, split_statements
from actorkeep.testing import open_host

V1 = ["CREATE TABLE note (id INTEGER PRIMARY KEY, body TEXT NOT NULL)"]


def add_words(sql: ak.MigrationSql) -> None:
    sql.exec("ALTER TABLE note ADD COLUMN words INTEGER NOT NULL DEFAULT 0")
    rows = sql.exec("SELECT id, body FROM note").fetchall()
    counts = [(len(body.split()), id) for id, body in rows]
    sql.executemany("UPDATE note SET words = ? WHERE id = ?", counts)


V2 = [
    *V1,
    add_words,
    """
    -- an index and a trigger; the trigger's body has its own semicolons
    CREATE INDEX note_words ON note (words);
    CREATE TABLE log (what TEXT);
    CREATE TRIGGER note_added AFTER INSERT ON note BEGIN
        INSERT INTO log VALUES ('added; ' || new.id);
    END;
    """,
]


def make_app(migrations: list[Any], setup_sees: list[int] | None = None) -> ak.App:
    app = ak.App()

    @app.actor("notes")
    class Notes(ak.Actor):
        async def setup(self) -> None:
            if setup_sees is not None:  # setup runs after the migrations
                setup_sees.append(self.sql.exec("PRAGMA user_version").fetchone()[0])

        @ak.rpc
        async def add(self, body: str) -> int:
            written = await self.sql.exec_durable(
                "INSERT INTO note (body) VALUES (?) RETURNING id", (body,)
            )
            return int(written.rows[0][0])

        @ak.rpc
        async def version(self) -> int:
            return int(self.sql.exec("PRAGMA user_version").fetchone()[0])

        @ak.rpc
        async def rows(self, sql: str) -> list[list[Any]]:
            return [list(r) for r in self.sql.exec(sql)]

        @ak.rpc
        async def wipe(self) -> None:
            await self.delete_all()

    Notes.migrations = migrations
    Notes._ak_migration_steps = check_migrations("Notes", migrations)
    return app


def schema_of(path: Path) -> tuple[int, list[tuple[str, str]], list[tuple[Any, ...]]]:
    """What a database file holds: version, schema, notes (read without writing)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        schema = conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE name NOT LIKE '\\_ak%' ESCAPE '\\' "
            "ORDER BY name"
        ).fetchall()
        notes = conn.execute("SELECT * FROM note ORDER BY id").fetchall()
    finally:
        conn.close()
    return int(version), schema, notes


async def rpc(host: ak.testing.TestHost, method: str, **args: Any) -> ak.Response:
    return await host.request("POST", f"/notes/a/_rpc/{method}", json=args)


async def test_migrations_run_before_setup_and_an_upgrade_adds_the_rest(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    seen: list[int] = []
    async with open_host(make_app(V1, seen), data_dir) as host:
        assert (await rpc(host, "add", body="two words")).json() == 1
        assert (await rpc(host, "version")).json() == 1
    assert seen == [1]
    async with open_host(make_app(V2, seen), data_dir) as host:  # the app, upgraded
        assert (await rpc(host, "version")).json() == 3
        assert (await rpc(host, "add", body="three more words")).json() == 2
        rows = (await rpc(host, "rows", sql="SELECT id, words FROM note ORDER BY id")).json()
        assert rows == [[1, 2], [2, 0]]  # the function migration filled the old row only
        log = (await rpc(host, "rows", sql="SELECT what FROM log")).json()
        assert log == [["added; 2"]]
        await host.restart()  # nothing left to apply: the version stays
        assert (await rpc(host, "version")).json() == 3
    assert seen == [1, 3, 3]


async def test_a_failing_migration_leaves_the_file_as_it_was(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(make_app(V1), data_dir) as host:
        await rpc(host, "add", body="kept")
    path = actor_path(data_dir / "actors", "notes", "a")
    before = schema_of(path)

    def breaks(sql: ak.MigrationSql) -> None:
        sql.exec("CREATE TABLE half (x)")  # done, then undone with the rest
        sql.exec("UPDATE note SET body = 'changed'")
        raise ValueError("no good")

    for bad in (
        [*V1, "ALTER TABLE nope ADD COLUMN y"],
        [*V1, "CREATE TABLE t2 (a); INSERT INTO missing VALUES (1)"],
        [*V1, breaks],
    ):
        async with open_host(make_app(bad), data_dir) as host:
            resp = await rpc(host, "version")
            assert resp.status == 500
            error = resp.json()
            assert error["error"] == "MigrationError"
            number = len(bad)
            assert f"migration {number} (" in error["message"]
            assert "the database stays at version" in error["message"]
            # The actor is not left half open: every later event fails the same way.
            again = await rpc(host, "add", body="never")
            assert again.status == 500 and f"migration {number} (" in again.json()["message"]
        assert schema_of(path) == before
    message = error["message"]
    assert message.startswith("notes/a: migration 2 (breaks) failed: ValueError: no good")


async def test_the_error_names_the_sql_of_the_failing_migration(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    bad = [*V1, "ALTER TABLE note ADD COLUMN x", "\n  -- why\n  ALTER TABLE nope ADD COLUMN y\n"]
    async with open_host(make_app(bad), data_dir) as host:
        message = (await rpc(host, "version")).json()["message"]
    assert message == (
        "notes/a: migration 3 (ALTER TABLE nope ADD COLUMN y) failed: OperationalError: no "
        "such table: nope; the database stays at version 2"
    )
    path = actor_path(data_dir / "actors", "notes", "a")
    assert schema_of(path)[0] == 2  # migrations 1 and 2 were applied and kept


async def test_a_downgrade_is_refused(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(make_app(V2), data_dir) as host:
        await rpc(host, "add", body="x")
    async with open_host(make_app(V1), data_dir) as host:
        resp = await rpc(host, "version")
    assert resp.status == 500
    assert resp.json()["message"] == (
        "notes/a: its database is at version 3, but its class declares 1 migrations: a newer "
        "version of the app migrated it, and a downgrade is refused (deploy the newer app again)"
    )


@pytest.mark.parametrize(
    ("statement", "what"),
    [
        ("COMMIT", "BEGIN, COMMIT or ROLLBACK"),
        ("PRAGMA user_version = 7", "PRAGMA user_version = ..."),
        ("ATTACH ':memory:' AS other", "ATTACH"),
    ],
)
async def test_a_migration_cannot_end_its_transaction_or_set_the_version(
    data_dir: Path, autojump_clock: trio.testing.MockClock, statement: str, what: str
) -> None:
    def sneaky(sql: ak.MigrationSql) -> None:
        sql.exec("CREATE TABLE early (x)")
        sql.exec(statement)

    async with open_host(make_app([*V1, sneaky]), data_dir) as host:
        resp = await rpc(host, "version")
        assert resp.status == 500
        assert f"({what} is not allowed in a migration" in resp.json()["message"]
    version, schema, _ = schema_of(actor_path(data_dir / "actors", "notes", "a"))
    assert version == 1
    assert "early" not in [name for name, _ in schema]


async def test_a_class_without_migrations_leaves_user_version_alone(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    app = ak.App()

    @app.actor("own")
    class Own(ak.Actor):
        async def setup(self) -> None:
            self.sql.exec("PRAGMA user_version = 42")  # the app's own scheme

        @ak.rpc
        async def version(self) -> int:
            return int(self.sql.exec("PRAGMA user_version").fetchone()[0])

    async with open_host(app, data_dir) as host:
        assert (await host.request("POST", "/own/a/_rpc/version")).json() == 42
        await host.restart()
        assert (await host.request("POST", "/own/a/_rpc/version")).json() == 42


async def test_delete_all_runs_the_migrations_again(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(make_app(V2), data_dir) as host:
        await rpc(host, "add", body="a b")
        await rpc(host, "wipe")
        assert (await rpc(host, "version")).json() == 3
        assert (await rpc(host, "rows", sql="SELECT count(*) FROM note")).json() == [[0]]


async def test_an_alarm_event_migrates_too(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    fired: list[int] = []
    app = ak.App()

    @app.actor("timer")
    class Timer(ak.Actor):
        migrations = ["CREATE TABLE fired (at REAL)"]

        @ak.rpc
        async def start(self) -> None:
            await self.set_alarm(self.now() + 10)

        async def alarm(self, info: ak.AlarmInfo) -> None:
            fired.append(int(self.sql.exec("PRAGMA user_version").fetchone()[0]))

    async with open_host(app, data_dir) as host:
        await host.request("POST", "/timer/t/_rpc/start")
    Timer.migrations = [*Timer.migrations, "CREATE TABLE more (x)"]
    Timer._ak_migration_steps = check_migrations("Timer", Timer.migrations)
    async with open_host(app, data_dir) as host:
        await trio.sleep(20)  # the alarm is the first event after the upgrade
    assert fired == [2]


def test_declarations_are_checked_when_the_class_is_defined() -> None:
    async def later(sql: ak.MigrationSql) -> None:
        pass

    cases: list[tuple[object, type[Exception], str]] = [
        ("CREATE TABLE t (x)", TypeError, "Bad.migrations must be a list"),
        ([1], TypeError, "Bad.migrations[0] (migration 1) must be SQL text or a function"),
        (["  -- nothing\n"], ValueError, "Bad.migrations[0] (migration 1) has no SQL statement"),
        (
            ["CREATE TABLE a (x)", "INSERT INTO a VALUES ('x)"],
            ValueError,
            "Bad.migrations[1] (migration 2): incomplete SQL statement: "
            '"INSERT INTO a VALUES (\'x)"',
        ),
        ([later], TypeError, "Bad.migrations[0] (migration 1) is async"),
    ]
    for migrations, error, message in cases:
        with pytest.raises(error) as raised:
            type("Bad", (ak.Actor,), {"migrations": migrations})
        assert str(raised.value).startswith(message)


def test_statements_split_where_sqlite_ends_them() -> None:
    text = "INSERT INTO t VALUES ('a;b'); /* c; */ CREATE TRIGGER x AFTER INSERT ON t BEGIN "
    text += "SELECT 1; SELECT 2; END; -- tail"
    assert split_statements(text) == [
        "INSERT INTO t VALUES ('a;b');",
        "/* c; */ CREATE TRIGGER x AFTER INSERT ON t BEGIN SELECT 1; SELECT 2; END;",
    ]
    with pytest.raises(ValueError, match="incomplete SQL statement"):
        split_statements("SELECT 'unterminated;")


def test_the_version_a_failing_migration_reports_survives_power_loss() -> None:
    """The error says the database stays at the version before the failing migration: the
    ones applied before it in that activation are durable by then, so a power loss right
    after the error leaves the file there."""
    from sim import Faults, World

    def app_of(declared: list[ak.Migration]) -> ak.App:
        app = ak.App()

        @app.actor("book")
        class Book(ak.Actor):
            migrations = declared

            @ak.rpc
            async def version(self) -> int:
                return int(self.sql.exec("PRAGMA user_version").fetchone()[0])

        return app

    failing = app_of(["CREATE TABLE a (x)", "CREATE TABLE b (x)", "SELECT nope FROM a"])
    reader = app_of([])  # no migrations: user_version is read as the file has it

    async def scenario(world: World) -> int:
        try:
            await world.rpc("book/one", "version")
        except ak.RemoteError as exc:
            assert exc.error == "MigrationError" and "stays at version 2" in exc.message
        else:
            raise AssertionError("the third migration should fail")
        world.crash(power_loss=True)
        await world.deploy(reader)
        return int(await world.rpc("book/one", "version"))

    assert World(failing, seed=1, faults=Faults(rollback_p=1.0)).run(scenario) == 2
