"""A counter tested under the simulator from pytest (docs/testing.md).

    pytest examples/sim_counter

Each seed runs the test in its own simulated world: virtual time, a seeded scheduler, and
the crashes, power losses, slow fsyncs and call faults the seed draws. Three clients increment
at once; the check is that the history of what they were told fits a counter that never loses
an acknowledged increment.
"""

from __future__ import annotations

import pytest
import trio

import actorkeep as ak
import sim

app = ak.App()


@app.actor("counter")
class Counter(ak.Actor):
    migrations = ["CREATE TABLE c (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)"]

    @ak.rpc
    async def incr(self) -> int:
        await self.sql.exec_durable(
            "INSERT INTO c VALUES (0, 1) ON CONFLICT(id) DO UPDATE SET n = n + 1"
        )
        return int(self.sql.exec("SELECT n FROM c").fetchone()[0])

    @ak.rpc
    async def read(self) -> int:
        row = self.sql.exec("SELECT n FROM c").fetchone()
        return 0 if row is None else int(row[0])


@pytest.mark.actorkeep_sim(app, seeds=50)
async def test_no_acknowledged_increment_is_lost(world: sim.World) -> None:
    async def client(name: str) -> None:
        for _ in range(10):
            await world.invoke(name, "incr", {}, lambda: world.rpc("counter/a", "incr"))

    async with trio.open_nursery() as nursery:
        for name in ("c1", "c2", "c3"):
            nursery.start_soon(client, name)
    world.heal()
    await world.invoke("check", "read", {}, lambda: world.rpc("counter/a", "read"))
    sim.expect_no_violations(sim.check_linearizable(world.history, sim.counter()))
