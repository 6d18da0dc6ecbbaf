"""Damaged storage is detected, reported with its file, and quarantined, never served.

Each test damages files the way issue 10's probe did (emptied, deleted, overwritten, a lost
``-wal``, a destroyed header, a damaged or deleted ``host.sqlite``) between two runs of a host,
and checks what the next host does: the damaged actor answers 503 ``Quarantined`` (its alarm
waits), the others are untouched, the log names the file once, and the host database is
rebuilt from the actors' own files when it cannot be trusted.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import structlog
import trio
import trio.testing

import actorkeep as ak
import shards
from actorkeep.address import actor_path
from actorkeep.testing import open_host

ROOT = Path(__file__).resolve().parents[1]
kv = ak.kv.Client("kv", shards=2)
fired: list[str] = []

app = ak.App()
app.mount(shards.KVShard, "kv")


@app.actor("user")
class User(ak.Actor):
    @ak.rpc
    async def put(self, key: str, value: str) -> int:
        return await kv.put(key, value.encode())

    @ak.rpc
    async def get(self, key: str) -> list[object] | None:
        entry = await kv.get_fresh(key)
        return None if entry is None else [entry.value.decode(), entry.version]


@app.actor("timer")
class Timer(ak.Actor):
    async def setup(self) -> None:
        self.sql.exec("CREATE TABLE IF NOT EXISTS notes (n TEXT)")

    @ak.rpc
    async def arm(self, delay: float) -> None:
        await self.set_alarm(self.now() + delay)

    @ak.rpc
    async def note(self, n: str) -> None:
        self.sql.exec("INSERT INTO notes VALUES (?)", (n,))

    @ak.rpc
    async def notes(self) -> list[str]:
        return [r[0] for r in self.sql.exec("SELECT n FROM notes")]

    async def alarm(self, info: ak.AlarmInfo) -> None:
        fired.append(self.address)


def file_of(data: Path, address: str) -> Path:
    class_name, name = address.split("/")
    return actor_path(data / "actors", class_name, name)


def shard_of(key: str) -> str:
    return f"kv/shard-{ak.kv.shard_for(key, 2)}"


async def rpc(host: ak.testing.TestHost, address: str, method: str, **args: object) -> object:
    resp = await host.request("POST", f"/{address}/_rpc/{method}", json=args)
    return resp.json() if resp.status == 200 else (resp.status, resp.json())


async def fill(data: Path) -> None:
    """Two KV keys on different shards, two timers with far alarms; registered, closed."""
    async with open_host(app, data) as host:
        assert shard_of("a") != shard_of("b")
        assert await rpc(host, "user/u", "put", key="a", value="one") == 1
        assert await rpc(host, "user/u", "put", key="b", value="two") == 1
        for name in ("t1", "t2"):
            await rpc(host, f"timer/{name}", "arm", delay=3600)
        await trio.sleep(1)  # every new actor is registered (registry.py)


@pytest.fixture(autouse=True)
def _clear() -> None:
    fired.clear()


# -- an actor's file ------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["emptied", "deleted"])
async def test_a_shard_whose_file_vanished_is_quarantined_not_restarted_at_version_1(
    data_dir: Path, autojump_clock: trio.testing.MockClock, damage: str
) -> None:
    await fill(data_dir)
    path = file_of(data_dir, shard_of("a"))
    if damage == "emptied":
        path.write_bytes(b"")
    else:
        path.unlink()
    with structlog.testing.capture_logs() as logs:
        async with open_host(app, data_dir) as host:
            got = await rpc(host, "user/u", "put", key="a", value="again")
            # The user actor sees the shard's 503 as an error of its own call.
            assert isinstance(got, tuple) and got[0] == 500
            assert "Quarantined" in got[1]["error"] or "quarantined" in got[1]["message"]
            why = "empty" if damage == "emptied" else "missing"
            assert host.host.quarantined == {shard_of("a"): f"its database file is {why}"}
            # The other shard is untouched and keeps its versions.
            assert await rpc(host, "user/u", "get", key="b") == ["two", 1]
            version = await rpc(host, "user/u", "put", key="b", value="three")
            assert isinstance(version, int) and version > 1
            # Callers get Quarantined (503), without the file's path.
            frame = ak.codec.pack({"key": b"a"})
            with pytest.raises(ak.Quarantined) as refused:
                await host.call_as("user/u", shard_of("a"), "POST", "/actorkeep-kv/v2/get", frame)
            assert refused.value.status == 503 and str(data_dir) not in refused.value.message
    (line,) = [e for e in logs if e["event"] == "actor quarantined: its storage is damaged"]
    assert line["file"] == str(path) and line["address"] == shard_of("a")
    # No version 1 was handed out again: the file was not recreated.
    assert not path.exists() or path.stat().st_size == 0
    # It stays quarantined across restarts.
    async with open_host(app, data_dir) as host:
        assert shard_of("a") in host.host.quarantined


async def test_a_lost_wal_with_commits_in_it_is_quarantined(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    await fill(data_dir)
    crashed = data_dir.parent / "crashed"
    async with open_host(app, data_dir) as host:
        await rpc(host, "timer/t1", "note", n="kept by a crash")
        # What a kill -9 leaves on disk now: the files as they are, -wal and -shm included.
        shutil.copytree(data_dir, crashed)
    path = file_of(crashed, "timer/t1")
    assert Path(f"{path}-wal").exists() and Path(f"{path}-shm").exists()
    Path(f"{path}-wal").unlink()  # the probe: rm the -wal of a crashed host's actor
    (crashed / "host" / "lock").unlink(missing_ok=True)
    async with open_host(app, crashed) as host:
        got = await rpc(host, "timer/t1", "notes")
        assert got[0] == 503 and got[1]["error"] == "Quarantined"  # type: ignore[index]
        assert "write-ahead log" in host.host.quarantined["timer/t1"]
        assert await rpc(host, "timer/t2", "notes") == []


async def test_an_overwritten_page_fails_the_check_at_open(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    await fill(data_dir)
    path = file_of(data_dir, "timer/t1")
    data = bytearray(path.read_bytes())
    data[4096 + 8 : 4096 + 4096] = b"\xa5" * (4096 - 8)  # page 2's cells, not its header
    path.write_bytes(bytes(data))
    async with open_host(app, data_dir) as host:
        got = await rpc(host, "timer/t1", "notes")
        assert got[0] == 503  # type: ignore[index]
        assert "quick_check" in host.host.quarantined["timer/t1"]


async def test_an_overwritten_kv_value_fails_its_checksum(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A value's bytes changed on disk pass SQLite's checks (they are not its structure);
    the row's checksum catches them, and the shard is quarantined instead of serving them."""
    await fill(data_dir)
    path = file_of(data_dir, shard_of("a"))
    data = path.read_bytes()
    assert data.count(b"one") == 1
    path.write_bytes(data.replace(b"one", b"ONE"))
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA quick_check").fetchone() == ("ok",)  # SQLite sees nothing
    conn.close()
    async with open_host(app, data_dir) as host:
        got = await rpc(host, "user/u", "get", key="a")
        assert isinstance(got, tuple) and got[0] == 500
        assert host.host.quarantined == {shard_of("a"): "the KV row of key b'a' fails its checksum"}
        assert await rpc(host, "user/u", "get", key="b") == ["two", 1]


async def test_a_destroyed_header_quarantines_and_the_alarm_is_not_retried_forever(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    await fill(data_dir)
    path = file_of(data_dir, "timer/t1")
    with path.open("r+b") as f:
        f.write(b"\x00" * 100)  # the 100-byte header: "file is not a database"
    with structlog.testing.capture_logs() as logs:
        async with open_host(app, data_dir) as host:
            await trio.sleep(2 * 3600)  # both alarms are due after an hour
            assert fired == ["timer/t2"]
            assert "timer/t1" in host.host.quarantined
            assert host.host.alarm_index.get("timer/t1") is not None  # kept for a repair
    events = [e["event"] for e in logs if e.get("address") == "timer/t1"]
    assert events == ["actor quarantined: its storage is damaged"]  # once, not every 2 s


# -- the host database ----------------------------------------------------------------------


async def test_a_deleted_host_database_is_rebuilt_from_the_actors(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    await fill(data_dir)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{data_dir}/host/host.sqlite{suffix}").unlink(missing_ok=True)
    with structlog.testing.capture_logs() as logs:
        async with open_host(app, data_dir) as host:
            assert host.host.alarm_index.get("timer/t1") is not None
            assert host.host.registry.has(shard_of("a"))
            await trio.sleep(2 * 3600)
            assert sorted(fired) == ["timer/t1", "timer/t2"]  # none of them was in memory
            # And what is registered is protected again: the shard's versions go on.
            version = await rpc(host, "user/u", "put", key="a", value="x")
            assert isinstance(version, int) and version > 1
    (rebuilt,) = [e for e in logs if e["event"] == "rebuilt the host database"]
    assert rebuilt["actors"] == 5 and rebuilt["alarms"] == 2 and rebuilt["quarantined"] == 0


@pytest.mark.parametrize("damage", ["header", "page"])
async def test_a_damaged_host_database_is_set_aside_and_rebuilt(
    data_dir: Path, autojump_clock: trio.testing.MockClock, damage: str
) -> None:
    await fill(data_dir)
    host_file = data_dir / "host" / "host.sqlite"
    conn = sqlite3.connect(host_file)
    (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'alarms'").fetchone()
    conn.close()
    data = bytearray(host_file.read_bytes())
    if damage == "header":
        data[:100] = b"\x00" * 100
    else:  # the cells of the alarm index's page (it holds the two entries)
        page = (root - 1) * 4096
        data[page + 8 : page + 4096] = b"\xa5" * (4096 - 8)
    host_file.write_bytes(bytes(data))
    with structlog.testing.capture_logs() as logs:
        async with open_host(app, data_dir) as host:
            await trio.sleep(2 * 3600)
            assert sorted(fired) == ["timer/t1", "timer/t2"]
            assert await rpc(host, "user/u", "get", key="a") == ["one", 1]
    (line,) = [e for e in logs if e["event"].startswith("the host database is damaged")]
    assert line["moved_to"] == f"{host_file}.damaged-1"
    assert Path(f"{host_file}.damaged-1").exists()


def test_a_damaged_host_database_is_one_clear_line_from_the_cli(tmp_path: Path) -> None:
    """``actorkeep serve`` on a damaged host.sqlite: one error line naming it, then serving."""
    data = tmp_path / "data"
    (data / "host").mkdir(parents=True)
    (data / "host" / "host.sqlite").write_bytes(b"this is not a database" * 300)
    from tests.test_process import serve

    with serve("examples.counter.app:app", data, "--max-active", "50") as server:
        assert server.rpc("/counter/a/_rpc/incr", {"by": 1}).json() == 1
        err = server.stderr()
    damaged = [ln for ln in err.splitlines() if "host database is damaged" in ln]
    assert len(damaged) == 1 and str(data / "host" / "host.sqlite") in damaged[0], err
    assert "Traceback" not in err


# -- quarantine is for damage only, and an operator can release it ---------------------------


async def test_a_plain_storage_error_is_not_damage(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    app2 = ak.App()

    @app2.actor("full")
    class Full(ak.Actor):
        @ak.rpc
        async def go(self) -> None:
            raise sqlite3.OperationalError("database or disk is full")

    async with open_host(app2, data_dir) as host:
        resp = await host.request("POST", "/full/a/_rpc/go")
        assert resp.status == 500
        assert host.host.quarantined == {}
        assert (await host.request("POST", "/full/a/_rpc/go")).status == 500  # still served


async def test_an_actor_may_report_damage_itself(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    app2 = ak.App()

    @app2.actor("own")
    class Own(ak.Actor):
        @ak.rpc
        async def check(self) -> None:
            raise ak.StorageDamaged("my own checksum does not match")

    async with open_host(app2, data_dir) as host:
        resp = await host.request("POST", "/own/a/_rpc/check")
        assert resp.status == 503 and resp.json()["error"] == "Quarantined"
        assert host.host.quarantined == {"own/a": "my own checksum does not match"}
        assert (await host.request("POST", "/own/b/_rpc/check")).status == 503


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "actorkeep", *args], cwd=ROOT, capture_output=True, text=True
    )


async def test_the_cli_lists_and_releases_quarantined_actors(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    await fill(data_dir)
    file_of(data_dir, "timer/t1").unlink()
    async with open_host(app, data_dir) as host:
        assert (await rpc(host, "timer/t1", "notes"))[0] == 503  # type: ignore[index]
        busy = await trio.to_thread.run_sync(cli, "quarantine", "--data", str(data_dir))
        assert busy.returncode == 1 and "in use by another host" in busy.stderr
    listed = cli("quarantine", "--data", str(data_dir))
    assert listed.returncode == 0
    address, _, reason = listed.stdout.strip().split("\t")
    assert (address, reason) == ("timer/t1", "its database file is missing")
    assert cli("quarantine", "--data", str(data_dir), "--release", "timer/t2").returncode == 1
    released = cli("quarantine", "--data", str(data_dir), "--release", "timer/t1")
    assert released.returncode == 0 and "starts it afresh" in released.stdout
    assert cli("quarantine", "--data", str(data_dir)).stdout == ""
    async with open_host(app, data_dir) as host:
        assert await rpc(host, "timer/t1", "notes") == []  # a new, empty actor


async def test_a_host_database_from_before_the_registry_registers_every_actor(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    long_name = "x:" * 99  # escaped, too long for a file name: kept as its digest
    async with open_host(app, data_dir) as host:
        await rpc(host, "timer/t1", "arm", delay=3600)
        await rpc(host, f"timer/{long_name}", "arm", delay=7200)
    conn = sqlite3.connect(data_dir / "host" / "host.sqlite")
    conn.execute("DROP TABLE actors")
    conn.commit()
    conn.close()
    with structlog.testing.capture_logs() as logs:
        async with open_host(app, data_dir) as host:
            assert host.host.registry.has("timer/t1")
            assert host.host.registry.has(f"timer/{long_name}")
    (rebuilt,) = [e for e in logs if e["event"] == "rebuilt the host database"]
    assert (rebuilt["actors"], rebuilt["alarms"]) == (2, 2)
    assert file_of(data_dir, f"timer/{long_name}").name.endswith("~h.sqlite")


async def test_a_lost_host_wal_is_damage_and_the_alarms_come_back_from_the_actors(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """kill -9 leaves host.sqlite's recent writes in its -wal; delete that file and those
    index entries would be gone without a word. The host sees the -shm's count of frames
    never copied in, sets the database aside and rebuilds it from the actors' rows."""
    await fill(data_dir)
    crashed = data_dir.parent / "crashed"
    async with open_host(app, data_dir) as host:
        await rpc(host, "timer/t3", "arm", delay=60)
        await trio.sleep(1)
        shutil.copytree(data_dir, crashed)  # what a kill -9 leaves now
    host_wal = crashed / "host" / "host.sqlite-wal"
    assert host_wal.exists() and (crashed / "host" / "host.sqlite-shm").exists()
    host_wal.unlink()
    (crashed / "host" / "lock").unlink(missing_ok=True)
    with structlog.testing.capture_logs() as logs:
        async with open_host(app, crashed) as host:
            assert host.host.alarm_index.get("timer/t3") is not None
            await trio.sleep(120)
            assert "timer/t3" in fired
    assert any(e["event"].startswith("the host database is damaged") for e in logs)
