"""The alarm scenario and its checker: clean sweeps, planted host bugs, hand-made histories."""

from __future__ import annotations

from typing import Any

import pytest

from sim import run_seed
from sim.__main__ import main as sim_main
from sim.alarms.checker import check_alarms
from sim.determinism import sub_rng
from sim.faults import draw_faults, parse_faults
from sim.history import History, Status

T0 = 1_700_000_000.0


def test_a_sweep_of_the_alarm_scenario_is_clean() -> None:
    results = [run_seed("alarms", seed) for seed in range(60)]
    assert [r.seed for r in results if not r.ok] == []
    fires = sum(1 for r in results for o in r.history.observations if o.kind == "fire")
    assert fires > 60 * 5  # alarms really fire, retries and re-arms included
    assert sum(r.crashes for r in results) > 20


@pytest.mark.parametrize(
    ("bug", "invariants", "within"),
    [
        ("early-alarm", {"alarm-never-early"}, 10),
        # The power-loss bug actorkeep had: the index entry of a fired alarm dropped before
        # the row's deletion was durable (alarm-liveness / at-least-once, or a deleted alarm
        # that fires again).
        (
            "plain-clear",
            # (or one that is woken only by a later scan: very late)
            {"alarm-liveness", "alarm-at-least-once", "alarm-replaced-never-fires", "alarm-timely"},
            120,
        ),
        # ``rm`` of a busy actor: the event running on it loses its database (or its writes
        # land in a file the host then takes for damaged).
        ("remove-while-busy", {"no-error-while-up", "no-false-damage"}, 60),
        # ``rm`` deleting the file before the registry forgot the actor: a crash in between
        # leaves a registered actor without its file, taken for damage.
        ("remove-files-first", {"no-error-while-up", "no-false-damage"}, 40),
        # ``rm`` dropping the alarm's entry before the file: a crash in between leaves an
        # alarm nothing wakes (the order it first had).
        ("remove-alarm-first", {"alarm-liveness", "alarm-timely", "alarm-at-least-once"}, 40),
        # ``rm`` answering done but leaving the timer's file: its old firings are read again.
        ("remove-keeps-data", {"alarm-removed-is-gone", "alarm-liveness", "alarm-timely"}, 20),
    ],
)
def test_a_planted_host_bug_is_reported_with_its_seed(
    bug: str, invariants: set[str], within: int, capsys: pytest.CaptureFixture[str]
) -> None:
    for seed in range(within):
        result = run_seed("alarms", seed, bug)
        if result.violations:
            break
    else:
        pytest.fail(f"{within} seeds did not catch {bug}")
    assert {v.invariant for v in result.violations} <= invariants
    assert run_seed("alarms", seed).ok  # the same seed on the real host is clean
    assert sim_main(["--seeds", "1", "--start", str(seed), "--bug", bug]) == 1
    out = capsys.readouterr().out
    assert f"alarms seed {seed}: FAILED" in out
    assert f"replay: python -m sim replay {seed} --scenario alarms --bug {bug}" in out
    assert sim_main(["replay", str(seed), "--bug", bug]) == 1
    out = capsys.readouterr().out
    assert "VIOLATION " in out and ">>" in out


# -- the checker on hand-made histories -----------------------------------------------------
class Script:
    """Builds an alarm history step by step (times in seconds after T0)."""

    def __init__(self) -> None:
        self.h = History()

    def set(self, t: float, delay: float, status: Status = "ok", timer: str = "timer/a") -> float:
        op = self.h.invoke("c0", "alarm.set", {"timer": timer, "delay": delay}, 1, T0 + t)
        at = T0 + t + delay
        self.h.complete(op, status, at if status == "ok" else {"error": "crash"}, T0 + t)
        return at

    def delete(self, t: float, timer: str = "timer/a") -> None:
        op = self.h.invoke("c0", "alarm.delete", {"timer": timer}, 1, T0 + t)
        self.h.complete(op, "ok", None, T0 + t)

    def fire(self, t: float, at: float, retry: int = 0, fails: bool = False) -> None:
        self.h.observe(
            "fire", T0 + t, actor="timer/a", scheduled_at=at, retry_count=retry, fails=fails
        )

    def final(self, t: float, alarm: float | None, fired: list[float]) -> None:
        op = self.h.invoke("final", "alarm.state", {"timer": "timer/a"}, 1, T0 + t)
        self.h.complete(op, "ok", [alarm, fired], T0 + t)

    def invariants(self) -> list[str]:
        return [v.invariant for v in check_alarms(self.h)]


def test_a_clean_history_passes() -> None:
    s = Script()
    at = s.set(0.0, 1.0)
    s.fire(1.0, at, fails=True)
    s.fire(3.0, at, retry=1)
    s.final(100.0, None, [at])
    assert s.invariants() == []


def test_an_early_fire_is_reported() -> None:
    s = Script()
    at = s.set(0.0, 1.0)
    s.fire(0.9, at)
    s.final(100.0, None, [at])
    assert s.invariants() == ["alarm-never-early"]


def test_a_retry_before_its_backoff_is_reported() -> None:
    s = Script()
    at = s.set(0.0, 1.0)
    s.fire(1.0, at, fails=True)
    s.fire(2.5, at, retry=1)  # the first retry waits 2 s
    s.final(100.0, None, [at])
    assert s.invariants() == ["alarm-never-early"]


def test_a_fire_nobody_set_is_reported() -> None:
    s = Script()
    s.set(0.0, 1.0)
    s.fire(5.0, T0 + 4.0)
    s.final(100.0, None, [T0 + 4.0])
    assert "alarm-no-phantom" in s.invariants()


def test_an_unanswered_set_explains_a_fire_but_not_an_earlier_one() -> None:
    s = Script()
    s.set(0.0, 1.0, status="unknown")
    s.fire(1.5, T0 + 1.2)  # its time is unknown but at least invoke + delay: fine
    s.fire(1.5, T0 + 0.5)  # earlier than any time that set could have chosen
    assert s.invariants() == ["alarm-no-phantom"]


def test_a_deleted_alarm_that_fires_is_reported() -> None:
    s = Script()
    at = s.set(0.0, 5.0)
    s.delete(1.0)
    s.fire(5.0, at)
    assert s.invariants() == ["alarm-replaced-never-fires"]


def test_a_replaced_alarm_that_fires_is_reported() -> None:
    s = Script()
    first = s.set(0.0, 5.0)
    second = s.set(1.0, 9.0)
    s.fire(5.0, first)
    s.fire(10.0, second)
    s.final(100.0, None, [first, second])
    assert s.invariants() == ["alarm-replaced-never-fires"]


def test_an_alarm_left_after_the_wait_is_reported() -> None:
    s = Script()
    at = s.set(0.0, 1.0)
    s.final(100.0, at, [])
    assert s.invariants() == ["alarm-liveness", "alarm-at-least-once"]


def test_a_fire_whose_effect_was_lost_is_reported() -> None:
    s = Script()
    at = s.set(0.0, 1.0)
    s.fire(1.0, at)
    s.final(100.0, None, [])  # the handler's write did not survive and it never fired again
    assert s.invariants() == ["alarm-at-least-once"]


def test_an_unanswered_change_after_the_last_set_waives_at_least_once() -> None:
    s = Script()
    s.set(0.0, 1.0)
    s.set(0.5, 1.0, status="unknown")  # may have replaced it, at an unknown time
    s.final(100.0, None, [])
    assert "alarm-at-least-once" not in s.invariants()


# -- --faults -------------------------------------------------------------------------------
def test_faults_can_be_narrowed_without_changing_the_run_shape() -> None:
    assert parse_faults("all") == parse_faults("crash,power,fsync,calls,alarms,buggify,store,drop")
    assert parse_faults("none") == frozenset()
    with pytest.raises(ValueError, match="unknown fault kinds"):
        parse_faults("crash,meteor")
    for seed in range(40):
        only_calls = draw_faults(sub_rng(seed, "x"), parse_faults("calls"))
        f = only_calls.faults
        assert only_calls.timed == 0 and f.crash_after_sync_p == 0 and f.fsync_delay_p == 0
        assert f.alarm_late_p == 0 and not f.buggify
        full = draw_faults(sub_rng(seed, "x"))
        assert (f.call_delay_p, f.call_refuse_p) == (
            full.faults.call_delay_p,
            full.faults.call_refuse_p,
        )
    quiet = run_seed("alarms", 3, faults=frozenset())
    kinds: set[Any] = {f.kind for f in quiet.history.faults}
    assert kinds <= {"stop"} and quiet.crashes == 0 and quiet.ok
