"""``Host.remove`` on a cluster host, over the simulator's store: a delete whose reply is lost
leaves the actor restorable from whatever the store holds."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import trio
import trio.testing

import actorkeep as ak
from actorkeep.cluster import LeaseKeeper, LeaseSettings
from actorkeep.cluster.backend import ClusterStorage
from actorkeep.cluster.replica import held
from actorkeep.errors import Overloaded
from actorkeep.testing import TestHost, open_host
from sim.cluster.store import MemoryCluster, ReplyLost, StoreLink

T = TypeVar("T")

app = ak.App()


@app.actor("c")
class Counter(ak.Actor):
    async def setup(self) -> None:
        self.sql.exec("CREATE TABLE IF NOT EXISTS t (v INTEGER)")

    @ak.rpc
    async def add(self, v: int) -> int:
        self.sql.exec("INSERT INTO t VALUES (?)", (v,), durable=True)
        return int(self.sql.exec("SELECT count(*) FROM t").fetchone()[0])


class LosesTheDeletesReply(StoreLink):
    """The next ``forget_actor`` runs, and its reply is lost."""

    lose_delete = False

    async def run(self, fn: Callable[[], T]) -> T:
        if self.lose_delete and "forget_actor" in fn.__code__.co_names:
            self.lose_delete = False
            fn()
            raise ReplyLost("the reply was lost")
        return await super().run(fn)


async def add(host: TestHost, v: int) -> int:
    while True:  # 503 until this host holds the partition
        resp = await host.request("POST", "/c/x/_rpc/add", json={"v": v})
        if resp.status != 503:
            assert resp.status == 200, resp.body
            n: int = resp.json()
            return n
        await trio.sleep(0.05)


async def test_a_delete_whose_reply_is_lost_leaves_a_restorable_actor(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    cluster = MemoryCluster(2, clock=trio.current_time)
    store = cluster.connect("h", trio.current_time)
    link = LosesTheDeletesReply(cluster, random.Random(1))
    keeper = LeaseKeeper(store, LeaseSettings(ttl=0.6, margin=0.2), trio.current_time)
    storage = ClusterStorage(tmp_path, store, keeper, link.run, files_in_thread=False)
    async with trio.open_nursery() as nursery:
        await nursery.start(storage.run)
        async with open_host(app, storage=storage, alarm_index=lambda _: storage.alarms) as host:
            assert [await add(host, i) for i in range(3)] == [1, 2, 3]
            await trio.sleep(0.5)
            link.lose_delete = True
            try:
                await host.host.remove("c/x", known=True)
            except Overloaded:  # the store is unreachable, as far as the host can tell
                pass
            else:
                raise AssertionError("the lost reply went unnoticed")
            assert held(store, "c/x").known is False  # it was deleted, in fact
            assert await add(host, 9) == 1  # a new actor, not the old local file
            await trio.sleep(0.5)
            assert held(store, "c/x").known  # and the store can restore it
        nursery.cancel_scope.cancel()
