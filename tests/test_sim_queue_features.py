"""The queue-features scenario: its sweep is clean and each planted bug is caught."""

from __future__ import annotations

import pytest
import trio

from sim.history import History, Status
from sim.queues.features import BURST, RATE, check_features, make_app
from sim.scenarios import run_seed
from sim.world import Stuck, World


def test_a_sweep_is_clean_and_ends() -> None:
    results = [run_seed("queue-features", seed) for seed in range(40, 50)]
    assert all(not r.violations for r in results), [r.violations for r in results]
    # Seed 44 once never ended: the faults' restart was cancelled with the clients.
    assert sum(r.crashes for r in results) > 0


@pytest.mark.parametrize(
    ("bug", "invariant"),
    [
        ("key-ignored", "key-unique"),
        ("group-ignored", "group-exclusive"),
        ("retry-unblocks-group", "group-fifo"),
        ("expiry-unblocks-group", "group-fifo"),
        ("rate-ignored", "rate"),
    ],
)
def test_a_planted_bug_is_reported_with_its_seed(bug: str, invariant: str) -> None:
    for seed in range(20):
        result = run_seed("queue-features", seed, bug)
        if invariant in {v.invariant for v in result.violations}:
            break
    else:
        pytest.fail(f"20 seeds did not show {bug} as {invariant}")
    again = run_seed("queue-features", seed, bug)
    assert [str(v) for v in again.violations] == [str(v) for v in result.violations]


def test_a_workload_that_never_ends_is_reported_not_hung(monkeypatch: pytest.MonkeyPatch) -> None:
    """A restart that never comes leaves the drain waiting for a host with nothing to wait
    for: the world's virtual time limit turns that deadlock into an ``ends`` violation."""

    async def never(self: World, downtime: float = 0.0) -> None:
        await trio.sleep_forever()

    monkeypatch.setattr(World, "restart", never)
    monkeypatch.setattr(World, "time_limit", 600.0)
    result = run_seed("queue-features", 2)  # one timed crash
    assert [v.invariant for v in result.violations][:1] == ["ends"]
    assert "600 virtual seconds" in result.violations[0].message


def test_a_world_past_its_time_limit_is_stuck() -> None:
    world = World(make_app(), 0)
    world.time_limit = 30.0

    async def main(w: World) -> None:
        await trio.sleep(31.0)

    with pytest.raises(Stuck):
        world.run(main)
    world = World(make_app(), 0)
    world.time_limit = 30.0

    async def quick(w: World) -> None:
        await trio.sleep(29.0)

    world.run(quick)


@pytest.mark.parametrize("configured", ["ok", "unknown"])
def test_the_rate_check_holds_the_rate_only_from_an_acknowledged_configure(
    configured: Status,
) -> None:
    """A configure whose outcome is unknown may never have landed (a store unreachable at the
    setup's restore): leases past the rate after it are no violation; after one acknowledged,
    they are. A run with no configure acknowledged is flagged: its rate went unchecked."""
    history = History()
    setup = history.invoke("setup", "feature.configure", {"config": {"rate": RATE}}, 0, 0.0)
    history.complete(setup, configured, None if configured == "ok" else "503", 0.01)
    too_many = BURST + 10
    lease = history.invoke("w0", "feature.lease", {"max": too_many, "visibility": 1.0}, 0, 0.1)
    handed = [[i, 1, b"", None, None] for i in range(too_many)]
    history.complete(lease, "ok", handed, 0.11)
    found = [v.invariant for v in check_features(history)]
    assert found == ["rate"]
    (violation,) = check_features(history)
    assert ("no configure" in violation.message) == (configured == "unknown")
