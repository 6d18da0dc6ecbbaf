"""The recurring-sends scenario: a sweep is clean and replays; each planted bug is caught by
the invariant it breaks."""

from __future__ import annotations

import pytest

from sim.scenarios import run_seed


def test_a_sweep_is_clean_and_sends_through_crashes_and_power_loss() -> None:
    results = [run_seed("recurring", seed) for seed in range(12)]
    assert all(r.ok for r in results), [r.violations for r in results if not r.ok]
    assert sum(r.crashes for r in results) > 0
    powered = [f for r in results for f in r.history.faults if f.kind == "power-loss"]
    assert powered  # some of them lost power
    sent = [f for r in results for f in r.history.observations if f.kind == "recur.sent"]
    assert len(sent) > 100
    drained = [o.result for r in results for o in r.history.ops if o.kind == "recur.drain"]
    assert all(drained) and len(drained) == len(results)
    again = run_seed("recurring", 3)
    assert again.trace_hash == results[3].trace_hash


@pytest.mark.parametrize(
    ("bug", "invariant"),
    [
        ("ignores-marker", "recurring-once"),
        ("marks-apart", "recurring-once"),
        ("marks-first", "recurring-each"),
    ],
)
def test_a_planted_bug_is_caught(bug: str, invariant: str) -> None:
    for seed in range(120):
        result = run_seed("recurring", seed, bug)
        if invariant in {v.invariant for v in result.violations}:
            return
    pytest.fail(f"120 seeds did not show {bug} as {invariant}")
