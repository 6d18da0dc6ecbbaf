"""Runs (decision 0030): the events queued for an actor of a ``coalesce_writes`` class share
one SQLite transaction. A gated write counts at once (its reply waits) and no sync starts
until the run commits; a plain write, a transaction, a wait for durability or a failure
commits the run first; a run's transaction that ends under it refuses what it held."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import outcome
import pytest
import trio
import trio.testing

import actorkeep as ak
import actorkeep.runtime.storage as storage
from actorkeep.runtime.gate import Gate
from actorkeep.sql import RunLost, Sql
from actorkeep.testing import open_host
from sim.bugs import UnheldRunGate
from sim.storage import SimStorage

app = ak.App()


class _Tally(ak.Actor):
    async def setup(self) -> None:
        self.sql.exec("CREATE TABLE IF NOT EXISTS t (x INTEGER PRIMARY KEY, pad BLOB)")

    @ak.rpc
    async def add(self, x: int, pause: float = 0.0) -> int:
        """A gated write; a pause after it suspends the event in the middle of its run."""
        self.sql.exec("INSERT INTO t VALUES (?, zeroblob(100))", (x,), durable=True)
        if pause:
            await trio.sleep(pause)
        return x

    @ak.rpc
    async def add_then_fail(self, x: int) -> None:
        self.sql.exec("INSERT INTO t VALUES (?, zeroblob(100))", (x,), durable=True)
        raise ValueError("the handler failed after its write")

    @ak.rpc
    async def add_twice_or_roll_back(self, x: int) -> None:
        """The second insert conflicts, and ``OR ROLLBACK`` makes SQLite roll back the whole
        transaction: in a run, the run's."""
        self.sql.exec("INSERT INTO t VALUES (?, zeroblob(100))", (x,), durable=True)
        self.sql.exec("INSERT OR ROLLBACK INTO t VALUES (?, zeroblob(100))", (x,), durable=True)

    @ak.rpc
    async def add_in_raw_transaction(self, x: int) -> int:
        """``BEGIN`` and ``COMMIT`` of the handler's own: a run commits first."""
        self.sql.exec("BEGIN IMMEDIATE")
        self.sql.exec("INSERT INTO t VALUES (?, zeroblob(100))", (x,))
        await self.sql.exec_durable("COMMIT")
        return x

    @ak.rpc
    async def add_plain_returning(self, x: int) -> int:
        """A plain write: committed before its reply leaves, in a run as outside one."""
        (row,) = self.sql.exec(
            "INSERT INTO t VALUES (?, zeroblob(100)) RETURNING x", (x,)
        ).fetchall()
        return int(row[0])

    @ak.rpc
    async def wipe(self, x: int = 0) -> str:
        await self.delete_all()
        return "wiped"

    @ak.rpc
    async def add_in_transaction(self, x: int) -> int:
        with self.sql.transaction(durable=True):
            self.sql.exec("INSERT INTO t VALUES (?, zeroblob(100))", (x,))
        return x

    @ak.rpc
    async def rows(self) -> list[int]:
        return [r[0] for r in self.sql.exec("SELECT x FROM t ORDER BY x")]


@app.actor("tally")
class Tally(_Tally):
    coalesce_writes = True


@app.actor("single")
class Single(_Tally):
    """The same class without runs: one transaction per event, as every class by default."""


async def call(host: ak.testing.TestHost, address: str, method: str, /, **args: Any) -> Any:
    resp = await host.request("POST", f"/{address}/_rpc/{method}", json=args)
    return resp.status, resp.json()


def _log_frames(data_dir: Path, name: str) -> int:
    (wal,) = (data_dir / "actors" / name).rglob("a.sqlite-wal")
    return (wal.stat().st_size - 32) // (4096 + 24)


async def _add_together(host: ak.testing.TestHost, address: str, xs: range) -> list[Any]:
    replies: list[Any] = []

    async def add(x: int) -> None:
        replies.append(await call(host, address, "add", x=x))

    async with trio.open_nursery() as nursery:
        for x in xs:
            nursery.start_soon(add, x)
    return replies


async def test_queued_durable_writes_of_a_coalescing_class_commit_together(
    data_dir: Path,
) -> None:
    async with open_host(app, data_dir) as host:
        for address in ("tally/a", "single/a"):
            assert await call(host, address, "rows") == (200, [])
        before = {name: _log_frames(data_dir, name) for name in ("tally", "single")}
        for address in ("tally/a", "single/a"):
            replies = await _add_together(host, address, range(64))
            assert sorted(replies) == [(200, x) for x in range(64)]
            assert await call(host, address, "rows") == (200, list(range(64)))
        single = _log_frames(data_dir, "single") - before["single"]
        tally = _log_frames(data_dir, "tally") - before["tally"]
    assert single >= 63  # a commit, and a frame of the table's page, per event but the first
    assert tally <= single // 4, (tally, single)


class _SyncsSee:
    """At every fdatasync of a database: how many rows of ``t`` it covers (committed)."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def datasync(self, real: Callable[[int], None], fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if os.path.basename(path).startswith("a.sqlite") and "tally" in path:
            reader = sqlite3.connect(f"file:{path.removesuffix('-wal')}?mode=ro", uri=True)
            try:
                self.seen.append(reader.execute("SELECT count(*) FROM t").fetchone()[0])
            finally:
                reader.close()
        real(fd)


@pytest.fixture
def syncs_see(monkeypatch: pytest.MonkeyPatch, sync_threads: None) -> Iterator[_SyncsSee]:
    seeing = _SyncsSee()
    real = storage._datasync
    monkeypatch.setattr(storage, "_datasync", lambda fd: seeing.datasync(real, fd))
    yield seeing


@pytest.mark.parametrize("gate", [Gate, UnheldRunGate], ids=["gate", "planted-unheld-run"])
async def test_no_sync_starts_before_the_run_commits_even_while_an_event_waits(
    data_dir: Path, syncs_see: _SyncsSee, gate: type[Gate]
) -> None:
    """An event of a run that suspends (1 waits 0.3 s after its write) leaves the run's
    transaction open meanwhile: a sync then would cover a write it cannot see. Every reply
    must come after a sync that saw its row."""
    async with open_host(app, data_dir, gate=gate) as host:
        assert await call(host, "tally/a", "rows") == (200, [])
        await trio.sleep(0.2)  # the registration's sync
        acknowledged: list[tuple[int, int]] = []  # (rows acknowledged, rows the syncs saw)

        async def add(x: int, pause: float) -> None:
            status, _ = await call(host, "tally/a", "add", x=x, pause=pause)
            assert status == 200
            acknowledged.append((len(acknowledged) + 1, max(syncs_see.seen, default=0)))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(add, 0, 0.2)
            await trio.sleep(0.05)  # 0 waits in its handler; 1, 2 and 3 queue: a run
            nursery.start_soon(add, 1, 0.3)  # which waits after its write
            nursery.start_soon(add, 2, 0.0)
            nursery.start_soon(add, 3, 0.0)
    if gate is UnheldRunGate:
        assert any(seen < count for count, seen in acknowledged), acknowledged
    else:
        assert all(seen >= count for count, seen in acknowledged), acknowledged


async def _queued_in_a_run(
    host: ak.testing.TestHost, first: int, *queued: tuple[str, int]
) -> list[Any]:
    """The replies to ``queued`` (``(method, x)``, queued in this order) behind an ``add`` of
    ``first`` to ``tally/a`` that waits 0.2 s in its handler: they run as one run."""
    replies: list[Any] = [None] * len(queued)

    async def one(i: int, method: str, x: int) -> None:
        replies[i] = await call(host, "tally/a", method, x=x)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(call, host, "tally/a", "add", x=first, pause=0.2))
        await trio.sleep(0.05)
        for i, (method, x) in enumerate(queued):
            nursery.start_soon(one, i, method, x)
            await trio.sleep(0.01)  # queued in this order
    return replies


async def test_a_failed_event_in_a_run_keeps_the_writes_before_it(data_dir: Path) -> None:
    async with open_host(app, data_dir) as host:
        assert await call(host, "tally/a", "rows") == (200, [])
        queued = [("add_then_fail" if x == 3 else "add", x) for x in range(1, 7)]
        replies = await _queued_in_a_run(host, 0, *queued)
        assert [status for status, _ in replies] == [200, 200, 500, 200, 200, 200]
        # As without runs: the failed event's own statement stays, as autocommit keeps it.
        assert await call(host, "tally/a", "rows") == (200, list(range(7)))


async def test_a_run_whose_transaction_a_handler_ended_refuses_what_it_held(
    data_dir: Path,
) -> None:
    async with open_host(app, data_dir) as host:
        assert await call(host, "tally/a", "rows") == (200, [])
        replies = await _queued_in_a_run(host, 0, ("add", 1), ("add_twice_or_roll_back", 2))
        # 1's write was rolled back with the run: it is never acknowledged.
        assert [status for status, _ in replies] != [200, 200] and replies[0][0] != 200
        status, rows = await call(host, "tally/a", "rows")
        assert status == 200 and 1 not in rows and 2 not in rows


async def test_a_transaction_in_a_run_commits_the_run_first(data_dir: Path) -> None:
    async with open_host(app, data_dir) as host:
        assert await call(host, "tally/a", "rows") == (200, [])
        queued = (("add", 1), ("add_in_transaction", 2), ("add", 3))
        assert await _queued_in_a_run(host, 0, *queued) == [(200, 1), (200, 2), (200, 3)]
        assert await call(host, "tally/a", "rows") == (200, [0, 1, 2, 3])


# -- Sql and Gate alone -------------------------------------------------------------------------
class _Store:
    """A database for a gate: records what each sync start could see (committed rows)."""

    def __init__(self, path: Path) -> None:
        self.where = str(path)
        self.reader = sqlite3.connect(path, isolation_level=None)
        self.started: list[int] = []
        self.pending: list[Callable[[BaseException | None], None]] = []

    def start_sync(self, done: Callable[[BaseException | None], None]) -> bool:
        self.started.append(self.reader.execute("SELECT count(*) FROM t").fetchone()[0])
        self.pending.append(done)
        return True

    def end_syncs(self) -> None:
        pending, self.pending = self.pending, []
        for done in pending:
            done(None)


@pytest.fixture
def opened(tmp_path: Path) -> Iterator[tuple[sqlite3.Connection, _Store, Gate, list[Any]]]:
    path = tmp_path / "a.sqlite"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t (x INTEGER PRIMARY KEY)")
    db = _Store(path)
    released: list[Any] = []  # what the gate let out, and ("refused", what) for a refusal

    def spawn(fn: Any) -> None:
        raise AssertionError("the store starts its syncs itself")

    def release(held: Any, result: Any) -> None:
        released.append(held)

    def refuse(held: Any, error: BaseException) -> None:
        released.append(("refused", held))

    gate = Gate(db, spawn, release, refuse, lambda error: None)  # type: ignore[arg-type]
    yield conn, db, gate, released
    db.reader.close()
    conn.close()


_OneWrite = tuple[sqlite3.Connection, _Store, Gate, list[Any], Sql]


@pytest.fixture
def one_write(opened: tuple[sqlite3.Connection, _Store, Gate, list[Any]]) -> _OneWrite:
    """A run begun on ``opened``, and a gated write of 1 in it."""
    conn, db, gate, released = opened
    sql = Sql(conn, gate)
    sql.begin_run(gate)
    sql.exec("INSERT INTO t VALUES (1)", durable=True)
    return conn, db, gate, released, sql


def test_a_gated_write_in_a_run_is_held_and_synced_only_after_the_commit(
    opened: tuple[sqlite3.Connection, _Store, Gate, list[Any]],
) -> None:
    conn, db, gate, released = opened
    sql = Sql(conn, gate)
    sql.begin_run(gate)
    for x in range(3):
        sql.exec("INSERT INTO t VALUES (?)", (x,), durable=True)
        gate.hold(x, outcome.Value(x))
    assert sql.in_run and not sql.in_transaction
    assert db.started == [] and released == [] and gate.closed
    sql.settle()
    assert db.started == [3]  # one sync, which sees all three
    db.end_syncs()
    assert released == [0, 1, 2] and not gate.closed


def test_a_plain_write_in_a_run_commits_at_once_and_a_read_does_not(
    one_write: _OneWrite,
) -> None:
    conn, db, _gate, _, sql = one_write
    assert sql.exec("SELECT count(*) FROM t").fetchone() == (1,)
    assert sql.in_run  # a read leaves the run open
    assert db.started == []
    sql.exec("INSERT INTO t VALUES (2) RETURNING x")  # the run commits before it runs
    assert not sql.in_run and not conn.in_transaction
    assert db.reader.execute("SELECT count(*) FROM t").fetchone() == (2,)
    assert db.started == [1]  # the run's sync


def test_a_wait_for_durability_in_a_run_commits_it_first(
    one_write: _OneWrite,
) -> None:
    _conn, db, gate, _, sql = one_write

    async def wait() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(gate.wait)
            await trio.testing.wait_all_tasks_blocked()
            assert not sql.in_run and db.started == [1]
            db.end_syncs()

    trio.run(wait)


def test_a_run_lost_to_its_handler_fails_the_gate(
    one_write: _OneWrite,
) -> None:
    _conn, db, gate, released, sql = one_write
    gate.hold("one", outcome.Value(1))
    with pytest.raises(RunLost):
        sql.exec("INSERT OR ROLLBACK INTO t VALUES (1)", durable=True)
    assert gate.failed is not None and released == [("refused", "one")] and db.started == []


def test_a_failed_statement_in_a_run_keeps_the_run(
    one_write: _OneWrite,
) -> None:
    _conn, db, gate, _, sql = one_write
    with pytest.raises(sqlite3.IntegrityError):
        sql.exec("INSERT INTO t VALUES (1)", durable=True)
    assert sql.in_run
    sql.settle()
    assert db.started == [1] and gate.failed is None


def test_a_run_whose_commit_fails_refuses_what_it_held(
    opened: tuple[sqlite3.Connection, _Store, Gate, list[Any]],
) -> None:
    """A deferred constraint is checked at the run's commit: it fails, and nothing of the
    run is acknowledged (every event of it, not the one that broke the constraint alone)."""
    conn, db, gate, released = opened
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute("CREATE TABLE child (p INTEGER REFERENCES t (x) DEFERRABLE INITIALLY DEFERRED)")
    sql = Sql(conn, gate)
    sql.begin_run(gate)
    sql.exec("INSERT INTO t VALUES (1)", durable=True)
    gate.hold("first", outcome.Value(1))
    sql.exec("INSERT INTO child VALUES (99)", durable=True)  # no row 99: fails at the commit
    gate.hold("second", outcome.Value(2))
    with pytest.raises(sqlite3.IntegrityError):
        sql.settle()
    assert gate.failed is not None and not conn.in_transaction
    assert released == [("refused", "first"), ("refused", "second")] and db.started == []
    assert db.reader.execute("SELECT count(*) FROM t").fetchone() == (0,)


@pytest.mark.parametrize(
    "statement",
    ["PRAGMA foreign_keys=ON", "SAVEPOINT sp", "BEGIN", "VACUUM", "-- a comment\nSELECT 1"],
)
def test_a_statement_a_run_does_not_take_commits_the_run_first(
    one_write: _OneWrite, statement: str
) -> None:
    conn, db, _gate, _, sql = one_write
    sql.exec(statement)
    assert not sql.in_run and db.started == [1]
    if statement == "PRAGMA foreign_keys=ON":  # outside a transaction it takes effect
        assert conn.execute("PRAGMA foreign_keys").fetchone() == (1,)
    if statement in ("SAVEPOINT sp", "BEGIN"):  # the handler's own, open after the run's commit
        assert conn.in_transaction and sql.in_transaction


def test_an_acknowledged_plain_write_survives_a_failed_commit_of_its_run(
    opened: tuple[sqlite3.Connection, _Store, Gate, list[Any]],
) -> None:
    conn, db, gate, _ = opened
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute("CREATE TABLE child (p INTEGER REFERENCES t (x) DEFERRABLE INITIALLY DEFERRED)")
    sql = Sql(conn, gate)
    sql.begin_run(gate)
    sql.exec("SELECT count(*) FROM t").fetchone()
    assert sql.exec("INSERT INTO t VALUES (1) RETURNING x").fetchall() == [(1,)]
    assert not gate.closed  # a plain write: its reply may leave now
    sql.begin_run(gate)  # the next events' run
    sql.exec("INSERT INTO child VALUES (99)", durable=True)
    with pytest.raises(sqlite3.IntegrityError):
        sql.settle()
    assert db.reader.execute("SELECT x FROM t").fetchall() == [(1,)]


async def test_a_run_whose_last_events_were_abandoned_commits_before_the_worker_parks(
    data_dir: Path,
) -> None:
    """The run begun for 1 (with 2 queued) ends when 2's caller has given up: nothing is
    queued when the worker would park, so the run commits then, and 1's reply leaves after
    one sync, not when the idle actor is evicted."""
    async with open_host(app, data_dir) as host:
        assert await call(host, "tally/a", "rows") == (200, [])
        await trio.sleep(0.2)
        took: dict[int, float] = {}

        async def add(x: int) -> None:
            start = trio.current_time()
            assert await call(host, "tally/a", "add", x=x) == (200, x)
            took[x] = trio.current_time() - start

        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(call, host, "tally/a", "add", x=0, pause=0.2))
            await trio.sleep(0.05)
            nursery.start_soon(add, 1)
            await trio.sleep(0.01)
            async with trio.open_nursery() as gives_up:
                gives_up.start_soon(add, 2)
                await trio.sleep(0.01)
                gives_up.cancel_scope.cancel()
        assert took[1] < 2.0, took
        # An event the actor runs in the caller's task now (idle) is not in a stale run.
        with trio.fail_after(2):
            assert await call(host, "tally/a", "add_in_transaction", x=3) == (200, 3)
        assert await call(host, "tally/a", "rows") == (200, [0, 1, 3])


async def test_a_plain_write_in_a_run_is_committed_when_its_reply_leaves(
    data_dir: Path,
) -> None:
    async with open_host(app, data_dir) as host:
        assert await call(host, "tally/a", "rows") == (200, [])
        committed: dict[str, Any] = {}

        async def plain() -> None:
            committed["reply"] = await call(host, "tally/a", "add_plain_returning", x=7)
            (path,) = (data_dir / "actors" / "tally").rglob("a.sqlite")
            reader = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            try:  # what another connection (and a crash now) sees
                committed["rows"] = [r[0] for r in reader.execute("SELECT x FROM t")]
            finally:
                reader.close()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(call, host, "tally/a", "add", x=0, pause=0.2))
            await trio.sleep(0.05)
            nursery.start_soon(plain)  # a run: another event waits 1 s behind it
            await trio.sleep(0.01)
            nursery.start_soon(partial(call, host, "tally/a", "add", x=8, pause=1.0))
        assert committed["reply"] == (200, 7) and 7 in committed["rows"], committed


async def test_raw_transactions_and_delete_all_work_in_a_run(data_dir: Path) -> None:
    async with open_host(app, data_dir) as host:
        assert await call(host, "tally/a", "rows") == (200, [])
        queued = (("add", 1), ("add_in_raw_transaction", 2), ("add", 3))
        assert await _queued_in_a_run(host, 0, *queued) == [(200, 1), (200, 2), (200, 3)]
        assert await call(host, "tally/a", "rows") == (200, [0, 1, 2, 3])
        replies = await _queued_in_a_run(host, 4, ("add", 5), ("wipe", 0))
        assert replies == [(200, 5), (200, "wiped")]


@pytest.mark.parametrize("fsync_tasks", [False, True], ids=["gate-task", "storage-tasks"])
async def test_a_closed_databases_sync_waits_for_a_run_on_its_next_connection_in_simulation(
    autojump_clock: trio.testing.MockClock, fsync_tasks: bool
) -> None:
    """The simulator's storage cannot take the committed image of a connection in a
    transaction. A sync of an evicted actor's old connection may come while its next one has
    a run open (an event of it waits 8 s): it waits for the run to end, and every reply is
    200, as on a disk (the simulator raised, and refused 2, at first)."""
    delay = [0.0]
    disk = SimStorage(fsync_delay=lambda: delay[0])
    view = disk.view()
    results: dict[int, Any] = {}

    async def add(x: int, pause: float = 0.0) -> None:
        results[x] = await call(host, "tally/a", "add", x=x, pause=pause)

    async with trio.open_nursery() as fsyncs:
        if fsync_tasks:
            view.spawn = fsyncs.start_soon  # as sim.World runs its hosts
        async with open_host(app, storage=view) as host:
            assert await call(host, "tally/a", "rows") == (200, [])
            await trio.sleep(1)
            delay[0] = 5.0  # every fsync now takes 5 s
            async with trio.open_nursery() as nursery:
                nursery.start_soon(add, 1)
                await trio.sleep(0.01)
                nursery.start_soon(add, 2)  # its write waits for the next sync
                await trio.sleep(0.5)
                act = host.host.activations.get("tally/a")
                assert act is not None and act.parked and act.gate is not None
                assert act.gate.busy
                host.host.activations.evict(act)  # idle, with a sync in flight
                await trio.sleep(0.01)
                nursery.start_soon(add, 3, 1.0)  # opens it again, outside a run
                await trio.sleep(0.1)
                nursery.start_soon(add, 4, 8.0)  # begins a run, and waits after its write
                await trio.sleep(0.01)
                nursery.start_soon(add, 5)
            assert results == {x: (200, x) for x in range(1, 6)}, results
            assert await call(host, "tally/a", "rows") == (200, [1, 2, 3, 4, 5])
