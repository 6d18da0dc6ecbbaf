"""The migrations scenario: a sweep through two deploys is clean and replays; each planted bug
in the runtime's migrate path is caught by the invariant it breaks; ``World.deploy`` runs the
new app from then on, after crashes too."""

from __future__ import annotations

from typing import Any

import pytest

import actorkeep as ak
import sim
from sim.migrations.app import REFUND_REFUSED
from sim.scenarios import run_seed


def test_a_sweep_is_clean_and_migrates_through_deploys_crashes_and_power_loss() -> None:
    results = [run_seed("migrations", seed) for seed in range(12)]
    assert all(r.ok for r in results), [r.violations for r in results if not r.ok]
    assert sum(r.crashes for r in results) > 0
    assert any(f.kind == "power-loss" for r in results for f in r.history.faults)
    assert all(sum(f.kind == "deploy" for f in r.history.faults) == 2 for r in results)
    ran = [f for r in results for f in r.history.observations if f.kind == "mig.ran"]
    assert len(ran) > 20
    refused = [o for r in results for o in r.history.ops if o.status == "fail"]
    assert refused and all(REFUND_REFUSED in o.result for o in refused)
    finals = [o.result for r in results for o in r.history.ops if o.kind == "mig.final"]
    assert finals and all(f["version"] == 4 for f in finals)
    again = run_seed("migrations", 3)
    assert again.trace_hash == results[3].trace_hash


def test_a_cluster_deploys_every_host() -> None:
    for seed in (1, 2):
        result = run_seed("migrations", seed, cluster=True)
        assert result.ok, [str(v) for v in result.violations]
        assert sum(f.kind == "deploy" for f in result.history.faults) == 2


@pytest.mark.parametrize(
    ("bug", "invariant"),
    [
        ("migration-version-apart", "migrations-once"),
        ("migration-unsynced", "migrations-durable"),
        ("migration-no-transaction", "migrated-writes"),
    ],
)
def test_a_planted_bug_is_caught(bug: str, invariant: str) -> None:
    for seed in range(60):
        result = run_seed("migrations", seed, bug)
        if invariant in {v.invariant for v in result.violations}:
            return
    pytest.fail(f"60 seeds did not show {bug} as {invariant}")


def app_storing(label: str) -> ak.App:
    app = ak.App()

    class Tagged(ak.Actor):
        migrations = [f"CREATE TABLE t (x); INSERT INTO t VALUES ('{label}')"]

        @ak.rpc
        async def tag(self) -> str:
            return str(self.sql.exec("SELECT x FROM t").fetchone()[0])

    app.mount(Tagged, "tagged")
    return app


def test_a_deploy_runs_the_new_app_from_then_on() -> None:
    first, second = app_storing("one"), app_storing("two")
    world = sim.World(first, seed=1)

    async def main(w: sim.World) -> list[Any]:
        seen = [await w.rpc("tagged/a", "tag")]
        await w.deploy(second)
        seen.append(await w.rpc("tagged/b", "tag"))
        w.crash(power_loss=True)
        await w.restart()
        seen.append(await w.rpc("tagged/c", "tag"))
        return seen

    assert world.run(main) == ["one", "two", "two"]
    assert [f.kind for f in world.history.faults] == [
        "deploy",
        "stop",
        "restart",
        "power-loss",
        "restart",
        "stop",
    ]
