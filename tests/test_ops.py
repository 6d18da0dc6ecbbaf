"""Operations: ``actorkeep ls|show|sql|alarms`` against a running host's admin API and on a data
directory no host serves; the admin listener's rules; reads that never write."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from actorkeep.ops import inspect
from actorkeep.ops.inspect import InspectError
from actorkeep.runtime.hostdb import HostDb
from actorkeep.runtime.registry import Registry
from actorkeep.runtime.storage import FileStorage
from tests.test_process import ROOT, Server, http_request

APP = "tests.apps.process_app:app"


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "actorkeep", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def cli_json(*args: str, env: dict[str, str] | None = None) -> Any:
    done = cli(*args, "--json", env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def admin_url(data: Path) -> str:
    url: str = json.loads((data / "host" / "admin.json").read_text())["url"]
    return url


def fill(server: Server) -> None:
    for name in ("a", "b", "c"):
        assert server.rpc(f"/ledger/{name}/_rpc/incr", {"by": 2}).status == 200
    assert server.rpc("/alarmer/x/_rpc/arm", {"delay": 3600}).status == 200


def test_the_commands_read_a_running_host_and_then_its_directory(tmp_path: Path) -> None:
    """Served with ``--admin``, the commands ask the host (and see who is in memory); once it
    has stopped, they read the directory itself, with the same answers."""
    data = tmp_path / "data"
    server = Server(APP, data, ("--admin", "127.0.0.1:0"))
    try:
        fill(server)
        online = cli_json("ls", "--data", str(data))
        assert [a["address"] for a in online["actors"]] == [
            "alarmer/x",
            "ledger/a",
            "ledger/b",
            "ledger/c",
        ]
        assert all(a["active"] for a in online["actors"])
        page = cli_json("ls", "ledger", "--data", str(data), "--limit", "2")
        assert [a["address"] for a in page["actors"]] == ["ledger/a", "ledger/b"]
        rest = cli_json("ls", "ledger", "--data", str(data), "--after", page["next"])
        assert [a["address"] for a in rest["actors"]] == ["ledger/c"] and rest["next"] is None
        shown = cli_json("show", "alarmer/x", "--data", str(data))
        assert shown["active"] and shown["alarm"]["retries"] == 0
        assert shown["alarm_index"] == shown["alarm"]["at"]
        assert {t["name"]: t["rows"] for t in shown["tables"]}["fired"] == 0
        rows = cli_json("sql", "ledger/b", "SELECT n FROM c", "--data", str(data))
        assert rows == {"columns": ["n"], "rows": [[2]], "truncated": False}
        alarms = cli_json("alarms", "--data", str(data))
        assert [a["address"] for a in alarms["alarms"]] == ["alarmer/x"]
        assert cli_json("alarms", "--due", "--data", str(data))["alarms"] == []
        # The app's port has no admin API: the path is an actor class there.
        assert server.get("/api/actors").status == 404
        assert server.stop(signal.SIGTERM) == 0
    finally:
        server.close()
    assert not (data / "host" / "admin.json").exists()
    offline = cli_json("ls", "--data", str(data))
    assert [a["address"] for a in offline["actors"]] == [a["address"] for a in online["actors"]]
    assert not any(a["active"] for a in offline["actors"])
    again = cli_json("show", "alarmer/x", "--data", str(data))
    assert again["alarm"] == shown["alarm"] and again["tables"] == shown["tables"]
    assert cli_json("sql", "ledger/b", "SELECT n FROM c", "--data", str(data)) == rows
    human = cli("show", "alarmer/x", "--data", str(data))
    assert human.returncode == 0 and "alarm " in human.stdout and "fired" in human.stdout
    # Tables for people, by default.
    table = cli("ls", "--data", str(data)).stdout.splitlines()
    assert table[0].split() == ["ADDRESS", "CREATED", "IN", "MEMORY", "QUARANTINED"]
    assert [line.split()[0] for line in table[1:]] == [
        "alarmer/x",
        "ledger/a",
        "ledger/b",
        "ledger/c",
    ]
    assert cli("sql", "ledger/b", "SELECT n FROM c", "--data", str(data)).stdout.split() == [
        "n",
        "2",
    ]
    pending = cli("alarms", "--data", str(data)).stdout.splitlines()
    assert pending[0].split() == ["AT", "DUE", "ADDRESS"]
    assert pending[1].split()[1:] == ["alarmer/x"]  # not due: its DUE column is blank


def test_the_admin_listener_beyond_loopback_needs_a_token(tmp_path: Path) -> None:
    done = cli("serve", APP, "--data", str(tmp_path / "d"), "--admin", "0.0.0.0:0")
    assert done.returncode != 0 and "not a loopback address" in done.stderr
    assert not (tmp_path / "d").exists()  # refused before anything was made


def test_with_a_token_the_admin_api_refuses_requests_without_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = Server(APP, data, ("--admin", "127.0.0.1:0", "--admin-token", "s3cret"))
    try:
        fill(server)
        port = int(admin_url(data).rpartition(":")[2])
        assert http_request(port, "GET", "/api/actors").status == 401
        wrong = {"authorization": "Bearer nope"}
        assert http_request(port, "GET", "/api/actors", headers=wrong).status == 401
        right = {"authorization": "Bearer s3cret"}
        assert http_request(port, "GET", "/api/actors", headers=right).status == 200
        refused = cli("ls", "--data", str(data))
        assert refused.returncode == 1 and "Bearer" in refused.stderr
        listed = cli_json("ls", "--data", str(data), env={"ACTORKEEP_ADMIN_TOKEN": "s3cret"})
        assert len(listed["actors"]) == 4
    finally:
        server.close()


def test_bad_admin_requests_get_clear_errors_and_the_host_stays_up(tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = Server(APP, data, ("--admin", "127.0.0.1:0"))
    try:
        fill(server)
        port = int(admin_url(data).rpartition(":")[2])

        def ask(method: str, path: str, body: bytes | None = None) -> tuple[int, Any]:
            reply = http_request(port, method, path, body)
            return reply.status, reply.json()

        assert ask("GET", "/api/actors?limit=0")[0] == 400
        assert ask("GET", "/api/actors?limit=x")[0] == 400
        assert ask("GET", "/api/actors?prefix=%00")[0] == 400
        assert ask("GET", "/api/actors/ledger/nobody")[0] == 404
        assert ask("GET", "/api/actors/Bad/a")[0] == 400
        assert ask("GET", "/api/alarms?after=junk")[0] == 400
        assert ask("DELETE", "/api/actors")[0] == 405
        assert ask("POST", "/api/actors/ledger/a/sql", b"not json")[0] == 400
        assert ask("POST", "/api/actors/ledger/a/sql", b'{"sql": 1}')[0] == 400
        status, body = ask("POST", "/api/actors/ledger/a/sql", b'{"sql": "DELETE FROM c"}')
        assert status == 400 and "only reads" in body["message"]
        assert http_request(port, "GET", "/nothing").status == 404  # a page, in HTML
        assert server.count("ledger/a") == 2  # nothing was written, the host still serves
        assert not inspect.database_path(data / "actors", "ledger/nobody").exists()
    finally:
        server.close()


# -- reading without writing ------------------------------------------------------------------
def actor_db(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "actors"
    path = inspect.database_path(root, "notes/n1")
    path.parent.mkdir(parents=True)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body BLOB, x REAL)")
    conn.executemany(
        "INSERT INTO notes (body, x) VALUES (?, ?)", [(b"\x00\xff", 1.5), (None, float("inf"))]
    )
    conn.commit()
    conn.close()
    return root, path


def test_a_query_cannot_write_attach_or_pragma_and_creates_no_file(tmp_path: Path) -> None:
    root, path = actor_db(tmp_path)
    before = sorted(os.listdir(path.parent))
    for sql in (
        "DELETE FROM notes",
        "INSERT INTO notes (x) VALUES (1)",
        "CREATE TABLE t (a)",
        "DROP TABLE notes",
        f"ATTACH '{tmp_path / 'other.sqlite'}' AS o",
        "PRAGMA journal_mode=DELETE",
        "PRAGMA query_only=0",
        "BEGIN",
        "SELECT 1; DELETE FROM notes",
    ):
        with pytest.raises(InspectError):
            inspect.query(root, "notes/n1", sql)
    answer = inspect.query(root, "notes/n1", "SELECT body, x FROM notes ORDER BY id")
    assert answer["rows"] == [[{"base64": "AP8="}, 1.5], [None, {"float": "inf"}]]
    assert sorted(os.listdir(path.parent)) == before == [path.name]
    assert not (tmp_path / "other.sqlite").exists()
    assert inspect.query(root, "notes/n1", "SELECT count(*) FROM notes")["rows"] == [[2]]


def test_a_runaway_query_is_stopped_and_counts_give_up(tmp_path: Path) -> None:
    root, _ = actor_db(tmp_path)
    forever = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT max(i) FROM n"
    with pytest.raises(InspectError, match="SQLite steps"):
        inspect.query(root, "notes/n1", forever, max_steps=100_000)
    many = inspect.query(root, "notes/n1", "SELECT 1 FROM notes, notes, notes", max_rows=3)
    assert many["truncated"] and len(many["rows"]) == 3


def test_a_query_keeps_rows_only_while_its_answer_fits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows of large values are read one at a time and kept only while the answer stays within
    its size: 300 rows of 64 KiB with an answer of at most 1 MiB hold about 1 MiB, not the
    1,000 rows a page may have (here all 300, 19 MiB)."""
    root, path = actor_db(tmp_path)
    conn = sqlite3.connect(path)
    conn.executemany("INSERT INTO notes (body) VALUES (randomblob(?))", [(64 << 10,)] * 300)
    conn.commit()
    conn.close()
    monkeypatch.setattr(inspect, "MAX_ANSWER_BYTES", 1 << 20)
    tracemalloc.start()
    try:
        answer = inspect.query(root, "notes/n1", "SELECT body FROM notes WHERE x IS NULL")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert answer["truncated"] and len(answer["rows"]) == 16  # 1 MiB of 64 KiB values
    assert peak < 6 << 20, peak  # the kept rows, their base64 for JSON, one row more


def test_show_tells_missing_from_empty(tmp_path: Path) -> None:
    root, path = actor_db(tmp_path)
    with pytest.raises(InspectError) as missing:
        inspect.describe_actor(root, "notes/other")
    assert missing.value.status == 404
    path.write_bytes(b"")
    with pytest.raises(InspectError, match="empty"):
        inspect.describe_actor(root, "notes/n1")


def test_a_prefix_page_reads_its_rows_not_the_registry(tmp_path: Path) -> None:
    """``ls`` on a large registry: the cost of a page (in SQLite's own steps) is the same
    for 2,000 registered actors as for 40,000."""
    storage = FileStorage(tmp_path / "d", in_thread=False)
    host_db = HostDb(storage.open_host_db())
    try:
        registry = Registry(host_db)

        def steps_for_a_page(total: int) -> int:
            host_db.conn.executemany(
                "INSERT OR IGNORE INTO actors (address, created_at) VALUES (?, 0)",
                ((f"c{i % 10}/n{i:06d}",) for i in range(total)),
            )
            counted = [0]

            def tick() -> int:
                counted[0] += 1
                return 0

            host_db.conn.set_progress_handler(tick, 10)
            page = inspect.list_actors(registry, "c3/n0012", None, 20)
            host_db.conn.set_progress_handler(None, 10)
            assert [a["address"] for a in page["actors"]][:2] == ["c3/n001203", "c3/n001213"]
            return counted[0]

        small = steps_for_a_page(2_000)
        large = steps_for_a_page(40_000)
        assert large <= small * 1.5, (small, large)
        assert inspect.list_actors(registry, "c3/n0012", "c3/n001293", 20)["next"] is None
    finally:
        host_db.close()
        storage.close()


def test_prefixes_no_address_can_have_are_refused() -> None:
    assert inspect.address_prefix("counter", "a") == "counter/a"
    assert inspect.address_prefix(None, "coun") == "coun"
    for cls, prefix in (("Counter", ""), (None, "a b"), (None, "é"), (None, "x" * 300)):
        with pytest.raises(InspectError):
            inspect.address_prefix(cls, prefix)


def test_a_port_in_use_is_named_and_nothing_is_made(tmp_path: Path) -> None:
    """``serve`` binds its ports before it touches the data directory; the message names the
    port that is taken (the app's or the admin listener's), not a nursery's exception."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for args in (("--port", str(port)), ("--port", "0", "--admin", f"127.0.0.1:{port}")):
            done = cli("serve", APP, "--data", str(tmp_path / "d"), *args)
            assert done.returncode == 1
            assert done.stderr.strip() == (
                f"actorkeep: cannot serve on 127.0.0.1:{port}: [Errno 98] Address already in use"
            )
            assert not (tmp_path / "d").exists()


def test_the_version_is_printed() -> None:
    done = cli("--version")
    assert done.returncode == 0 and done.stdout.startswith("actorkeep 0.")


def test_the_access_log_and_the_log_level(tmp_path: Path) -> None:
    """``--access-log``: a line per request answered; ``--log-level warning`` leaves out the
    info lines (the access log's among them)."""
    server = Server(APP, tmp_path / "a", ("--access-log",))
    try:
        assert server.rpc("/ledger/a/_rpc/incr", {"by": 1}).status == 200
        assert server.get("/nobody/x/").status == 404
        assert server.stop(signal.SIGTERM) == 0
    finally:
        server.close()
    lines = [line for line in server.stderr().splitlines() if "[info     ] request" in line]
    lines = [line for line in lines if "/_actorkeep/health" not in line]  # the start's checks
    assert len(lines) == 2
    assert "method=POST" in lines[0] and "target=/ledger/a/_rpc/incr" in lines[0]
    assert "status=200" in lines[0] and "ms=" in lines[0]
    assert "status=404" in lines[1]
    quiet = Server(APP, tmp_path / "b", ("--access-log", "--log-level", "warning"))
    try:
        assert quiet.rpc("/ledger/a/_rpc/incr", {"by": 1}).status == 200
        assert quiet.stop(signal.SIGTERM) == 0
    finally:
        quiet.close()
    assert "actorkeep serving" not in quiet.stderr() and "request" not in quiet.stderr()


def test_rm_deletes_an_actor_and_its_alarm_from_a_running_host_or_its_directory(
    tmp_path: Path,
) -> None:
    """``rm`` forgets the actor and its alarm and deletes its files, through a running host's
    admin API or on a stopped host's directory; the next event starts it afresh (not as
    damage); an unknown actor makes nothing; a page elsewhere cannot make a browser do it."""
    data = tmp_path / "data"
    server = Server(APP, data, ("--admin", "127.0.0.1:0"))
    try:
        fill(server)
        path = inspect.database_path(data / "actors", "alarmer/x")
        assert path.exists()
        port = int(admin_url(data).rpartition(":")[2])
        evil = {"origin": "http://evil.example", "sec-fetch-site": "cross-site"}
        target = "/api/actors/alarmer/x"
        assert http_request(port, "DELETE", target, headers=evil).status == 403
        assert path.exists()
        online = cli_json("rm", "alarmer/x", "--data", str(data))
        assert online["deleted"] == "alarmer/x" and online["bytes"] > 0
        assert not path.exists() and not Path(f"{path}-wal").exists()
        listed = [a["address"] for a in cli_json("ls", "--data", str(data))["actors"]]
        assert listed == ["ledger/a", "ledger/b", "ledger/c"]
        assert cli_json("alarms", "--data", str(data))["alarms"] == []
        missing = cli("rm", "ledger/nobody", "--data", str(data))
        assert missing.returncode == 1 and "no actor ledger/nobody" in missing.stderr
        reply = server.get("/alarmer/x/")
        assert reply.status == 200 and reply.json()["alarm"] is None and reply.json()["fired"] == []
        assert server.stop(signal.SIGTERM) == 0
    finally:
        server.close()
    gone_h = cli("rm", "ledger/b", "--data", str(data))
    assert gone_h.returncode == 0 and gone_h.stdout.startswith("deleted ledger/b (")
    assert not inspect.database_path(data / "actors", "ledger/b").exists()
    missing = cli("rm", "ledger/nobody", "--data", str(data))
    assert missing.returncode == 1 and "no such actor" in missing.stderr
    assert not inspect.database_path(data / "actors", "ledger/nobody").parent.exists()
    again = Server(APP, data, ())
    try:
        assert again.count("ledger/b") == 0
        assert again.count("ledger/a") == 2  # the others are untouched
    finally:
        again.close()


def test_a_backup_made_while_the_host_runs_is_served_as_it_was(tmp_path: Path) -> None:
    data, copy = tmp_path / "data", tmp_path / "copy"
    server = Server(APP, data, ("--admin", "127.0.0.1:0"))
    try:
        fill(server)
        for bad, why in (
            ("relative/dir", "absolute"),
            (str(data / "inside"), "inside the data directory"),
            (str(data), "not an empty directory"),
        ):
            port = int(admin_url(data).rpartition(":")[2])
            reply = http_request(port, "POST", "/api/backup", json.dumps({"dest": bad}).encode())
            assert reply.status == 400 and why in reply.json()["message"], reply.json()
        assert not (data / "inside").exists()
        done = cli_json("backup", str(copy), "--data", str(data))
        assert done == {"dest": str(copy), "actors": 4, "bytes": done["bytes"], "failed": []}
        assert server.rpc("/ledger/a/_rpc/incr", {"by": 1}).status == 200  # after the copy
    finally:
        server.close()
    restored = Server(APP, copy, ())
    try:
        assert restored.count("ledger/a") == 2 and restored.count("ledger/c") == 2
        assert restored.get("/alarmer/x/").json()["alarm"] is not None
    finally:
        restored.close()
    alarms = cli_json("alarms", "--data", str(copy))
    assert [a["address"] for a in alarms["alarms"]] == ["alarmer/x"]


def test_an_admin_file_left_by_a_killed_host_sends_no_command_astray(tmp_path: Path) -> None:
    """A host killed with SIGKILL leaves its admin file; the next host, started without
    ``--admin``, removes it, and a command then says how to reach the host."""
    data = tmp_path / "data"
    first = Server(APP, data, ("--admin", "127.0.0.1:0"))
    first.proc.kill()
    first.proc.wait()
    assert (data / "host" / "admin.json").exists()
    second = Server(APP, data, ())
    try:
        assert not (data / "host" / "admin.json").exists()
        done = cli("ls", "--data", str(data))
        assert done.returncode == 1 and "without --admin" in done.stderr
    finally:
        second.close()


def test_params_and_destinations_sqlite_or_the_disk_cannot_take_are_refused(
    tmp_path: Path,
) -> None:
    root, _ = actor_db(tmp_path)
    for params in ([1 << 63], [-(1 << 63) - 1], ["\ud800"], [True], [b"x"]):
        with pytest.raises(InspectError, match="params"):
            inspect.query(root, "notes/n1", "SELECT ?", params)
    with pytest.raises(InspectError, match="Unicode"):
        inspect.query(root, "notes/n1", "SELECT '\ud800'")
    assert inspect.query(root, "notes/n1", "SELECT ?", [(1 << 63) - 1])["rows"] == [[(1 << 63) - 1]]
    from actorkeep.ops.backup import backup, check_destination

    for dest in (Path("/tmp/a\x00b"), Path("/tmp/\ud800")):
        with pytest.raises(InspectError):
            check_destination(dest)
    with pytest.raises(InspectError, match="cannot make"):
        backup(tmp_path, Path("/proc/nope/x"))


def test_counts_and_answers_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, _ = actor_db(tmp_path)
    monkeypatch.setattr(inspect, "MAX_COUNT", 1)
    rows = {t["name"]: t["rows"] for t in inspect.describe_actor(root, "notes/n1")["tables"]}
    assert rows == {"notes": None}  # over MAX_COUNT
    with pytest.raises(InspectError, match="too big"):
        inspect.query(root, "notes/n1", "SELECT randomblob(100000000)")
    monkeypatch.setattr(inspect, "MAX_ANSWER_BYTES", 10)
    big = inspect.query(root, "notes/n1", "SELECT 'abcdefgh' UNION ALL SELECT 'ijklmnop'")
    assert big["rows"] == [["abcdefgh"]] and big["truncated"]
