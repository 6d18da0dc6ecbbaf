"""``Host.remove`` (``actorkeep rm`` on a running host): an idle actor's alarm, registry entry
and database go, durably; a busy one is refused; its address takes no events meanwhile."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

import actorkeep as ak
from actorkeep.errors import RemoteError
from actorkeep.ops import inspect
from actorkeep.runtime.storage import FileStorage
from actorkeep.testing import TestHost, open_host
from sim.storage import SimStorage

app = ak.App()
setups: list[str] = []
fired: list[str] = []
release = trio.Event()


@app.actor("doc")
class Doc(ak.Actor):
    async def setup(self) -> None:
        setups.append(self.address)
        self.sql.exec("CREATE TABLE IF NOT EXISTS t (x INTEGER)")

    @ak.rpc
    async def fill(self) -> None:
        self.sql.exec("INSERT INTO t (x) VALUES (1)")
        await self.sql.sync()
        await self.set_alarm(self.now() + 60)

    @ak.rpc
    async def rows(self) -> int:
        return int(self.sql.exec("SELECT count(*) FROM t").fetchone()[0])

    @ak.rpc
    async def hold(self) -> None:
        await release.wait()

    async def alarm(self, info: ak.AlarmInfo) -> None:
        fired.append(self.address)


async def rpc(host: TestHost, address: str, method: str) -> object:
    resp = await host.request("POST", f"/{address}/_rpc/{method}", json={})
    assert resp.status == 200, resp.body
    return resp.json()


def files_of(data: Path, address: str) -> list[Path]:
    path = inspect.database_path(data / "actors", address)
    return [f for f in (path, Path(f"{path}-wal"), Path(f"{path}-shm")) if f.exists()]


async def test_remove_deletes_an_idle_actor_with_its_alarm_and_files(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    setups.clear()
    fired.clear()
    async with open_host(app, data_dir=tmp_path) as host:
        await rpc(host, "doc/a", "fill")
        await rpc(host, "doc/b", "fill")
        await trio.sleep(1)  # registered in the background
        assert host.host.registry.has("doc/a") and files_of(tmp_path, "doc/a")
        freed = await host.host.remove("doc/a")
        assert freed > 0
        assert files_of(tmp_path, "doc/a") == []
        assert not host.host.registry.has("doc/a")
        assert host.host.alarm_index.get("doc/a") is None
        assert "doc/a" not in host.host.activations
        await trio.sleep(120)  # doc/a's alarm would have fired by now
        assert fired == ["doc/b"]
        setups.clear()
        assert await rpc(host, "doc/a", "rows") == 0  # a new actor, from setup() on
        assert setups == ["doc/a"]
        await host.restart()  # nothing is taken for damage, nothing comes back
        assert await rpc(host, "doc/a", "rows") == 0
        assert await rpc(host, "doc/b", "rows") == 1
        assert host.host.quarantined == {}


async def test_remove_refuses_a_busy_actor_and_what_does_not_exist(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    global release
    release = trio.Event()
    async with open_host(app, data_dir=tmp_path) as host, trio.open_nursery() as nursery:
        await rpc(host, "doc/a", "fill")
        await trio.sleep(1)
        nursery.start_soon(rpc, host, "doc/a", "hold")
        await trio.sleep(1)
        with pytest.raises(RemoteError) as busy:
            await host.host.remove("doc/a")
        assert busy.value.status == 409 and "events in flight" in busy.value.message
        release.set()
        await trio.sleep(1)
        assert await rpc(host, "doc/a", "rows") == 1  # the refusal changed nothing
        for address, status in [
            ("doc/nobody", 404),
            ("nothing/a", 404),
            ("doc/../x", 400),
            ("doc", 400),
        ]:
            with pytest.raises(RemoteError) as refused:
                await host.host.remove(address)
            assert refused.value.status == status, address
        assert files_of(tmp_path, "doc/nobody") == []
        assert not (tmp_path / "actors" / "nothing").exists()


class HeldRemoval(FileStorage):
    """Each deletion starts (``started``), waits for ``go``, then deletes; with ``fail`` it
    raises instead, having deleted the files first with ``after_delete``."""

    def __init__(self, root: Path, fail: bool = False, after_delete: bool = False) -> None:
        super().__init__(root, in_thread=False)
        self.started = trio.Event()
        self.go = trio.Event()
        self.fail = fail
        self.after_delete = after_delete

    async def remove_actor(self, class_name: str, name: str) -> int:
        self.started.set()
        await self.go.wait()
        if not self.fail:
            return await super().remove_actor(class_name, name)
        if self.after_delete:
            await super().remove_actor(class_name, name)
        raise OSError(5, "Input/output error")


async def damaged_actor(data: Path) -> None:
    """``doc/a`` with an alarm, and then its file emptied: damage its next open finds."""
    async with open_host(app, data_dir=data) as host:
        await rpc(host, "doc/a", "fill")
        await trio.sleep(1)
    for f in files_of(data, "doc/a"):
        f.write_bytes(b"")


async def test_events_for_an_actor_being_deleted_are_refused_with_503(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    storage = HeldRemoval(tmp_path)
    async with open_host(app, storage=storage) as host, trio.open_nursery() as nursery:
        await rpc(host, "doc/a", "fill")
        await trio.sleep(1)
        nursery.start_soon(host.host.remove, "doc/a")
        await storage.started.wait()
        during = await host.request("POST", "/doc/a/_rpc/rows", json={})
        assert during.status == 503 and "being deleted" in during.json()["message"]
        assert during.headers["retry-after"] == "1"
        with pytest.raises(RemoteError) as again:
            await host.host.remove("doc/a")
        assert again.value.status == 409
        storage.go.set()
        await trio.sleep(1)
        assert files_of(tmp_path, "doc/a") == []
        assert await rpc(host, "doc/a", "rows") == 0


async def test_a_quarantined_actor_is_removed_and_starts_afresh(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """``rm`` is the way out for an actor whose storage is damaged beyond repair."""
    await damaged_actor(tmp_path)
    async with open_host(app, data_dir=tmp_path) as host:
        damaged = await host.request("POST", "/doc/a/_rpc/rows", json={})
        assert damaged.status == 503 and "doc/a" in host.host.quarantined
        await host.host.remove("doc/a")
        assert host.host.quarantined == {}
        assert await rpc(host, "doc/a", "rows") == 0
        await host.restart()
        assert host.host.quarantined == {}


async def test_remove_on_the_simulator_s_storage(autojump_clock: trio.testing.MockClock) -> None:
    storage = SimStorage()
    async with open_host(app, storage=storage.view()) as host:
        await rpc(host, "doc/a", "fill")
        await trio.sleep(1)
        assert "actors/doc/a" in storage.files
        assert await host.host.remove("doc/a") > 0
        assert "actors/doc/a" not in storage.files
        assert await rpc(host, "doc/a", "rows") == 0


async def test_a_failed_remove_loses_nothing_and_its_alarm_still_fires(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    fired.clear()
    storage = HeldRemoval(tmp_path, fail=True)
    async with open_host(app, storage=storage) as host:
        await rpc(host, "doc/a", "fill")  # an alarm 60 s on
        await trio.sleep(1)
        async with trio.open_nursery() as nursery:

            async def remove() -> None:
                with pytest.raises(OSError):
                    await host.host.remove("doc/a")

            nursery.start_soon(remove)
            await trio.sleep(90)  # due meanwhile, and held
            assert fired == []
            storage.go.set()
        await trio.sleep(1)
        assert fired == ["doc/a"]  # once the deletion failed, at once
        assert await rpc(host, "doc/a", "rows") == 1  # its data is there


async def test_a_quarantined_actor_stays_quarantined_if_its_file_cannot_be_deleted(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    await damaged_actor(tmp_path)
    storage = HeldRemoval(tmp_path, fail=True)
    storage.go.set()
    async with open_host(app, storage=storage) as host:
        assert (await host.request("POST", "/doc/a/_rpc/rows", json={})).status == 503
        with pytest.raises(OSError):
            await host.host.remove("doc/a")
        assert "doc/a" in host.host.quarantined
        assert (await host.request("POST", "/doc/a/_rpc/rows", json={})).status == 503
        storage.fail = False
        await host.host.remove("doc/a")  # once it can be deleted
        assert host.host.quarantined == {}
        assert await rpc(host, "doc/a", "rows") == 0


async def test_rm_again_finishes_a_removal_cut_short_after_the_file_went(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A crash between the file's deletion and its alarm entry's leaves the entry: ``rm``
    still finds the actor, and drops it; the alarm never fires and no file comes back."""
    fired.clear()
    storage = HeldRemoval(tmp_path, fail=True, after_delete=True)
    storage.go.set()
    async with open_host(app, storage=storage) as host:
        await rpc(host, "doc/a", "fill")
        await trio.sleep(1)
        with pytest.raises(OSError):
            await host.host.remove("doc/a")
        assert files_of(tmp_path, "doc/a") == [] and host.host.alarm_index.get("doc/a")
        storage.fail = False
        assert await host.host.remove("doc/a") == 0
        assert host.host.alarm_index.get("doc/a") is None
        await trio.sleep(120)
        assert fired == [] and files_of(tmp_path, "doc/a") == []
