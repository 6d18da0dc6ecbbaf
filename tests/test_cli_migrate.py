"""``actorkeep migrate --dry-run``: an app's pending migrations tried on copies of a data
directory's actor files, reported per file; the directory is never written."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
import trio.testing

from actorkeep.address import actor_path
from actorkeep.cli import main
from actorkeep.testing import open_host
from tests.apps import migrate_app

APP = "tests.apps.migrate_app"


def migrate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run ``actorkeep migrate ARGS`` here: its exit status, stdout and stderr."""
    with pytest.raises(SystemExit) as done:
        main(["migrate", *args])
    out, err = capsys.readouterr()
    assert isinstance(done.value.code, int)
    return done.value.code, out, err


def files_of(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


async def fill(data: Path) -> None:
    """``notes/a`` and ``notes/b`` at version 1 (the deployed app), ``notes/c`` at 3 (opened
    by the next app already), ``plain/p`` without migrations."""
    async with open_host(migrate_app.v1, data) as host:
        for name in ("a", "b"):
            resp = await host.request("POST", f"/notes/{name}/_rpc/add", json={"body": "two words"})
            assert resp.status == 200
        assert (await host.request("POST", "/plain/p/_rpc/touch")).status == 200
    async with open_host(migrate_app.v2, data) as host:
        assert (await host.request("POST", "/notes/c/_rpc/add", json={"body": "x"})).status == 200


async def test_a_dry_run_reports_each_file_and_changes_nothing(
    data_dir: Path, autojump_clock: trio.testing.MockClock, capsys: pytest.CaptureFixture[str]
) -> None:
    await fill(data_dir)
    before = files_of(data_dir)
    status, out, err = migrate(capsys, f"{APP}:v2", "--dry-run", "--data", str(data_dir))
    assert (status, err) == (0, "")
    assert out.splitlines() == [
        "notes/a  1 -> 3",
        "notes/b  1 -> 3",
        "notes/c  3 (at its last migration)",
        f"3 files of notes: 2 would migrate, 1 at their last migration, 0 would fail (tried on "
        f"copies; nothing in {data_dir} was changed)",
    ]
    args = ("notes", "--dry-run", "--data", str(data_dir), "--json")
    status, out, _ = migrate(capsys, f"{APP}:v2", *args)
    answer = json.loads(out)
    assert status == 0
    assert [(f["address"], f["version"], f["reached"]) for f in answer["files"]] == [
        ("notes/a", 1, 3),
        ("notes/b", 1, 3),
        ("notes/c", 3, 3),
    ]
    assert (answer["would_migrate"], answer["current"], answer["failing"]) == (2, 1, 0)
    assert files_of(data_dir) == before  # not a byte changed, no file made
    _, out, _ = migrate(capsys, f"{APP}:v2", "plain", "--dry-run", "--data", str(data_dir))
    assert out == "no class of the app declares migrations: nothing to try\n"


async def test_a_failing_migration_and_a_downgrade_fail_the_run(
    data_dir: Path, autojump_clock: trio.testing.MockClock, capsys: pytest.CaptureFixture[str]
) -> None:
    await fill(data_dir)
    before = files_of(data_dir)
    status, out, _ = migrate(capsys, f"{APP}:broken", "--dry-run", "--data", str(data_dir))
    assert status == 1
    lines = out.splitlines()
    assert lines[0] == (
        "notes/a  FAILS: notes/a: migration 3 (ALTER TABLE nope ADD x) failed: OperationalError: "
        "no such table: nope; the database stays at version 2"
    )
    assert lines[1].startswith("notes/b  FAILS: notes/b: migration 3 (ALTER TABLE nope ADD x)")
    assert lines[2] == "notes/c  3 (at its last migration)"  # its version is all that is known
    assert "0 would migrate, 1 at their last migration, 2 would fail" in lines[3]
    status, out, _ = migrate(capsys, f"{APP}:v1", "--dry-run", "--data", str(data_dir))
    assert status == 1
    assert out.splitlines()[2] == (
        "notes/c  FAILS: notes/c: its database is at version 3, but its class declares 1 "
        "migrations: a newer version of the app migrated it, and a downgrade is refused (deploy "
        "the newer app again)"
    )
    assert "2 at their last migration, 1 would fail" in out
    assert files_of(data_dir) == before


async def test_a_log_left_by_a_crash_is_read_from_copies(
    data_dir: Path, autojump_clock: trio.testing.MockClock, capsys: pytest.CaptureFixture[str]
) -> None:
    """A database whose write-ahead log has no ``-shm`` index (as after a crash) is copied with
    its log and read there: SQLite would create the index beside it if read in place."""
    await fill(data_dir)
    path = actor_path(data_dir / "actors", "notes", "d")
    path.parent.mkdir(parents=True, exist_ok=True)
    live = data_dir.parent / "live.sqlite"
    conn = sqlite3.connect(live, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute(migrate_app.V1[0])  # type: ignore[arg-type]
    conn.execute("PRAGMA user_version = 1")  # in the log only
    shutil.copyfile(live, path)
    shutil.copyfile(live.with_name("live.sqlite-wal"), path.with_name(path.name + "-wal"))
    conn.close()
    before = files_of(data_dir)
    status, out, _ = migrate(capsys, f"{APP}:v2", "--dry-run", "--data", str(data_dir))
    assert status == 0
    assert "notes/d  1 -> 3" in out.splitlines()
    assert files_of(data_dir) == before
    assert not path.with_name(path.name + "-shm").exists()


async def test_a_damaged_file_is_named_and_fails_the_run(
    data_dir: Path, autojump_clock: trio.testing.MockClock, capsys: pytest.CaptureFixture[str]
) -> None:
    await fill(data_dir)
    path = actor_path(data_dir / "actors", "notes", "b")
    path.write_bytes(b"not a database, " * 512)
    before = files_of(data_dir)
    status, out, err = migrate(capsys, f"{APP}:v2", "--dry-run", "--data", str(data_dir))
    assert (status, err) == (1, "")
    assert out.splitlines()[1] == (
        "notes/b  FAILS: cannot copy the file: DatabaseError: file is not a database"
    )
    assert "2 files" not in out and "1 would fail" in out
    assert files_of(data_dir) == before


def test_bad_input_is_refused_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    cases = [
        ([f"{APP}:v2", "--data", str(data)], "add --dry-run"),
        ([f"{APP}:v2", "--dry-run", "--data", str(tmp_path / "none")], "no data directory at"),
        (
            [f"{APP}:v2", "ghost", "--dry-run", "--data", str(data)],
            "the app has no actor class 'ghost' (its classes: notes, plain)",
        ),
        (["no-colon", "--dry-run", "--data", str(data)], "want MODULE:APP, got 'no-colon'"),
        (["tests.apps.nowhere:app", "--dry-run", "--data", str(data)], "cannot import"),
        ([f"{APP}:make", "--dry-run", "--data", str(data)], "is not an actorkeep.App"),
    ]
    for args, message in cases:
        status, out, err = migrate(capsys, *args)
        assert (status, out) == (2, ""), args
        assert message in err and len(err.splitlines()) == 1, err
    assert list(tmp_path.iterdir()) == [data] and not any(data.iterdir())


def test_an_app_that_fails_to_import_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "badmigrations.py").write_text(
        "import actorkeep as ak\nclass Bad(ak.Actor):\n    migrations = 'CREATE TABLE t (x)'\n"
    )
    monkeypatch.chdir(tmp_path)
    status, out, err = migrate(capsys, "badmigrations:app", "--dry-run", "--data", str(tmp_path))
    assert status == 2 and out == ""
    assert err == (
        "actorkeep migrate: cannot import 'badmigrations:app': TypeError: Bad.migrations must "
        "be a list of SQL strings and functions, not str\n"
    )


async def test_files_of_a_running_host_are_copied_beside_it(
    data_dir: Path, autojump_clock: trio.testing.MockClock, capsys: pytest.CaptureFixture[str]
) -> None:
    async with open_host(migrate_app.v1, data_dir) as host:
        for body in ("one", "two"):
            await host.request("POST", "/notes/a/_rpc/add", json={"body": body})
        status, out, _ = migrate(capsys, f"{APP}:v2", "--dry-run", "--data", str(data_dir))
        assert status == 0 and out.splitlines()[0] == "notes/a  1 -> 3"
        resp = await host.request("POST", "/notes/a/_rpc/add", json={"body": "three"})
        assert resp.status == 200  # the host goes on, at version 1
    conn = sqlite3.connect(actor_path(data_dir / "actors", "notes", "a"))
    assert conn.execute("PRAGMA user_version").fetchone() == (1,)
    assert conn.execute("SELECT count(*) FROM note").fetchone() == (3,)
    conn.close()


async def test_a_dry_run_enforces_foreign_keys_as_the_host_does(
    data_dir: Path, autojump_clock: trio.testing.MockClock, capsys: pytest.CaptureFixture[str]
) -> None:
    await fill(data_dir)
    status, out, _ = migrate(
        capsys, f"{APP}:dangling", "notes", "--dry-run", "--data", str(data_dir)
    )
    assert status == 1
    assert "FOREIGN KEY constraint failed" in out and "migration 3" in out
    async with open_host(migrate_app.dangling, data_dir) as host:  # the host agrees
        resp = await host.request("POST", "/notes/a/_rpc/add", json={"body": "x"})
        assert resp.status == 500 and b"FOREIGN KEY constraint failed" in resp.body
