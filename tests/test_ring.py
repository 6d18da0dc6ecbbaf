"""The io_uring that runs write-ahead logs' fdatasyncs without a thread (runtime/ring.py,
decision 0026): it syncs, reports the kernel's errors, holds more than its slots, cannot be
cancelled half-way, serves one trio run after another, and is what a host uses for its
durable writes where Linux offers it."""

from __future__ import annotations

import errno
import os
import platform
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

import actorkeep as ak
from actorkeep.runtime.ring import Done, FsyncRing
from actorkeep.testing import open_host

pytestmark = pytest.mark.skipif(FsyncRing.open() is None, reason="no io_uring on this machine")


@pytest.fixture
def ring() -> Iterator[FsyncRing]:
    r = FsyncRing.open()
    assert r is not None
    yield r
    r.close()


@pytest.fixture
def file_fd(tmp_path: Path) -> Iterator[int]:
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o644)
    yield fd
    os.close(fd)


async def test_a_datasync_completes_and_is_counted(ring: FsyncRing, file_fd: int) -> None:
    for i in range(5):
        os.pwrite(file_fd, b"x" * 100, i * 100)
        await ring.datasync(file_fd)
    assert ring.completed == 5


async def test_the_kernel_s_error_is_raised(ring: FsyncRing) -> None:
    read_end, write_end = os.pipe()  # a pipe cannot be synced: EINVAL
    try:
        with pytest.raises(OSError) as failed:
            await ring.datasync(read_end)
        assert failed.value.errno == errno.EINVAL
    finally:
        os.close(read_end)
        os.close(write_end)
    with pytest.raises(OSError) as bad:
        await ring.datasync(read_end)  # closed now
    assert bad.value.errno == errno.EBADF


async def test_more_syncs_than_slots_wait_their_turn(file_fd: int) -> None:
    small = FsyncRing.open(entries=2)
    assert small is not None
    try:
        done: list[int] = []

        async def one(i: int) -> None:
            await small.datasync(file_fd)
            done.append(i)

        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(one, i)
        assert sorted(done) == list(range(20))
        assert small.completed == 20
    finally:
        small.close()


async def test_a_file_synced_by_path_is_opened_only_while_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = [str(tmp_path / f"f{i}") for i in range(8)]
    for path in paths:
        Path(path).write_bytes(b"x")
    at_first = len(os.listdir("/proc/self/fd"))
    small = FsyncRing.open(entries=2)
    assert small is not None
    before = len(os.listdir("/proc/self/fd"))
    most = [0]
    real_open = os.open

    def counting_open(*args: object, **kwargs: object) -> int:
        fd = real_open(*args, **kwargs)  # type: ignore[arg-type]
        most[0] = max(most[0], len(os.listdir("/proc/self/fd")) - before)
        return fd

    monkeypatch.setattr(os, "open", counting_open)
    try:
        async with trio.open_nursery() as nursery:
            for path in paths:
                nursery.start_soon(small.datasync, path)
    finally:
        monkeypatch.undo()
        small.close()
    assert small.completed == 8
    assert most[0] <= 2 + 1  # the slots' descriptors (+1: listdir's own)
    assert len(os.listdir("/proc/self/fd")) == at_first  # all closed; so is the ring


async def test_a_missing_file_is_not_found(ring: FsyncRing, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        await ring.datasync(str(tmp_path / "missing"))
    assert ring.completed == 0


async def test_a_cancelled_caller_still_waits_for_its_sync(ring: FsyncRing, file_fd: int) -> None:
    with trio.CancelScope() as scope:
        scope.cancel()
        await ring.datasync(file_fd)  # submitted and waited for, cancelled or not
        assert ring.completed == 1
        await trio.lowlevel.checkpoint()  # the cancellation comes at the next checkpoint
        raise AssertionError("not reached")
    assert scope.cancelled_caught


def test_one_ring_serves_one_trio_run_after_another(ring: FsyncRing, file_fd: int) -> None:
    for _ in range(3):
        trio.run(ring.datasync, file_fd)
    assert ring.completed == 3


async def test_closed_ring_refuses(file_fd: int) -> None:
    r = FsyncRing.open()
    assert r is not None
    await r.datasync(file_fd)
    r.close()
    with pytest.raises(trio.ClosedResourceError):
        await r.datasync(file_fd)


def test_no_ring_where_linux_offers_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    assert FsyncRing.open() is None


app = ak.App()


@app.actor("ledger")
class Ledger(ak.Actor):
    async def setup(self) -> None:
        self.sql.exec("CREATE TABLE IF NOT EXISTS t (x INTEGER)")

    @ak.rpc
    async def gated(self, x: int) -> int:
        self.sql.exec("INSERT INTO t VALUES (?)", (x,), durable=True)
        return x

    @ak.rpc
    async def awaited(self, x: int) -> int:
        await self.sql.exec_durable("INSERT INTO t VALUES (?)", (x,))
        return x


async def test_a_host_syncs_its_actors_logs_through_the_ring(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Gated and awaited writes are answered only after the ring synced the actor's log."""
    synced: list[str] = []
    replies: list[int] = []
    real = FsyncRing.submit

    def recording(self: FsyncRing, target: int | str, done: Done) -> None:
        assert isinstance(target, str)  # the log, by its path

        def ended(error: OSError | None) -> None:
            assert error is None and replies == [], "a reply left before its sync ended"
            synced.append(os.path.basename(target))
            done(error)

        real(self, target, ended)

    monkeypatch.setattr(FsyncRing, "submit", recording)
    async with open_host(app, data_dir) as host:
        await host.request("POST", "/ledger/a/_rpc/gated", json={"x": 0})
        await trio.sleep(0.3)  # its registration ends (a new file's first sync is in a thread)
        synced.clear()
        for method in ("gated", "awaited"):
            resp = await host.request("POST", f"/ledger/a/_rpc/{method}", json={"x": 1})
            assert resp.status == 200
            replies.append(resp.json())
            assert synced == ["a.sqlite-wal"], synced
            synced.clear()
            replies.clear()
        storage = host.host.storage
        assert isinstance(storage, ak.FileStorage) and storage.syncer is not None
        assert storage.syncer.syncs().count >= 2  # the ring's syncs are timed with the rest


async def test_close_waits_for_what_is_in_flight(file_fd: int) -> None:
    """A host that closes with syncs in flight (its gates did not drain in time) hands each
    its outcome before the ring goes: nobody waits for ever."""
    small = FsyncRing.open(entries=2)
    assert small is not None
    done: list[int] = []

    async def one(i: int) -> None:
        await small.datasync(file_fd)
        done.append(i)

    async with trio.open_nursery() as nursery:
        for i in range(6):
            nursery.start_soon(one, i)
        while small.pending < 6:  # every task has asked
            await trio.lowlevel.checkpoint()
        small.close()
    assert sorted(done) == list(range(6))
    assert small.completed == 6
