"""Output gates (docs/storage.md, decision 0015): a gated write commits at once, the actor goes
on, and its replies and calls wait until a sync that covers it has ended; one sync covers
every write before it; a failed sync refuses what it covered and reopens the actor."""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import structlog
import trio
import trio.testing

import actorkeep as ak
import actorkeep.runtime.storage as storage
from actorkeep.errors import OutcomeUnknown, Overloaded, error_for_status
from actorkeep.runtime.storage import FileDatabase
from actorkeep.testing import open_host

app = ak.App()
ran: list[int] = []  # what the ledger's handlers ran, in order
setups: list[str] = []
seen: list[int] = []  # what the peer was told
fired: list[str] = []


@app.actor("ledger")
class Ledger(ak.Actor):
    async def setup(self) -> None:
        self.sql.exec("CREATE TABLE IF NOT EXISTS t (x INTEGER)")
        setups.append(self.address)

    @ak.rpc
    async def add(self, x: int) -> int:
        """A gated write (its handler never suspends: it may run inline)."""
        self.sql.exec("INSERT INTO t VALUES (?)", (x,), durable=True)
        ran.append(x)
        return x

    @ak.rpc
    async def add_in_transaction(self, x: int) -> int:
        with self.sql.transaction(durable=True):
            self.sql.exec("INSERT INTO t VALUES (?)", (x,))
        ran.append(x)
        return x

    @ak.rpc
    async def plain(self, x: int) -> int:
        self.sql.exec("INSERT INTO t VALUES (?)", (x,))
        ran.append(x)
        return x

    @ak.rpc
    async def add_then_tell(self, x: int) -> int:
        self.sql.exec("INSERT INTO t VALUES (?)", (x,), durable=True)
        ran.append(x)
        told: int = await self.actors.ref("peer/p").tell(x=x)
        return told

    @ak.rpc
    async def rows(self) -> list[int]:
        return [r[0] for r in self.sql.exec("SELECT x FROM t ORDER BY rowid")]

    @ak.rpc
    async def arm(self, delay: float) -> None:
        await self.set_alarm(self.now() + delay, wait=False)
        ran.append(-1)

    @ak.rpc
    async def arm_and_wait(self, delay: float) -> None:
        await self.set_alarm(self.now() + delay)

    async def alarm(self, info: ak.AlarmInfo) -> None:
        fired.append(self.address)


@app.actor("peer")
class Peer(ak.Actor):
    @ak.rpc
    async def tell(self, x: int) -> int:
        seen.append(x)
        return x


@pytest.fixture(autouse=True)
def _reset() -> None:
    for log in (ran, setups, seen, fired):
        log.clear()


class Disk:
    """The fdatasync of every database, counted by file; one can be held or made to fail."""

    def __init__(self) -> None:
        self.synced: list[str] = []  # file names, in order
        self.hold_next: str | None = None  # a file name: its next fdatasync waits for release
        self.fail_next: str | None = None  # a file name: its next fdatasync raises EIO
        self.holding = threading.Event()
        self.released = threading.Event()

    def datasync(self, real: Any, fd: int) -> None:
        name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        if self.fail_next is not None and name.startswith(self.fail_next):
            self.fail_next = None
            raise OSError(errno.EIO, "injected: the disk failed the fdatasync")
        if self.hold_next is not None and name.startswith(self.hold_next):
            self.hold_next = None
            self.holding.set()
            self.released.wait(10)
        real(fd)
        self.synced.append(name)

    def count(self, prefix: str) -> int:
        return sum(1 for name in self.synced if name.startswith(prefix))


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch, sync_threads: None) -> Iterator[Disk]:
    d = Disk()
    real = storage._datasync
    monkeypatch.setattr(storage, "_datasync", lambda fd: d.datasync(real, fd))
    yield d
    d.released.set()


async def call(host: ak.testing.TestHost, address: str, method: str, /, **args: Any) -> Any:
    resp = await host.request("POST", f"/{address}/_rpc/{method}", json=args)
    assert resp.status == 200, resp.body
    return resp.json()


async def until(check: Any, what: object = None, seconds: float = 5.0) -> None:
    with trio.move_on_after(seconds):
        while not check():  # noqa: ASYNC110 (state other threads change: nothing to wait on)
            await trio.sleep(0.005)
        return
    raise AssertionError(f"not within {seconds} s: {what}")


async def warm(host: ak.testing.TestHost, *addresses: str) -> None:
    """Bring actors into being and let their registration syncs end."""
    for address in addresses:
        if address.startswith("ledger"):
            await call(host, address, "rows")
        else:
            await call(host, address, "tell", x=0)
    await trio.sleep(0.3)


async def test_a_reply_waits_for_its_sync_while_the_actor_goes_on(
    data_dir: Path, disk: Disk
) -> None:
    async with open_host(app, data_dir) as host:
        await warm(host, "ledger/a")
        seen.clear()
        disk.hold_next = "a.sqlite"
        replies: list[int] = []

        async def add(x: int) -> None:
            replies.append(await call(host, "ledger/a", "add", x=x))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(add, 1)
            await trio.to_thread.run_sync(disk.holding.wait, 5)
            # The fsync of add(1) is running. The actor takes its next events meanwhile...
            for x in (2, 3, 4):
                nursery.start_soon(add, x)
            await until(lambda: sorted(ran) == [1, 2, 3, 4], ran)
            # ...and another of its events that wrote nothing still waits: it may have read
            # what is not durable yet.
            nursery.start_soon(add, 5)
            await until(lambda: len(ran) == 5, ran)
            await trio.sleep(0.1)
            assert replies == []  # nothing has left before the fsync ended
            before = disk.count("a.sqlite")
            disk.released.set()
        assert sorted(replies) == [1, 2, 3, 4, 5]
        # The held fsync, then one more: writes 2..5 committed while the first ran, and one
        # fsync covered them all.
        assert disk.count("a.sqlite") - before == 2


async def test_plain_writes_and_reads_of_a_durable_actor_are_not_held(
    data_dir: Path, disk: Disk
) -> None:
    async with open_host(app, data_dir) as host:
        await warm(host, "ledger/a")
        before = disk.count("a.sqlite")
        assert await call(host, "ledger/a", "plain", x=7) == 7
        assert await call(host, "ledger/a", "rows") == [7]
        assert disk.count("a.sqlite") == before  # no fsync was asked for, none waited for


async def test_a_call_after_a_gated_write_leaves_once_it_is_durable(
    data_dir: Path, disk: Disk
) -> None:
    async with open_host(app, data_dir) as host:
        await warm(host, "ledger/a", "peer/p")
        seen.clear()
        disk.hold_next = "a.sqlite"
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(call, host, "ledger/a", "add_then_tell", x=9))
            await trio.to_thread.run_sync(disk.holding.wait, 5)
            await until(lambda: ran == [9])
            await trio.sleep(0.1)
            assert seen == []  # the peer has not heard of the write
            disk.released.set()
        assert seen == [9]


async def test_a_gated_transaction_is_held_like_a_gated_statement(
    data_dir: Path, disk: Disk
) -> None:
    async with open_host(app, data_dir) as host:
        await warm(host, "ledger/a")
        disk.hold_next = "a.sqlite"
        replies: list[int] = []

        async def add() -> None:
            replies.append(await call(host, "ledger/a", "add_in_transaction", x=3))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(add)
            await trio.to_thread.run_sync(disk.holding.wait, 5)
            await trio.sleep(0.1)
            assert ran == [3] and replies == []
            disk.released.set()
        assert replies == [3]


async def test_a_failed_sync_refuses_what_it_covered_and_reopens_the_actor(
    data_dir: Path, disk: Disk
) -> None:
    async with open_host(app, data_dir) as host:
        await warm(host, "ledger/a")
        assert setups == ["ledger/a"]
        disk.fail_next = "a.sqlite"
        resp = await host.request("POST", "/ledger/a/_rpc/add", json={"x": 1})
        assert resp.status == 500  # never a success for a write that may not be durable
        assert b"SyncFailed" in resp.body
        # The actor was discarded: its next event opens the database again (setup runs).
        assert await call(host, "ledger/a", "add", x=2) == 2
        assert setups == ["ledger/a", "ledger/a"]
        assert 2 in await call(host, "ledger/a", "rows")


async def test_a_failed_sync_gives_outside_clients_no_internals(data_dir: Path, disk: Disk) -> None:
    async with open_host(app, data_dir, debug=False) as host:
        await warm(host, "ledger/a")
        disk.fail_next = "a.sqlite"
        resp = await host.request("POST", "/ledger/a/_rpc/add", json={"x": 1})
        assert resp.status == 500
        assert b"internal error" in resp.body and b"a.sqlite" not in resp.body


async def test_a_gated_alarm_does_not_wait_but_its_reply_does(data_dir: Path, disk: Disk) -> None:
    async with open_host(app, data_dir) as host:
        await warm(host, "ledger/a")
        await call(host, "ledger/a", "arm", delay=3600)  # the first alarm: the index entry
        disk.hold_next = "a.sqlite"
        replies: list[None] = []

        async def arm() -> None:
            replies.append(await call(host, "ledger/a", "arm", delay=0.2))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(arm)
            await trio.to_thread.run_sync(disk.holding.wait, 5)
            await until(lambda: ran == [-1, -1])  # set_alarm returned without its fsync
            await trio.sleep(0.1)
            assert replies == []
            disk.released.set()
        assert replies == [None]
        await until(lambda: fired == ["ledger/a"])


async def test_a_clean_close_answers_what_the_gates_hold(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from sim.storage import SimStorage

    disk = SimStorage(fsync_delay=lambda: 1.0)  # every fsync takes a second
    replies: list[int] = []
    async with trio.open_nursery() as outside, open_host(app, storage=disk.view()) as host:
        await call(host, "ledger/a", "rows")
        await trio.sleep(5)

        async def add() -> None:
            replies.append(await call(host, "ledger/a", "add", x=1))

        outside.start_soon(add)
        await until(lambda: ran == [1])
        assert replies == []  # held: its fsync takes a second; the host closes now
    assert replies == [1]


async def test_many_callers_share_fsyncs(data_dir: Path, disk: Disk) -> None:
    async with open_host(app, data_dir) as host:
        await warm(host, "ledger/a")
        before = disk.count("a.sqlite")
        async with trio.open_nursery() as nursery:
            for x in range(64):
                nursery.start_soon(partial(call, host, "ledger/a", "add", x=x))
        assert sorted(await call(host, "ledger/a", "rows")) == list(range(64))
        syncs = disk.count("a.sqlite") - before
        assert 1 <= syncs < 32, syncs  # one per write would be 64


@pytest.mark.parametrize("syncs", ["ring", "threads"])
def test_no_fsync_runs_on_the_event_loop(tmp_path: Path, syncs: str) -> None:
    """Every fsync and fdatasync of a host doing local and durable KV puts, queue sends with
    push delivery, gated alarms, checkpoints and evictions runs off the event loop, in a sync
    thread or in the kernel's workers behind the host's io_uring (whose submissions are all
    the event loop does): ``strace -f`` counts them by thread."""
    import json
    import shutil
    import subprocess
    import sys

    from actorkeep.runtime.ring import FsyncRing

    strace = shutil.which("strace")
    if strace is None:
        if os.environ.get("CI"):
            pytest.fail("strace is missing: make test installs it")
        pytest.skip("needs strace (apt install strace)")
    ring_here = FsyncRing.open() is not None
    trace = tmp_path / "strace.txt"
    probe = Path(__file__).parent / "apps" / "fsync_probe.py"
    done = subprocess.run(
        [
            strace,
            "-f",
            "-e",
            "trace=fsync,fdatasync,io_uring_enter",
            "-o",
            str(trace),
            sys.executable,
            str(probe),
            str(tmp_path / "data"),
            syncs,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parent.parent,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    by_thread: dict[int, int] = {}
    submitted: dict[int, int] = {}
    for line in trace.read_text().splitlines():
        tid, _, call = line.partition(" ")
        if call.lstrip().startswith(("fsync(", "fdatasync(")):
            by_thread[int(tid)] = by_thread.get(int(tid), 0) + 1
        elif call.lstrip().startswith("io_uring_enter("):
            submitted[int(tid)] = submitted.get(int(tid), 0) + 1
    assert result["handled"] == 200
    loop = result["loop_thread"]
    assert by_thread.get(loop, 0) == 0, by_thread
    if syncs == "ring" and ring_here:
        # The logs' fdatasyncs went through the ring, submitted by the event loop alone; the
        # sync threads kept the rest (new files and directories, checkpoints, closes).
        assert result["ring_syncs"] >= 20  # 400 durable writes, group-committed
        assert set(submitted) == {loop} and submitted[loop] >= result["ring_syncs"], submitted
        assert sum(by_thread.values()) > 0
    else:
        assert result["ring_syncs"] == 0 and submitted == {}
        assert sum(by_thread.values()) > 100  # the sync threads did them all
    # The busiest log was checkpointed by a sync thread. Its file keeps the largest size the
    # log reached: the bound, plus what the actor wrote while the copy ran (more on a loaded
    # machine).
    assert result["checkpoints"] >= 1
    assert result["largest_wal"] < 4 * storage.WAL_CHECKPOINT_BYTES


async def test_a_reopened_database_answers_only_once_what_it_holds_is_durable(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A gated write committed, its sync cut by a crash: the restarted host must not reveal it
    before a sync has made it durable."""
    from sim.storage import SimStorage, _connect

    delay = [0.0]
    disk = SimStorage(fsync_delay=lambda: delay[0])
    first = disk.view()

    async def add() -> None:
        with contextlib.suppress(Exception):  # its host crashes with the reply held
            await call(host, "ledger/a", "add", x=1)

    async with trio.open_nursery() as outside, open_host(app, storage=first) as host:
        await call(host, "ledger/a", "rows")
        await trio.sleep(5)  # registered
        delay[0] = 1e6  # the next sync never ends
        outside.start_soon(add)
        await until(lambda: ran == [1])
        disk.crash(first)
    delay[0] = 5.0
    async with open_host(app, storage=disk.view()) as host:
        assert await call(host, "ledger/a", "rows") == [1]
        image = disk.files["actors/ledger/a"].durable
        assert image is not None
        assert _connect(image).execute("SELECT x FROM t").fetchall() == [(1,)]


async def test_an_inline_event_on_a_failed_gate_is_refused_at_once(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The state a failed sync leaves while the actor's reset waits: an inline event gets its
    refusal, rather than waiting for a reply the gate already gave away."""
    async with open_host(app, data_dir) as host:
        await call(host, "ledger/a", "add", x=1)
        act = host.host.activations.get("ledger/a")
        assert act is not None and act.parked and act.gate is not None
        act.gate.failed, act.gate.closed = OSError("injected"), True
        act.reset_pending = True
        with trio.fail_after(5):
            resp = await host.request("POST", "/ledger/a/_rpc/add", json={"x": 2})
        assert resp.status == 500 and b"SyncFailed" in resp.body


async def test_a_closed_database_gated_alarm_does_not_move_the_next_one_later(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An activation sets a far alarm with wait=False and leaves memory before its sync ends;
    the next activation sets a nearer one. The first one's late sync must not move the index
    entry past the alarm now stored."""
    from sim.storage import SimStorage

    delay = [0.0]
    disk = SimStorage(fsync_delay=lambda: delay[0])
    async with open_host(app, storage=disk.view()) as host:
        await call(host, "ledger/a", "arm_and_wait", delay=100_000)  # far: never due here
        delay[0] = 50.0  # every fsync now takes 50 s
        async with trio.open_nursery() as nursery:
            # Later than the alarm it replaces: its index entry moves up only once durable.
            nursery.start_soon(partial(call, host, "ledger/a", "arm", delay=101_000))
            await until(lambda: ran == [-1], seconds=120)  # set; its row's sync runs
            act = host.host.activations.get("ledger/a")
            assert act is not None and act.gate is not None
            gate = act.gate
            assert act.parked and gate.busy  # idle, its row's sync still running: evicted

            host.host.activations.evict(act)
            delay[0] = 0.0
            second = host.host.clock.now() + 500
            await call(host, "ledger/a", "arm_and_wait", delay=500)
        await trio.sleep(60)  # the first activation's sync has ended
        entry = host.host.alarm_index.get("ledger/a")
        assert entry is not None and entry <= second + 1, (entry, second)
        await trio.sleep(second + 10 - host.host.clock.now())
        assert fired == ["ledger/a"]


@pytest.mark.parametrize(
    ("error", "name"),
    [
        (Overloaded("kv/a is not served by this host now"), "Overloaded"),
        (OutcomeUnknown("the commit did not end: the writes may be durable"), "OutcomeUnknown"),
    ],
)
async def test_a_sync_that_says_why_it_failed_answers_503_with_that(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, error: Exception, name: str
) -> None:
    """A cluster's storage fails a sync with ``Overloaded`` (the host does not serve the actor
    now: nothing it covered is durable) or ``OutcomeUnknown`` (the store's answer did not
    come): the held reply is refused with that, 503 and Retry-After, not 500; a calling actor
    hears the same kind (``OutcomeUnknown`` is a ``CallTimeout``: it may have run). The log
    line names the cause, which the caller's error does not."""
    real = FileDatabase.sync
    armed: list[bool] = []

    async def sync(db: FileDatabase) -> None:
        if armed and db.where.endswith("a.sqlite"):
            armed.clear()
            raise error from LookupError("what went wrong")
        await real(db)

    monkeypatch.setattr(FileDatabase, "sync", sync)
    # As a cluster's database: every sync awaited by the gate's task (no start_sync).
    monkeypatch.setattr(FileDatabase, "start_sync", lambda db, done: False)
    async with open_host(app, data_dir, debug=False) as host:
        await warm(host, "ledger/a")
        armed.append(True)
        with structlog.testing.capture_logs() as logs:
            resp = await host.request("POST", "/ledger/a/_rpc/add", json={"x": 1})
        assert resp.status == 503, resp.body
        # The log says what went wrong, not only what the callers heard.
        failed = [e for e in logs if e["event"].startswith("sync failed")]
        assert [e["cause"] for e in failed] == ["LookupError('what went wrong')"]
        assert resp.json()["error"] == name and resp.headers["retry-after"] == "1"
        assert b"sqlite" not in resp.body
        assert await call(host, "ledger/a", "add", x=2) == 2  # reopened, and serving
    seen = error_for_status(503, name, "m")
    assert type(seen) is type(error)
    assert isinstance(seen, ak.CallTimeout) == (name == "OutcomeUnknown")
