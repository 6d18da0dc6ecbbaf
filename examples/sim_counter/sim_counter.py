"""Run your own actors under the simulator: a counter that must not lose an acknowledged
increment, whatever crashes and power losses the seed brings.

    PYTHONPATH=. python examples/sim_counter/sim_counter.py --seeds 50
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

import actorkeep as ak
from sim import Faults, World

app = ak.App()


@app.actor("counter")
class Counter(ak.Actor):
    async def setup(self) -> None:
        self.sql.exec("CREATE TABLE IF NOT EXISTS c (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)")

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


async def scenario(world: World) -> list[str]:
    """Increment 30 times under faults, then check: every acknowledged increment is kept and
    the final count is at most the number of attempts."""
    rng = world.rng("scenario")
    acked = 0
    for i in range(30):
        if rng.random() < 0.1:
            world.crash(power_loss=rng.random() < 0.5, restart_after=rng.uniform(0, 1))
        op = await world.invoke("c0", "incr", {"i": i}, lambda: world.rpc("counter/a", "incr"))
        if op.status == "ok":
            acked = max(acked, op.result)
    final = await world.rpc("counter/a", "read")
    problems = []
    if final < acked:
        problems.append(f"lost an acknowledged increment: read {final} after {acked} was acked")
    if final > 30:
        problems.append(f"counted {final} increments out of 30 attempts")
    return problems


def check_seed(seed: int) -> list[str]:
    faults = Faults(fsync_delay_p=0.5, crash_after_sync_p=0.05, rollback_p=0.5)
    return World(app, seed, faults=faults).run(scenario)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=50)
    args = parser.parse_args()
    failed = 0
    for seed in range(args.seeds):
        for problem in check_seed(seed):
            failed += 1
            print(f"seed {seed}: {problem}")
    print(f"{args.seeds} seeds, {failed} problems")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
