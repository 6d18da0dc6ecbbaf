"""The alarm: set/get/delete, at least once, never early, retries, restarts, the index
(docs/reference.md §4)."""

from __future__ import annotations

import itertools
import sqlite3
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import actorkeep as ak
from actorkeep.runtime.storage import FileDatabase, FileStorage
from actorkeep.testing import open_host

app = ak.App()
fired: list[tuple[str, float, float, int]] = []  # (address, now, scheduled_at, retry_count)
failures: dict[str, int] = {}  # address -> how many more times alarm() should raise
naps: dict[str, float] = {}  # address -> seconds alarm() sleeps first


@app.actor("timer")
class Timer(ak.Actor):
    again: float | None = None

    async def alarm(self, info: ak.AlarmInfo) -> None:
        await trio.sleep(naps.get(self.address, 0.0))
        fired.append((self.address, self.now(), info.scheduled_at, info.retry_count))
        if failures.get(self.address, 0) > 0:
            failures[self.address] -= 1
            await self.set_alarm(self.now() + 10_000)  # must not suppress the retry
            raise RuntimeError("alarm handler failed")
        again = self.again
        if again:
            self.again = None
            await self.set_alarm(self.now() + again)

    @ak.rpc
    async def set(self, delay: float, again: float | None = None) -> float:
        at = self.now() + delay
        self.again = again
        await self.set_alarm(at)
        return at

    @ak.rpc
    async def set_at(self, at: float) -> None:
        await self.set_alarm(at)

    @ak.rpc
    async def get(self) -> float | None:
        return self.get_alarm()

    @ak.rpc
    async def delete(self) -> None:
        await self.delete_alarm()

    @ak.rpc
    async def set_then_wait(self, delay: float, wait: float) -> None:
        await trio.sleep(wait)  # the alarm falls due meanwhile; its event waits in the queue
        await self.set_alarm(self.now() + delay)

    @ak.rpc
    async def set_then_fail(self, delay: float) -> None:
        await self.set_alarm(self.now() + delay)
        raise RuntimeError("after setting the alarm")

    @ak.rpc
    async def in_transaction(self) -> str:
        with self.sql.transaction():
            try:
                await self.set_alarm(self.now() + 1)
            except RuntimeError as exc:
                return str(exc)
        return "accepted"

    @ak.rpc
    async def bad_time(self, at: Any) -> str:
        try:
            await self.set_alarm(at)
        except ValueError as exc:
            return str(exc)
        return "accepted"


@app.actor("chain")
class Chain(ak.Actor):
    """Re-arms its alarm from its own handler, ``left`` times, ``later`` seconds ahead."""

    later: float = 0.0

    async def setup(self) -> None:
        self.sql.exec(
            "CREATE TABLE IF NOT EXISTS c (id INTEGER PRIMARY KEY CHECK (id = 0), left INT)"
        )

    @ak.rpc
    async def start(self, n: int, later: float = 0.0) -> None:
        self.sql.exec("INSERT OR REPLACE INTO c VALUES (0, ?)", (n,))
        await self.sql.sync()
        self.later = later
        await self.set_alarm(self.now())

    @ak.rpc
    async def touch(self) -> None:
        """Nothing: brings the actor into being (and its registration behind it)."""

    async def alarm(self, info: ak.AlarmInfo) -> None:
        fired.append((self.address, self.now(), info.scheduled_at, info.retry_count))
        (left,) = self.sql.exec("SELECT left FROM c").fetchone()
        if left > 0:
            self.sql.exec("UPDATE c SET left = left - 1")
            await self.set_alarm(self.now() + self.later)


@app.actor("plain")
class Plain(ak.Actor):
    @ak.rpc
    async def try_alarm(self) -> str:
        try:
            await self.set_alarm(self.now() + 1)
        except TypeError as exc:
            return str(exc)
        return "accepted"


async def rpc(host: ak.testing.TestHost, address: str, method: str, /, **args: Any) -> Any:
    resp = await host.request("POST", f"/{address}/_rpc/{method}", json=args)
    assert resp.status == 200, resp.body
    return resp.json()


@pytest.fixture(autouse=True)
def _reset() -> None:
    fired.clear()
    failures.clear()


async def test_set_get_delete(data_dir: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with open_host(app, data_dir) as host:
        assert await rpc(host, "timer/a", "get") is None
        at = await rpc(host, "timer/a", "set", delay=100)
        assert await rpc(host, "timer/a", "get") == at
        at2 = await rpc(host, "timer/a", "set", delay=50)  # replaces
        assert await rpc(host, "timer/a", "get") == at2
        await rpc(host, "timer/a", "delete")
        assert await rpc(host, "timer/a", "get") is None
        await trio.sleep(200)
        assert fired == []
        assert await rpc(host, "plain/p", "try_alarm") == "Plain has no alarm() method to call"
        assert "inside a transaction" in await rpc(host, "timer/a", "in_transaction")
        for bad in ["soon", None, True]:
            assert "finite number" in await rpc(host, "timer/a", "bad_time", at=bad)


async def test_fires_once_never_early(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        ats = {}
        for i, delay in enumerate([30.5, 10.25, 20.0]):
            ats[f"timer/t{i}"] = await rpc(host, f"timer/t{i}", "set", delay=delay)
        await trio.sleep(100)
        assert [a for a, *_ in fired] == ["timer/t1", "timer/t2", "timer/t0"]
        for address, now, scheduled_at, retries in fired:
            assert scheduled_at == ats[address]
            assert now >= scheduled_at  # never early
            assert now - scheduled_at < 1e-6  # and on time under a virtual clock
            assert retries == 0
        for address in ats:
            assert await rpc(host, address, "get") is None  # a fired alarm is gone


async def test_handler_can_set_the_next_alarm(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        at = await rpc(host, "timer/a", "set", delay=5, again=7)
        await trio.sleep(6)
        assert len(fired) == 1
        assert await rpc(host, "timer/a", "get") == pytest.approx(at + 7)
        await trio.sleep(10)
        assert len(fired) == 2 and fired[1][2] == pytest.approx(at + 7)


async def test_retries_back_off_then_drop(
    data_dir: Path, autojump_clock: trio.testing.MockClock, capsys: pytest.CaptureFixture[str]
) -> None:
    failures["timer/f"] = 100
    async with open_host(app, data_dir) as host:
        at = await rpc(host, "timer/f", "set", delay=1)
        await trio.sleep(1000)
        # The first run and six retries at 2, 4, 8, 16, 32, 64 s: the alarm the failed
        # handler set (10,000 s ahead) never suppressed a retry.
        assert [r for *_, r in fired] == [0, 1, 2, 3, 4, 5, 6]
        times = [now for _, now, _, _ in fired]
        gaps = [round(b - a, 6) for a, b in itertools.pairwise(times)]
        assert gaps == [2, 4, 8, 16, 32, 64]
        assert all(s == at for _, _, s, _ in fired)
        assert await rpc(host, "timer/f", "get") is None
    out = capsys.readouterr()
    assert "alarm dropped after its last retry" in out.out + out.err


async def test_a_retry_survives_restart(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    failures["timer/f"] = 1
    async with open_host(app, data_dir) as host:
        at = await rpc(host, "timer/f", "set", delay=10)
        await trio.sleep(11)
        assert len(fired) == 1
        await host.restart()  # during the 2 s backoff
        await trio.sleep(5)
        assert [(r, s) for _, _, s, r in fired] == [(0, at), (1, at)]
        assert fired[1][1] >= at + 2
        assert await rpc(host, "timer/f", "get") is None


async def test_alarm_set_by_a_failed_ordinary_event_stands(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        resp = await host.request("POST", "/timer/a/_rpc/set_then_fail", json={"delay": 5})
        assert resp.status == 500
        await trio.sleep(6)
        assert [a for a, *_ in fired] == ["timer/a"]


async def test_overdue_alarms_fire_after_downtime(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        at = await rpc(host, "timer/a", "set", delay=60)
    await trio.sleep(3600)  # the host is down; virtual time still passes (docs/reference.md §9)
    assert fired == []
    async with open_host(app, data_dir) as host:
        await trio.sleep(0.001)
        assert len(fired) == 1
        address, now, scheduled_at, _ = fired[0]
        assert (address, scheduled_at) == ("timer/a", at)
        assert now >= at + 3600 - 60


async def test_alarm_wakes_an_evicted_actor(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir, idle_timeout=5) as host:
        await rpc(host, "timer/a", "set", delay=100)
        await trio.sleep(10)
        assert host.host.active_count == 0
        await trio.sleep(100)
        assert [a for a, *_ in fired] == ["timer/a"]


class CountingStorage(FileStorage):
    def __init__(self, root: Path) -> None:
        super().__init__(root, in_thread=False)
        self.opened: list[str] = []

    def open_actor(self, class_name: str, name: str, existing: bool = False) -> FileDatabase:
        self.opened.append(f"{class_name}/{name}")
        return super().open_actor(class_name, name, existing)


async def test_restart_opens_only_actors_with_due_alarms(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        for i in range(200):
            await rpc(host, f"timer/far{i}", "set", delay=1_000_000)
        await rpc(host, "timer/soon", "set", delay=30)
    storage = CountingStorage(data_dir)
    async with open_host(app, storage=storage) as host:
        await trio.sleep(60)
        assert [a for a, *_ in fired] == ["timer/soon"]
        assert storage.opened == ["timer/soon"]


async def test_index_entries_are_healed_and_stale_ones_dropped(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        await rpc(host, "timer/lost", "set", delay=50)  # its index entry will be lost
        await rpc(host, "timer/stale", "set", delay=50)
        await rpc(host, "timer/stale", "delete")
    index = data_dir / "host" / "host.sqlite"
    with sqlite3.connect(index) as conn:
        conn.execute("DELETE FROM alarms WHERE address = 'timer/lost'")
        conn.execute("INSERT INTO alarms VALUES ('timer/stale', 0)")  # as if a crash kept it
    async with open_host(app, data_dir) as host:
        await trio.sleep(100)
        assert fired == []  # the stale entry fired nothing
        await rpc(host, "timer/lost", "get")  # opening the actor restores its index entry
        await trio.sleep(1)
        assert [a for a, *_ in fired] == ["timer/lost"]
    with sqlite3.connect(index) as conn:
        assert conn.execute("SELECT count(*) FROM alarms").fetchone()[0] == 0


async def test_many_due_alarms_fire_through_the_index(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir, idle_timeout=1) as host:
        for i in range(600):  # more than one page of due entries, several sharing a time
            await rpc(host, f"timer/m{i}", "set", delay=10 + (i % 7))
        await trio.sleep(30)
        assert sorted(a for a, *_ in fired) == sorted(f"timer/m{i}" for i in range(600))


def test_due_alarms_are_found_through_the_time_index(data_dir: Path) -> None:
    """Finding due alarms reads only due entries (the (at, address) index), so restart cost
    grows with due alarms, not with all pending ones."""
    from actorkeep.runtime.alarm_index import LocalAlarmIndex
    from actorkeep.runtime.hostdb import HostDb

    db = FileStorage(data_dir, in_thread=False).open_host_db()
    index = LocalAlarmIndex(HostDb(db))
    statements: list[str] = []
    db.conn.set_trace_callback(statements.append)  # the statements due() really runs
    index.due(1.0, None, 2)
    index.due(1.0, (0.5, "timer/a"), 2)
    db.conn.set_trace_callback(None)
    assert len(statements) == 2
    for statement in statements:
        plan = db.conn.execute("EXPLAIN QUERY PLAN " + statement).fetchall()
        assert "USING COVERING INDEX alarms_due" in plan[0][3], (statement, plan)
    db.close()


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the files ``FileDatabase.sync`` made durable, in order."""
    from actorkeep.runtime.storage import FileDatabase

    synced: list[str] = []
    real_sync = FileDatabase.sync

    async def counting_sync(self: FileDatabase) -> None:
        synced.append(self.path.name)
        await real_sync(self)

    monkeypatch.setattr(FileDatabase, "sync", counting_sync)
    return synced


async def test_rearming_at_once_from_the_alarm_needs_no_fsync(
    data_dir: Path, autojump_clock: trio.testing.MockClock, syncs: list[str]
) -> None:
    async with open_host(app, data_dir) as host:
        for address in ("chain/c", "chain/d"):  # registered first: their own syncs
            await rpc(host, address, "touch")
        await trio.sleep(1)
        await rpc(host, "chain/c", "start", n=5)
        before = len(syncs)
        await trio.sleep(1)
        assert len(fired) == 6  # the first fire and five re-arms at once
        # None of them paid for an fsync; the clear after the last one does, in the background
        # (the row's deletion is made durable before the index entry goes).
        assert len(syncs) == before + 1
        # Re-arming for later is a durable set_alarm as usual: the index, then the actor file.
        fired.clear()
        before = len(syncs)
        await rpc(host, "chain/d", "start", n=1, later=5)
        await trio.sleep(10)
        assert len(fired) == 2
        # start: its sql.sync(), then the index and the actor file for its alarm; the re-arm:
        # the index and the actor file again; then the clear.
        assert sorted(syncs[before:]) == ["d.sqlite"] * 4 + ["host.sqlite"] * 2


@app.actor("rearm")
class Rearm(ak.Actor):
    """``*-000`` sets its alarm again, on its first fire, for the time it was due (past)."""

    async def alarm(self, info: ak.AlarmInfo) -> None:
        fired.append((self.address, self.now(), info.scheduled_at, info.retry_count))
        if self.name.endswith("-000") and sum(1 for a, *_ in fired if a == self.address) == 1:
            await self.set_alarm(info.scheduled_at)

    @ak.rpc
    async def arm(self, at: float) -> None:
        await self.set_alarm(at)


async def test_alarms_rearmed_while_the_scheduler_pages_are_not_lost(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """More due alarms than one page: one re-armed (due) while the scheduler is between pages
    must still fire. Whether it runs inside that window depends on the scheduler's order (about
    half the time), so eight rounds: without the fix all eight escape with odds 1/256."""
    async with open_host(app, data_dir) as host:
        for r in range(8):
            at = host.host.clock.now() + 10
            for i in range(257):
                await rpc(host, f"rearm/g{r}-{i:03d}", "arm", at=at)
            await trio.sleep(20)
            again = [a for a, *_ in fired if a == f"rearm/g{r}-000"]
            assert len(again) == 2, f"round {r}: the re-armed alarm fired {len(again)} time(s)"


async def test_storage_failure_in_the_alarm_path_does_not_take_the_host_down(
    data_dir: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from actorkeep.runtime.storage import FileDatabase

    broken = False
    real_sync = FileDatabase.sync

    async def flaky_sync(self: FileDatabase) -> None:
        if broken:
            raise OSError(5, "Input/output error (simulated)")
        await real_sync(self)

    monkeypatch.setattr(FileDatabase, "sync", flaky_sync)
    failures["timer/io"] = 1  # the handler fails once; its durable retry then hits the error
    async with open_host(app, data_dir) as host:
        await rpc(host, "timer/io", "set", delay=5)
        broken = True
        await trio.sleep(6)
        assert [a for a, *_ in fired] == ["timer/io"]
        assert await rpc(host, "timer/other", "get") is None  # the host still serves
        broken = False
        await trio.sleep(10)
        assert [a for a, *_ in fired] == ["timer/io", "timer/io"]  # the alarm stayed due


async def test_an_alarm_event_refused_for_a_while_is_tried_again_soon(
    data_dir: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refusal that says to come back (``Overloaded``: in a cluster, the store unreachable
    for a moment) is tried again after 0.1 s, doubling up to its ``retry_after``, not after
    the 2 s doubling to 5 minutes of a failing disk."""
    refusals = 0
    real_ready = FileStorage.ready

    async def refusing_ready(self: FileStorage, class_name: str, name: str) -> None:
        nonlocal refusals
        if name == "busy" and refusals:
            refusals -= 1
            raise ak.Overloaded("the store is unreachable (simulated)", retry_after=1.0)
        await real_ready(self, class_name, name)

    monkeypatch.setattr(FileStorage, "ready", refusing_ready)
    async with open_host(app, data_dir, idle_timeout=1.0) as host:
        at = await rpc(host, "timer/busy", "set", delay=5)
        refusals = 3  # the actor is out of memory by then: its alarm event opens it
        await trio.sleep(10)
    assert refusals == 0
    [(_, when, *_)] = [f for f in fired if f[0] == "timer/busy"]
    assert when - at == pytest.approx(0.1 + 0.2 + 0.4, abs=0.05)


async def test_alarm_events_waiting_out_a_storage_failure_run_once_it_answers_again(
    data_dir: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``retry()`` of the alarm index's ``watch`` (in a cluster: the store answered again)
    ends the back-off of alarm events whose storage failed: they run at once."""
    broken = False
    real_ready = FileStorage.ready

    async def failing_ready(self: FileStorage, class_name: str, name: str) -> None:
        if name == "disk" and broken:
            raise OSError(5, "Input/output error (simulated)")
        await real_ready(self, class_name, name)

    monkeypatch.setattr(FileStorage, "ready", failing_ready)
    async with open_host(app, data_dir, idle_timeout=1.0) as host:
        await rpc(host, "timer/disk", "set", delay=5)
        broken = True
        await trio.sleep(5 + 2 + 4 + 1)  # failed at 5 s, then 2 s and 4 s later: 8 s to go
        assert [f for f in fired if f[0] == "timer/disk"] == []
        broken = False
        answered = host.host.clock.now()
        host.host.alarms.retry_failed()
        await trio.sleep(1)
    [(_, when, *_)] = [f for f in fired if f[0] == "timer/disk"]
    assert when == pytest.approx(answered, abs=0.01)


@app.actor("opentx")
class OpenTx(ak.Actor):
    async def setup(self) -> None:
        self.sql.exec("CREATE TABLE IF NOT EXISTS t (n INTEGER)")

    async def alarm(self, info: ak.AlarmInfo) -> None:
        fired.append((self.address, self.now(), info.scheduled_at, info.retry_count))
        if info.retry_count == 0:
            self.sql.exec("BEGIN")
            self.sql.exec("INSERT INTO t VALUES (1)")  # and returns with the transaction open

    @ak.rpc
    async def arm(self, delay: float) -> None:
        await self.set_alarm(self.now() + delay)

    @ak.rpc
    async def rows(self) -> int:
        return int(self.sql.exec("SELECT count(*) FROM t").fetchone()[0])


async def test_an_alarm_handler_leaving_a_transaction_open_fails_and_is_retried(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        await rpc(host, "opentx/a", "arm", delay=5)
        await trio.sleep(6)
        assert await rpc(host, "opentx/a", "rows") == 0  # rolled back; the next event is fine
        await trio.sleep(5)
        assert [r for *_, r in fired] == [0, 1]  # retried after 2 s


async def test_replacing_an_alarm_keeps_the_index_no_later_than_it_until_durable(
    data_dir: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the process dies after the index write and before the new row is durable, the
    acknowledged alarm must not be delayed to the new time."""
    from actorkeep.runtime.storage import FileDatabase

    async with open_host(app, data_dir) as host:
        t1 = await rpc(host, "timer/a", "set", delay=10)
        real_sync = FileDatabase.sync

        async def dies_on_actor_sync(self: FileDatabase) -> None:
            if "host.sqlite" not in self.path.name:
                raise OSError("the process died here")
            await real_sync(self)

        monkeypatch.setattr(FileDatabase, "sync", dies_on_actor_sync)
        resp = await host.request("POST", "/timer/a/_rpc/set", json={"delay": 3600})
        assert resp.status == 500
        assert host.host.alarm_index.get("timer/a") == t1


async def test_an_alarm_moved_later_by_an_earlier_event_does_not_fire_early(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        await rpc(host, "timer/a", "set", delay=10)
        async with trio.open_nursery() as nursery:
            # A long event holds the actor while the alarm falls due; the next one in the queue
            # (queued before the alarm event) moves the alarm an hour later.
            nursery.start_soon(partial(rpc, host, "timer/a", "set_then_wait", delay=3600, wait=20))
        await trio.sleep(100)
        assert fired == []
        await trio.sleep(3600)
        assert len(fired) == 1 and fired[0][1] >= fired[0][2]


async def test_delete_alarm_drops_the_index_entry_only_once_the_row_is_gone_durably(
    data_dir: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from actorkeep.runtime.storage import FileDatabase

    async with open_host(app, data_dir) as host:
        at = await rpc(host, "timer/a", "set", delay=100)
        real_sync = FileDatabase.sync

        async def dies_on_actor_sync(self: FileDatabase) -> None:
            if "host.sqlite" not in self.path.name:
                raise OSError("power lost here")
            await real_sync(self)

        monkeypatch.setattr(FileDatabase, "sync", dies_on_actor_sync)
        resp = await host.request("POST", "/timer/a/_rpc/delete")
        assert resp.status == 500
        assert host.host.alarm_index.get("timer/a") == at  # still indexed: nothing is stranded


# -- set_alarm(durable=False) -----------------------------------------------------------------
@app.actor("lazy")
class Lazy(ak.Actor):
    async def setup(self) -> None:
        self.sql.exec("CREATE TABLE IF NOT EXISTS w (n INTEGER)")

    async def alarm(self, info: ak.AlarmInfo) -> None:
        fired.append((self.address, self.now(), info.scheduled_at, info.retry_count))

    @ak.rpc
    async def arm(self, at: float, durable: bool) -> None:
        await self.set_alarm(at, durable=durable)

    @ak.rpc
    async def write(self) -> None:
        await self.sql.exec_durable("INSERT INTO w VALUES (1)")

    @ak.rpc
    async def alarm_at(self) -> float | None:
        return self.get_alarm()


async def test_a_plain_alarm_pays_one_index_fsync_then_none(
    data_dir: Path, autojump_clock: trio.testing.MockClock, syncs: list[str]
) -> None:
    async with open_host(app, data_dir) as host:
        t0 = host.host.clock.now()
        assert await rpc(host, "lazy/a", "alarm_at") is None
        await trio.sleep(1)  # a new actor is registered once its file is durable (2 syncs)
        assert syncs == ["a.sqlite", "host.sqlite"]
        syncs.clear()
        await rpc(host, "lazy/a", "arm", at=t0 + 100, durable=False)
        assert syncs == ["host.sqlite"]  # the index entry, made durable once
        for k in range(5):
            await rpc(host, "lazy/a", "arm", at=t0 + 50 - k, durable=False)
        assert syncs == ["host.sqlite"]
        assert await rpc(host, "lazy/a", "alarm_at") == t0 + 46
        await rpc(host, "lazy/a", "arm", at=t0 + 40, durable=True)
        assert len(syncs) == 3  # a durable set: the index, then the actor's file


def _lazy_world(seed: int = 1) -> Any:
    from sim import Faults, World

    return World(app, seed, faults=Faults(rollback_p=1.0))


def test_a_plain_alarm_survives_a_process_crash() -> None:
    async def main(w: Any) -> list[tuple[str, float, float, int]]:
        at = w.now() + 5
        await w.rpc("lazy/a", "arm", at=at, durable=False)
        w.crash(power_loss=False)
        await w.restart()
        await trio.sleep(10)
        return [f for f in fired if f[0] == "lazy/a"]

    got = _lazy_world().run(main)
    assert [(a, s) for a, _, s, _ in got] == [("lazy/a", got[0][2])] and got[0][1] >= got[0][2]


def test_power_loss_brings_back_the_durable_alarm_a_plain_one_replaced() -> None:
    async def main(w: Any) -> list[float]:
        durable_at = w.now() + 5
        await w.rpc("lazy/a", "arm", at=durable_at, durable=True)
        await w.rpc("lazy/a", "arm", at=w.now() + 1, durable=False)
        w.crash(power_loss=True)
        await w.restart()
        assert await w.rpc("lazy/a", "alarm_at") == durable_at
        await trio.sleep(10)
        return [s for a, _, s, _ in fired if a == "lazy/a"]

    fired.clear()
    got = _lazy_world().run(main)
    assert len(got) == 1 and got[0] > 1_700_000_004  # the durable one, at its time


def test_the_next_durable_write_makes_a_plain_alarm_durable() -> None:
    async def main(w: Any) -> list[float]:
        at = w.now() + 3
        await w.rpc("lazy/a", "arm", at=at, durable=False)  # no alarm before it
        await w.rpc("lazy/a", "write")
        w.crash(power_loss=True)
        await w.restart()
        await trio.sleep(10)
        return [s for a, _, s, _ in fired if a == "lazy/a"]

    fired.clear()
    got = _lazy_world().run(main)
    assert len(got) == 1 and got[0] == pytest.approx(1_700_000_003, abs=0.01)


def test_a_lost_plain_alarm_with_nothing_before_it_leaves_no_ghost() -> None:
    async def main(w: Any) -> tuple[float | None, int]:
        await w.rpc("lazy/a", "alarm_at")
        await trio.sleep(1)  # registered: its registration's sync is behind it
        await w.rpc("lazy/a", "arm", at=w.now() + 3, durable=False)
        w.crash(power_loss=True)
        await w.restart()
        await trio.sleep(10)
        n = sum(1 for a, *_ in fired if a == "lazy/a")
        assert w.current is not None
        entry = w.current.host.alarm_index.get("lazy/a")
        return entry, n

    fired.clear()
    assert _lazy_world().run(main) == (None, 0)  # the woken index entry found nothing, left


# -- review findings: an index entry never moves later than a row power loss can bring back ----
@app.actor("guarded")
class Guarded(ak.Actor):
    async def alarm(self, info: ak.AlarmInfo) -> None:
        fired.append((self.address, self.now(), info.scheduled_at, info.retry_count))
        await trio.sleep(0.5)  # the next event (a far set) waits behind this one

    @ak.rpc
    async def arm(self, at: float) -> None:
        await self.set_alarm(at)


def test_a_far_set_after_a_fired_alarm_keeps_guarding_the_cleared_row() -> None:
    """The alarm fired and its row's deletion is not durable yet; a durable set_alarm(far) is
    cut by power loss right after it fsynced the index. The old row comes back: it must be
    woken at once, not an hour later."""

    async def main(w: Any) -> list[float]:
        t0 = w.now()
        await w.rpc("guarded/a", "arm", at=t0 + 1)
        await trio.sleep(1.2)  # the alarm event is running
        armed = [True]

        def on_sync(db: Any) -> None:
            if armed[0] and db.key == "host":
                armed[0] = False
                w.crash(power_loss=True)

        w.storage.on_sync = on_sync
        with pytest.raises(ak.ActorkeepError):
            await w.rpc("guarded/a", "arm", at=t0 + 3600)
        await w.restart()
        fired.clear()
        await trio.sleep(600)
        return [now - t0 for a, now, _, _ in fired if a == "guarded/a"]

    fired.clear()
    got = _lazy_world().run(main)
    assert len(got) == 1 and got[0] < 5  # at the restart, not at +3600


async def test_a_failing_index_removal_does_not_stop_the_host(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    class FailingDeletes:
        def __init__(self, conn: sqlite3.Connection) -> None:
            self.conn, self.fail = conn, False

        def __getattr__(self, name: str) -> Any:
            return getattr(self.conn, name)

        def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
            if self.fail and sql.startswith("DELETE FROM alarms"):
                raise sqlite3.OperationalError("database or disk is full")
            return self.conn.execute(sql, *args)

    class Storage(FileStorage):
        proxy: FailingDeletes

        def open_host_db(self) -> FileDatabase:
            db = super().open_host_db()
            self.proxy = FailingDeletes(db.conn)
            db.conn = self.proxy  # type: ignore[assignment]
            return db

    storage = Storage(data_dir, in_thread=False)
    async with open_host(app, storage=storage) as host:
        await rpc(host, "timer/a", "set", delay=1)
        storage.proxy.fail = True
        await trio.sleep(5)  # fires; dropping its index entry fails
        assert [a for a, *_ in fired] == ["timer/a"]
        await rpc(host, "timer/b", "set", delay=1)  # the host still serves
        storage.proxy.fail = False
        await trio.sleep(5)
        assert [a for a, *_ in fired] == ["timer/a", "timer/b"]


async def test_many_alarms_due_at_once_cost_a_scan_each_not_a_scan_per_alarm(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """300 alarms due at the same moment, their handlers taking up to 2 s: the scheduler
    reads the due index about once per alarm, not once per alarm per alarm. (Each cleared
    alarm used to wake a scan of every due entry, the running ones included.)"""
    fired.clear()
    naps.update({f"timer/t{i}": i * 7 % 20 / 10 for i in range(300)})
    async with open_host(app, data_dir) as host:
        at = host.host.clock.now() + 10
        for i in range(300):
            resp = await host.request("POST", f"/timer/t{i}/_rpc/set_at", json={"at": at})
            assert resp.status == 200
        index = host.host.alarms.index
        real_due = index.due
        read = [0]

        def due(now: float, after: tuple[float, str] | None, limit: int) -> list[Any]:
            rows = real_due(now, after, limit)
            read[0] += len(rows)
            return rows

        index.due = due  # type: ignore[method-assign]
        try:
            await trio.sleep(20)
        finally:
            naps.clear()
        assert len(fired) == 300
        assert read[0] <= 2 * 300, read
