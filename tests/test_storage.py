"""Storage: exec, exec_durable, sync, transactions, SQLAlchemy, files (docs/reference.md §3)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy
import trio
import trio.testing

import actorkeep as ak
from actorkeep.address import actor_path
from actorkeep.runtime.storage import FileStorage
from actorkeep.testing import open_host

from .conftest import sqlite_files

app = ak.App()


@app.actor("store")
class Store(ak.Actor):
    async def setup(self) -> None:
        self.sql.exec("CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY, v INTEGER)")

    @ak.rpc
    async def plain(self, k: str, v: int) -> None:
        self.sql.exec("INSERT OR REPLACE INTO t VALUES (?, ?)", (k, v))

    @ak.rpc
    async def durable(self, k: str, v: int) -> list[Any]:
        w = await self.sql.exec_durable(
            "INSERT OR REPLACE INTO t VALUES (?, ?) RETURNING k, v", (k, v)
        )
        return [w.rows, w.rowcount, w.fetchone()]

    @ak.rpc
    async def durable_tx(self, n: int) -> None:
        with self.sql.transaction():
            for i in range(n):
                self.sql.exec("INSERT OR REPLACE INTO t VALUES (?, ?)", (f"tx{i}", i))
            await self.sql.exec_durable("commit;")

    @ak.rpc
    async def durable_inside_tx(self) -> str:
        with self.sql.transaction():
            try:
                await self.sql.exec_durable("INSERT INTO t VALUES ('no', 1)")
            except RuntimeError as exc:
                return str(exc)
        return "accepted"

    @ak.rpc
    async def sync_many(self, n: int) -> None:
        for i in range(n):
            self.sql.exec("INSERT OR REPLACE INTO t VALUES (?, ?)", (f"s{i}", i))
        await self.sql.sync()

    @ak.rpc
    async def tx_rollback(self) -> int:
        try:
            with self.sql.transaction():
                self.sql.exec("INSERT INTO t VALUES ('rolled', 1)")
                raise LookupError
        except LookupError:
            pass
        return int(self.sql.exec("SELECT count(*) FROM t WHERE k = 'rolled'").fetchone()[0])

    @ak.rpc
    async def nested(self) -> str:
        with self.sql.transaction():
            try:
                with self.sql.transaction():
                    pass
            except RuntimeError as exc:
                return str(exc)
        return "nested"

    @ak.rpc
    async def get(self, k: str) -> int | None:
        row = self.sql.exec("SELECT v FROM t WHERE k = ?", (k,)).fetchone()
        return None if row is None else int(row[0])

    @ak.rpc
    async def with_sqlalchemy(self, k: str, v: int) -> list[Any]:
        t = sqlalchemy.table("t", sqlalchemy.column("k"), sqlalchemy.column("v"))
        self.db.execute(sqlalchemy.insert(t).values(k=k, v=v))
        rows = self.db.execute(sqlalchemy.select(t.c.k, t.c.v).where(t.c.k == k)).all()
        # Same connection: what SQLAlchemy wrote, plain sql sees at once, and vice versa.
        seen = self.sql.exec("SELECT v FROM t WHERE k = ?", (k,)).fetchone()[0]
        return [[list(r) for r in rows], seen]

    @ak.rpc
    async def sqlalchemy_in_transaction(self, fail: bool) -> None:
        t = sqlalchemy.table("t", sqlalchemy.column("k"), sqlalchemy.column("v"))
        with self.sql.transaction():
            self.sql.exec("INSERT INTO t VALUES ('sa1', 1)")
            self.db.execute(sqlalchemy.insert(t).values(k="sa2", v=2))  # first use of self.db
            self.db.commit()  # does not end the transaction: self.sql owns it
            if fail:
                raise RuntimeError("roll it all back")

    @ak.rpc
    async def leave_open(self) -> str:
        self.sql.exec("BEGIN")
        self.sql.exec("INSERT INTO t VALUES ('left', 1)")
        return "returned"

    @ak.rpc
    async def pragmas(self) -> list[Any]:
        return [
            self.sql.exec("PRAGMA journal_mode").fetchone()[0],
            self.sql.exec("PRAGMA synchronous").fetchone()[0],
        ]


async def rpc(host: ak.testing.TestHost, address: str, method: str, /, **args: Any) -> Any:
    resp = await host.request("POST", f"/{address}/_rpc/{method}", json=args)
    assert resp.status == 200, resp.body
    return resp.json()


async def test_plain_and_durable_writes_survive_restart(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        await rpc(host, "store/a", "plain", k="p", v=1)
        assert await rpc(host, "store/a", "durable", k="d", v=2) == [[["d", 2]], 1, ["d", 2]]
        await rpc(host, "store/a", "durable_tx", n=3)
        await rpc(host, "store/a", "sync_many", n=3)
        await host.restart()
        for k, v in [("p", 1), ("d", 2), ("tx2", 2), ("s2", 2)]:
            assert await rpc(host, "store/a", "get", k=k) == v


async def test_transaction_rules(data_dir: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with open_host(app, data_dir) as host:
        assert await rpc(host, "store/a", "tx_rollback") == 0
        assert "already open" in await rpc(host, "store/a", "nested")
        msg = await rpc(host, "store/a", "durable_inside_tx")
        assert "exec_durable('COMMIT')" in msg
        assert await rpc(host, "store/a", "get", k="no") is None


async def test_sqlalchemy_connection_shares_the_database(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        assert await rpc(host, "store/a", "with_sqlalchemy", k="sa", v=7) == [[["sa", 7]], 7]
        await host.restart()
        assert await rpc(host, "store/a", "get", k="sa") == 7


async def test_files_wal_and_layout(data_dir: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with open_host(app, data_dir) as host:
        # 0 = OFF: SQLite never syncs on the event loop; the host's sync threads do (storage.py)
        assert await rpc(host, "store/Mixed:Case", "pragmas") == ["wal", 0]
        await rpc(host, "store/mixed:case", "plain", k="x", v=1)
    files = sqlite_files(data_dir)
    assert files == sorted(
        [
            actor_path(data_dir / "actors", "store", "Mixed:Case"),
            actor_path(data_dir / "actors", "store", "mixed:case"),
        ]
    )
    assert all(f.resolve().is_relative_to(data_dir.resolve()) for f in files)
    with sqlite3.connect(files[0]) as conn:  # a plain SQLite file anyone can open
        conn.execute("SELECT count(*) FROM t").fetchone()


async def test_durable_write_does_not_stall_other_actors(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, sync_threads: None
) -> None:
    """The fsync of a durable write runs in a worker thread, so the event loop keeps going."""
    fsync_started = threading.Event()
    release = threading.Event()
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        if threading.current_thread() is not threading.main_thread():
            fsync_started.set()
            release.wait(10)
        real_fsync(fd)

    import actorkeep.runtime.storage as storage

    real_datasync = storage._datasync

    def slow_datasync(fd: int) -> None:  # the WAL's data sync, which durable writes wait for
        if threading.current_thread() is not threading.main_thread():
            fsync_started.set()
            release.wait(10)
        real_datasync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    monkeypatch.setattr(storage, "_datasync", slow_datasync)
    async with open_host(app, storage=FileStorage(data_dir, in_thread=True)) as host:
        await rpc(host, "store/other", "plain", k="warm", v=0)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(rpc, host, "store/writer", "durable", k="k", v=1))
            await trio.to_thread.run_sync(fsync_started.wait, 10)
            # The durable write is blocked inside fsync; another actor still answers.
            t0 = time.monotonic()
            for i in range(20):
                await rpc(host, "store/other", "plain", k=f"k{i}", v=i)
            assert time.monotonic() - t0 < 5
            release.set()
        assert await rpc(host, "store/writer", "get", k="k") == 1


async def test_plain_fsync_mode_runs_inline(data_dir: Path) -> None:
    """Under a virtual clock (and in simulation) storage must not use threads."""
    storage = FileStorage(data_dir, in_thread=False)
    assert storage.syncer is None
    db = storage.open_actor("store", "x")
    db.conn.execute("CREATE TABLE t (x)")
    threads = threading.active_count()
    await db.sync()
    await db.checkpoint()
    db.close()
    assert threading.active_count() == threads
    storage.close()


async def test_sqlalchemy_never_ends_an_open_transaction(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        resp = await host.request(
            "POST", "/store/a/_rpc/sqlalchemy_in_transaction", json={"fail": True}
        )
        assert resp.status == 500
        assert await rpc(host, "store/a", "get", k="sa1") is None
        assert await rpc(host, "store/a", "get", k="sa2") is None
        await rpc(host, "store/b", "sqlalchemy_in_transaction", fail=False)
        assert await rpc(host, "store/b", "get", k="sa1") == 1
        assert await rpc(host, "store/b", "get", k="sa2") == 2


async def test_an_event_may_not_end_with_an_open_transaction(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        resp = await host.request("POST", "/store/a/_rpc/leave_open")
        assert resp.status == 500
        assert "transaction still open" in resp.json()["message"]
        assert await rpc(host, "store/a", "get", k="left") is None  # rolled back, not carried on
        await rpc(host, "store/a", "plain", k="next", v=1)
        await host.restart()
        assert await rpc(host, "store/a", "get", k="next") == 1


async def test_an_actor_reopened_while_its_last_database_closes_waits_for_the_close(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database closes in a sync thread, where SQLite's last-connection checkpoint holds the
    file exclusively: the actor's next database must not open before that has ended."""
    from actorkeep.runtime.storage import FileDatabase

    closing = threading.Event()
    real_close = FileDatabase._close

    def slow_close(self: FileDatabase) -> None:
        closing.set()
        time.sleep(0.3)
        real_close(self)

    monkeypatch.setattr(FileDatabase, "_close", slow_close)
    storage = FileStorage(data_dir, in_thread=True)
    db = storage.open_actor("store", "x")
    db.conn.execute("CREATE TABLE t (x)")
    db.close()
    await trio.to_thread.run_sync(closing.wait, 5)
    started = time.monotonic()
    await storage.ready("store", "x")
    assert time.monotonic() - started >= 0.2  # it waited for the close to end
    await storage.ready("store", "y")  # nothing being closed: no wait
    again = storage.open_actor("store", "x", existing=True)
    again.conn.execute("INSERT INTO t VALUES (1)")
    again.close()
    await storage.ready("store", "x")
    storage.close()


async def test_the_host_database_log_is_copied_in_the_background_and_starts_afresh(
    data_dir: Path,
) -> None:
    """Past WAL_CHECKPOINT_BYTES of log a sync copies the host database's log (a second
    connection, PASSIVE); its own connection then starts the log afresh on its next write."""
    from actorkeep.runtime import storage as storage_module

    storage = FileStorage(data_dir, in_thread=True)
    db = storage.open_host_db()
    db.conn.execute("CREATE TABLE big (x BLOB)")
    await db.sync()  # the first sync: the connection syncs log headers from now on
    chunk = b"x" * (1 << 20)
    for _ in range(storage_module.WAL_CHECKPOINT_BYTES // len(chunk) + 2):
        db.conn.execute("INSERT INTO big VALUES (?)", (chunk,))
    assert db._log_bytes() > storage_module.WAL_CHECKPOINT_BYTES
    await db.sync()  # copies the log in the background
    db.conn.execute("INSERT INTO big VALUES (x'00')")  # starts the log afresh
    assert db._log_bytes() < 1 << 20
    assert db.conn.execute("SELECT count(*) FROM big").fetchone()[0] > 16
    db.close()
    storage.close()


def _locks_held(path: Path) -> int:
    """How many POSIX locks this process holds on ``path`` (/proc/locks)."""
    st = os.stat(path)
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    pid = str(os.getpid())
    with open("/proc/locks") as f:
        return sum(1 for line in f if line.split()[4:6] == [pid, device])


@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="needs Linux's /proc/locks")
@pytest.mark.parametrize("in_thread", [True, False])
async def test_the_host_never_drops_sqlite_s_locks(data_dir: Path, in_thread: bool) -> None:
    """Closing any descriptor of a file drops every POSIX lock the process holds on it. The
    storage reads -shm and fsyncs the database through descriptors it keeps open: SQLite's
    locks on both stay, so another process opening the file (the sqlite3 shell, a backup)
    cannot take it for unused and rebuild its index or delete its log under the host."""
    storage = FileStorage(data_dir, in_thread=in_thread)
    db = storage.open_actor("store", "locks")  # a new file: its first sync fsyncs the file too
    db.conn.execute("CREATE TABLE t (x)")
    db.conn.execute("INSERT INTO t VALUES (1)")
    path = Path(db.where)
    shm = Path(f"{path}-shm")
    before = (_locks_held(path), _locks_held(shm))
    assert before[0] > 0 and before[1] > 0  # SQLite's own: the database's and -shm's
    db.checkpoint_due()  # reads the log's size off -shm
    await db.sync()
    db.conn.execute("DELETE FROM t")  # reads and writes go on as before
    assert (_locks_held(path), _locks_held(shm)) == before
    # Another process opens, reads and closes the file: it must not take the log with it.
    code = "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute('SELECT * FROM t')"
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, timeout=30)
    assert Path(f"{path}-wal").exists()
    db.close()
    await storage.ready("store", "locks")
    storage.close()


async def test_a_storage_that_cannot_open_an_actor_here_answers_503(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A backend may refuse to open an actor for now (in a cluster: another host serves its
    partition) by raising ``Overloaded``: nothing of the event runs and the caller gets 503
    with Retry-After, to try again, not a failed event."""

    class NotHere(FileStorage):
        def open_actor(self, class_name: str, name: str, existing: bool = False) -> Any:
            if name == "elsewhere":
                raise ak.Overloaded("store/elsewhere is not served here now", retry_after=2.0)
            return super().open_actor(class_name, name, existing)

    async with open_host(app, storage=NotHere(data_dir, in_thread=False)) as host:
        resp = await host.request("POST", "/store/elsewhere/_rpc/tx_rollback")
        assert resp.status == 503 and resp.headers["retry-after"] == "2"
        assert (await host.request("POST", "/store/here/_rpc/tx_rollback")).status == 200
    assert not actor_path(data_dir / "actors", "store", "elsewhere").exists()
