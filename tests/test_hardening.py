"""Edge cases found in review: each test fails without the fix it names."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgpack
import pytest
import trio
import trio.testing

import actorkeep as ak
import shards
from actorkeep.front import AsgiApp, Front
from actorkeep.runtime.storage import DataDirInUse, FileStorage
from actorkeep.testing import open_host

app = ak.App()
ran: list[str] = []


@app.actor("doc")
class Doc(ak.Actor):
    async def setup(self) -> None:
        self.sql.exec("CREATE TABLE IF NOT EXISTS d (id INTEGER PRIMARY KEY CHECK (id = 0), v)")

    @ak.route("PUT", "/")
    async def put(self, req: ak.Request) -> ak.Response:
        ran.append(f"put {req.body!r}")
        self.sql.exec("INSERT OR REPLACE INTO d VALUES (0, ?)", (req.body,))
        return ak.Response(204)

    @ak.rpc
    async def tag(self, **kw: Any) -> list[str]:
        return sorted(kw)

    @ak.rpc
    async def mark(self, tag: str) -> None:
        ran.append(tag)

    @ak.rpc
    async def hold(self, seconds: float) -> None:
        await trio.sleep(seconds)


app.mount(shards.KVShard, "kv")


async def test_a_client_gone_mid_upload_runs_nothing(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    ran.clear()
    async with open_host(app, data_dir) as host:
        asgi = AsgiApp(Front(host.host))
        incoming: list[dict[str, Any]] = [
            {"type": "http.request", "body": b"partial", "more_body": True},
            {"type": "http.disconnect"},
        ]
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return incoming.pop(0)

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {
            "type": "http", "method": "PUT", "path": "/doc/a/", "raw_path": b"/doc/a/",
            "query_string": b"", "headers": [(b"content-length", b"100")],
        }  # fmt: skip
        await asgi(scope, receive, send)  # type: ignore[arg-type]
        assert sent == [] and ran == []


async def test_websocket_upgrades_are_closed(data_dir: Path) -> None:
    async with open_host(app, data_dir) as host:
        asgi = AsgiApp(Front(host.host))
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "websocket.connect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await asgi({"type": "websocket", "path": "/doc/a/"}, receive, send)  # type: ignore[arg-type]
        assert sent == [{"type": "websocket.close", "code": 1008}]


async def test_rpc_arguments_cannot_bind_self(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        assert (await host.request("POST", "/doc/a/_rpc/tag", json={"x": 1})).json() == ["x"]
        resp = await host.request("POST", "/doc/a/_rpc/tag", json={"self": 1})
        assert resp.status == 400 and "self" in resp.json()["message"]


async def test_huge_ttl_is_refused_before_any_call(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    from actorkeep.wire.kv import MAX_TTL, check_ttl

    assert check_ttl(MAX_TTL) == MAX_TTL
    for bad in (MAX_TTL + 1, 1e16, 1e300):
        with pytest.raises(ValueError, match="at most"):
            check_ttl(bad)
    async with open_host(app, data_dir) as host:
        frame = msgpack.packb({"key": b"a", "value": b"x", "ttl": 1e16})
        resp = await host.call_as("doc/a", "kv/shard-0", "POST", "/actorkeep-kv/v2/put", frame,
                                  {"content-type": "application/msgpack"})  # fmt: skip
        assert resp.status == 400


async def test_abandoned_events_never_run_and_do_not_pin_their_actor(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    ran.clear()
    async with open_host(app, data_dir, idle_timeout=30) as host:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(host.call_as, "t/t", "doc/busy", "POST", "/_rpc/hold",
                               b'{"seconds": 5}')  # fmt: skip
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(ak.CallTimeout):  # queued behind "hold", given up before it starts
                await host.call_as("t/t", "doc/busy", "POST", "/_rpc/mark", b'{"tag": "late"}',
                                   timeout=1)  # fmt: skip
        await trio.sleep(10)
        assert ran == []  # the abandoned event was skipped
    async with open_host(app, data_dir, idle_timeout=30) as host:
        for i in range(20):  # actors whose only event was queued, then abandoned unstarted
            with trio.move_on_after(0):  # (hold suspends, so it is queued, never run inline)
                await host.call_as("t/t", f"doc/gone{i}", "POST", "/_rpc/hold", b'{"seconds": 1}')
        assert host.host.active_count == 20
        await trio.sleep(31)
        assert host.host.active_count == 0


async def test_two_hosts_cannot_share_a_data_directory(data_dir: Path) -> None:
    first = FileStorage(data_dir)
    db = first.open_host_db()
    second = FileStorage(data_dir)
    with pytest.raises(DataDirInUse, match="in use by another host"):
        second.open_host_db()
    db.close()
    first.close()
    second.open_host_db().close()  # free again
    second.close()


async def test_durable_writes_reach_fdatasync(
    data_dir: Path,
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
    sync_threads: None,
) -> None:
    """exec_durable and sync() really flush the WAL, and a new actor's directories once."""
    import actorkeep.runtime.storage as storage

    flushed: list[tuple[str, bool]] = []  # (file or directory name, data only)
    real_datasync, real_fsync = storage._datasync, os.fsync

    def name(fd: int) -> str:
        return Path(os.readlink(f"/proc/self/fd/{fd}")).name

    def datasync(fd: int) -> None:
        flushed.append((name(fd), True))
        real_datasync(fd)

    def fsync(fd: int) -> None:
        flushed.append((name(fd), False))
        real_fsync(fd)

    monkeypatch.setattr(storage, "_datasync", datasync)
    monkeypatch.setattr(os, "fsync", fsync)
    kv = ak.kv.Client("kv", shards=1)

    class Writer(ak.Actor):
        @ak.rpc
        async def write(self) -> None:
            await kv.put("a", b"1")  # durable: the shard's exec_durable

    local_app = ak.App()
    local_app.mount(shards.KVShard, "kv")
    local_app.mount(Writer, "w")
    async with open_host(local_app, data_dir) as host:
        await host.request("POST", "/w/w/_rpc/write")
        await trio.sleep(1)  # and the new actors' registration (registry.py)
        shard_wal = [d for name, d in flushed if name == "shard-0.sqlite-wal"]
        # The version reservation and the row, and the registration: fdatasyncs of the log
        # (they may share one: group commit), and of the new file itself once (its header).
        assert shard_wal and all(shard_wal), flushed
        assert flushed.count(("shard-0.sqlite", True)) == 1, flushed
        # The shard's new directories' entries, each fsynced once.
        directories = [name for name, d in flushed if not d]
        assert "kv" in directories and "actors" in directories, flushed
        flushed.clear()
        await host.request("POST", "/w/w/_rpc/write")
        assert flushed == [("shard-0.sqlite-wal", True)]  # the row only; directories done once
