"""Alarms in a cluster (actorkeep/cluster/alarms.py) over a real PostgreSQL: the host that takes
a partition over fires its due alarms without being asked, and an alarm that fired is gone
from the index for the next host. (That the index's changes commit with their frames or not at
all is in tests/test_cluster_store.py, for both stores.)"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psycopg
import trio

import actorkeep as ak
from actorkeep.cluster import ClusterStore, LeaseKeeper, LeaseSettings, create
from actorkeep.cluster.backend import ClusterStorage
from actorkeep.testing import open_host

SETTINGS = LeaseSettings(ttl=0.6, margin=0.2)
app = ak.App()


@app.actor("alarmer")
class Alarmer(ak.Actor):
    async def setup(self) -> None:
        self.sql.exec("CREATE TABLE IF NOT EXISTS fired (at REAL)")

    @ak.rpc
    async def arm(self, delay: float) -> float:
        at = self.now() + delay
        await self.set_alarm(at)
        return at

    @ak.rpc
    async def fired(self) -> list[float]:
        return [at for (at,) in self.sql.exec("SELECT at FROM fired")]

    async def alarm(self, info: ak.AlarmInfo) -> None:
        await self.sql.exec_durable("INSERT INTO fired VALUES (?)", (info.scheduled_at,))


def cluster_storage(conninfo: str, root: Path, host: str) -> ClusterStorage:
    store = ClusterStore(conninfo, host, clock=time.monotonic)
    return ClusterStorage(root, store, LeaseKeeper(store, SETTINGS, time.monotonic))


def index_rows(conninfo: str) -> list[tuple[str, float]]:
    with psycopg.connect(conninfo) as conn:
        rows = conn.execute("SELECT address, at FROM actorkeep_alarms ORDER BY address").fetchall()
    return [(str(a), float(at)) for a, at in rows]


async def call(t: Any, path: str, deadline: float = 10.0, **args: Any) -> Any:
    end = trio.current_time() + deadline
    while True:
        resp = await t.request("POST", path, json=args)
        if resp.status != 503 or trio.current_time() > end:
            return resp
        await trio.sleep(0.05)


async def test_the_next_owner_fires_an_alarm_set_on_another_host(
    pg_conninfo: str, tmp_path: Path
) -> None:
    """Host a sets the alarm and stops (a planned stop hands its partitions over) before it is
    due; host b, which never heard of the actor, fires it on time, from the index it loaded
    with the partition. Once fired, its entry is gone from the store."""
    create(pg_conninfo, 8)
    a = cluster_storage(pg_conninfo, tmp_path / "a", "a")
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        async with open_host(app, storage=a, alarm_index=lambda _: a.alarms) as t:
            resp = await call(t, "/alarmer/x/_rpc/arm", delay=1.5)
            assert resp.status == 200
            at = resp.json()
        assert index_rows(pg_conninfo) == [("alarmer/x", at)]  # committed with its frames
        nursery.cancel_scope.cancel()
    b = cluster_storage(pg_conninfo, tmp_path / "b", "b")
    async with trio.open_nursery() as nursery:
        await nursery.start(b.run)
        async with open_host(app, storage=b, alarm_index=lambda _: b.alarms) as t:
            end = trio.current_time() + 10
            while index_rows(pg_conninfo):  # fired, and its deletion committed
                assert trio.current_time() < end, "the alarm never fired on b"
                await trio.sleep(0.1)
            fired = (await call(t, "/alarmer/x/_rpc/fired")).json()
            assert fired == [at]
        nursery.cancel_scope.cancel()
