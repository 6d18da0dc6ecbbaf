"""The transactional outbox under the simulator: crashes and power loss right after syncs, so
between a commit and its delivery; each committed order is queued exactly once, a rolled-back
one never (docs/queues.md#transactional-outbox)."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from actorkeep.outbox import Outbox
from sim import World
from sim.faults import Faults
from tests.outbox_app import app

SEEDS = range(12)


def run(seed: int) -> tuple[World, dict[str, str], list[Any], list[str]]:
    """Orders placed by three clients while the host crashes; the orders each call returned
    for (``ok``, ``refused``, or ``unknown`` when the call died with the host)."""
    faults = Faults(crash_after_sync_p=0.08, power_loss_p=0.5, max_crashes=4, downtime_max=2.0)
    world = World(app, seed, faults=faults)
    outcome: dict[str, str] = {}
    result: dict[str, Any] = {}

    async def client(w: World, c: int) -> None:
        rng = w.rng(f"client-{c}")
        for i in range(8):
            order = f"{c}-{i}"
            fail = rng.random() < 0.25
            try:
                await w.rpc("shop/s", "order", timeout=5.0, id=order, fail=fail)
            except Exception as exc:
                outcome[order] = "refused" if fail and "refused" in str(exc) else "unknown"
            else:
                outcome[order] = "ok"
            await trio.sleep(rng.uniform(0, 0.3))

    async def main(w: World) -> None:
        async with trio.open_nursery() as nursery:
            for c in range(3):
                nursery.start_soon(client, w, c)
        w.heal()
        await trio.sleep(600)  # time for every fallback delivery
        result["drained"] = await w.rpc("shop/s", "drain", timeout=None)
        result["orders"] = await w.rpc("shop/s", "orders", timeout=None)

    world.run(main)
    return world, outcome, result["drained"], result["orders"]


@pytest.mark.parametrize("seed", SEEDS)
def test_each_committed_order_is_queued_exactly_once(seed: int) -> None:
    _, outcome, drained, orders = run(seed)
    bodies = [body for _, body in drained]
    assert sorted(bodies) == sorted(orders)  # every committed order once, nothing else
    assert len(set(bodies)) == len(bodies)
    for order, how in outcome.items():
        if how == "ok":
            assert order in orders  # acknowledged: committed durably
        if how == "refused":
            assert order not in orders  # rolled back: nothing queued


def violations(seed: int) -> list[str]:
    _, _, drained, orders = run(seed)
    bodies = [body for _, body in drained]
    found = []
    if len(set(bodies)) != len(bodies):
        found.append("queued twice")
    if set(bodies) != set(orders):
        found.append("committed but not queued" if set(orders) - set(bodies) else "not committed")
    return found


def test_without_dedup_keys_an_order_is_queued_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: the outbox sends without its rows' keys; a crash between a send and the row's
    deletion then queues the order again."""
    monkeypatch.setattr(Outbox, "key_of", lambda self, row: None)
    assert any("queued twice" in violations(seed) for seed in SEEDS)


def test_without_the_fallback_a_crash_strands_an_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: no fallback schedule; a crash between a commit and its delivery leaves the
    row in the outbox for good."""

    async def no_fallback(self: Outbox, delay: float, failures: int = 0) -> None:
        pass

    monkeypatch.setattr(Outbox, "_fallback", no_fallback)
    assert any("committed but not queued" in violations(seed) for seed in SEEDS)


def test_the_simulation_crashed_between_commits_and_deliveries() -> None:
    """The seeds above are not vacuous: some crash, some lose power, some orders fail."""
    crashes = sum(run(seed)[0].crashes for seed in SEEDS[:4])
    assert crashes >= 2
