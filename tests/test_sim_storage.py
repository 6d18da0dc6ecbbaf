"""The simulation storage: crash keeps what was committed, power loss keeps what was synced,
and a crashed incarnation's connections refuse every later use."""

from __future__ import annotations

import random
import sqlite3

import pytest
import trio

from sim.storage import Fenced, SimStorage


def _rows(storage: SimStorage, key: str = "actors/t/a") -> list[tuple[object, ...]]:
    return storage.read(key, "SELECT x FROM t ORDER BY x")


async def _write(storage: SimStorage) -> None:
    """Commit 1 and sync, commit 2 without sync, leave 3 in an open transaction."""
    db = storage.view().open_actor("t", "a")
    db.conn.execute("CREATE TABLE t (x INTEGER)")
    db.conn.execute("INSERT INTO t VALUES (1)")
    await db.sync()
    db.conn.execute("INSERT INTO t VALUES (2)")
    db.conn.execute("BEGIN IMMEDIATE")
    db.conn.execute("INSERT INTO t VALUES (3)")


async def test_crash_keeps_committed_and_drops_the_open_transaction() -> None:
    storage = SimStorage()
    await _write(storage)
    (view,) = storage._views
    storage.crash(view)
    assert _rows(storage) == [(1,), (2,)]
    db = storage.view().open_actor("t", "a")  # the next incarnation
    assert db.conn.execute("SELECT x FROM t ORDER BY x").fetchall() == [(1,), (2,)]


async def test_power_loss_keeps_what_was_synced() -> None:
    storage = SimStorage()
    await _write(storage)
    rolled = storage.power_loss(storage._views[0], random.Random(1), p_rollback=1.0)
    assert rolled == ["actors/t/a"]
    assert _rows(storage) == [(1,)]


async def test_power_loss_may_keep_committed_per_file() -> None:
    storage = SimStorage()
    await _write(storage)
    assert storage.power_loss(storage._views[0], random.Random(1), p_rollback=0.0) == []
    assert _rows(storage) == [(1,), (2,)]


async def test_files_are_rolled_back_independently() -> None:
    storage = SimStorage()
    view = storage.view()
    for name in "abcdefgh":
        db = view.open_actor("t", name)
        db.conn.execute("CREATE TABLE t (x INTEGER)")
        await db.sync()
        db.conn.execute("INSERT INTO t VALUES (1)")  # committed, not synced
    rolled = storage.power_loss(view, random.Random(3), p_rollback=0.5)
    assert 0 < len(rolled) < 8
    for name in "abcdefgh":
        key = f"actors/t/{name}"
        assert _rows(storage, key) == ([] if key in rolled else [(1,)])


async def test_a_never_synced_file_vanishes_on_power_loss() -> None:
    storage = SimStorage()
    view = storage.view()
    db = view.open_actor("t", "a")
    db.conn.execute("CREATE TABLE t (x INTEGER)")
    storage.power_loss(view, random.Random(0), p_rollback=1.0)
    db = storage.view().open_actor("t", "a")
    assert db.conn.execute("SELECT name FROM sqlite_master").fetchall() == []


async def test_a_fenced_incarnation_can_change_nothing() -> None:
    storage = SimStorage()
    view = storage.view()
    db = view.open_actor("t", "a")
    db.conn.execute("CREATE TABLE t (x INTEGER)")
    db.conn.execute("INSERT INTO t VALUES (1)")
    storage.crash(view)
    with pytest.raises(sqlite3.ProgrammingError):
        db.conn.execute("INSERT INTO t VALUES (2)")
    with pytest.raises(Fenced):
        await db.sync()
    with pytest.raises(Fenced):
        view.open_actor("t", "b")
    db.close()  # the dying host's cleanup: a no-op
    assert _rows(storage) == [(1,)]


async def test_a_crash_during_the_fsync_does_not_make_it_durable() -> None:
    storage = SimStorage(fsync_delay=lambda: 1.0)
    view = storage.view()
    db = view.open_actor("t", "a")
    db.conn.execute("CREATE TABLE t (x INTEGER)")
    with pytest.RaisesGroup(Fenced):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(db.sync)
            await trio.sleep(0.5)
            storage.crash(view)
    assert storage.files["actors/t/a"].durable is None
    assert storage.files["actors/t/a"].committed is not None


async def test_sync_inside_a_transaction_is_refused_loudly() -> None:
    db = SimStorage().view().open_actor("t", "a")
    db.conn.execute("CREATE TABLE t (x INTEGER)")
    db.conn.execute("BEGIN")
    with pytest.raises(RuntimeError, match="inside an open transaction"):
        await db.sync()


async def test_reopening_an_open_file_hands_the_state_over() -> None:
    storage = SimStorage()
    view = storage.view()
    old = view.open_actor("t", "a")
    old.conn.execute("CREATE TABLE t (x INTEGER)")
    old.conn.execute("INSERT INTO t VALUES (1)")
    new = view.open_actor("t", "a")  # an evicted activation has not closed yet
    assert new.conn.execute("SELECT x FROM t").fetchall() == [(1,)]
    with pytest.raises(sqlite3.ProgrammingError):
        old.conn.execute("SELECT 1")
    old.close()
    new.conn.execute("INSERT INTO t VALUES (2)")
    new.close()
    assert _rows(storage) == [(1,), (2,)]


async def test_a_rebuild_makes_the_files_it_registers_durable(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The host database is lost while an actor's file is committed but not durable: the
    rebuild registers the actor, so its file must be durable before the registry is, or power
    loss turns it into a registered actor without a file (false damage; found by sim kv seed
    104)."""
    import actorkeep as ak
    from actorkeep.testing import open_host

    app = ak.App()

    @app.actor("c")
    class Counter(ak.Actor):
        @ak.rpc
        async def bump(self) -> int:
            self.sql.exec("CREATE TABLE IF NOT EXISTS n (x INTEGER)")
            self.sql.exec("INSERT INTO n VALUES (1)")  # plain: committed, not durable
            (count,) = self.sql.exec("SELECT count(*) FROM n").fetchone()
            return int(count)

    storage = SimStorage()
    first = storage.view()
    async with open_host(app, storage=first) as host:
        assert await host.host.call_rpc_here("x/y", (), "c/a", "bump", {}, 5.0) == 1
        storage.crash(first)  # before its registration: the file is committed only
    del storage.files["host"]  # the host database is lost: the next host rebuilds it
    assert storage.files["actors/c/a"].durable is None
    second = storage.view()
    async with open_host(app, storage=second) as host:
        assert host.host.registry.has("c/a")
    storage.power_loss(second, random.Random(0), p_rollback=1.0)
    async with open_host(app, storage=storage.view()) as host:
        assert host.host.quarantined == {}
        assert await host.host.call_rpc_here("x/y", (), "c/a", "bump", {}, 5.0) == 2
