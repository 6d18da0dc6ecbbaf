"""The schedules scenario: a sweep is clean and replays; each planted bug is caught, those of
the app (``--bug``) and two planted in the runtime here."""

from __future__ import annotations

from typing import Any

import pytest

from actorkeep import schedules
from sim.scenarios import run_seed


def test_a_sweep_is_clean_and_runs_schedules_through_crashes() -> None:
    results = [run_seed("schedules", seed) for seed in range(12)]
    assert all(r.ok for r in results), [r.violations for r in results if not r.ok]
    assert sum(r.crashes for r in results) > 0
    runs = [f for r in results for f in r.history.observations if f.kind == "sched.run"]
    assert any(f.detail["retry_count"] for f in runs)  # failed runs were retried
    kinds = {o.kind for r in results for o in r.history.ops if o.status == "ok"}
    assert {"sched.once", "sched.cron", "sched.cancel"} <= kinds and len(runs) > 100
    again = run_seed("schedules", 3)
    assert again.trace_hash == results[3].trace_hash


@pytest.mark.parametrize(
    ("bug", "invariant"),
    [
        ("cancel-ignored", "cancel-sticks"),
        ("runs-early", "never-early"),
        ("forgets-on-restart", "at-least-once"),
    ],
)
def test_a_planted_bug_of_the_app_is_caught(bug: str, invariant: str) -> None:
    for seed in range(30):
        result = run_seed("schedules", seed, bug)
        if invariant in {v.invariant for v in result.violations}:
            return
    pytest.fail(f"30 seeds did not show {bug} as {invariant}")


def test_a_runtime_that_runs_schedules_early_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    real = schedules.Timetable.first_due

    def early(self: schedules.Timetable, now: float, alarm_ran: bool) -> Any:
        return real(self, now + 0.5, alarm_ran)

    monkeypatch.setattr(schedules.Timetable, "first_due", early)
    caught = [run_seed("schedules", seed) for seed in range(10)]
    assert any("never-early" in {v.invariant for v in r.violations} for r in caught)


def test_a_runtime_that_skips_an_occurrence_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    real = schedules.Timetable.advance

    def skipping(self: schedules.Timetable, row: Any, after: float | None) -> None:
        if after is not None and row.cron is not None:
            after = schedules.next_cron(row.cron, row.tz, after)
        real(self, row, after)

    monkeypatch.setattr(schedules.Timetable, "advance", skipping)
    caught = [run_seed("schedules", seed) for seed in range(10)]
    assert any("at-least-once" in {v.invariant for v in r.violations} for r in caught)
