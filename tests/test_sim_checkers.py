"""The checkers users run on their own apps' histories (sim/models.py, sim/invariants.py)
and the shrinking of fault schedules (sim/shrinking.py), each shown to pass a good history and
to fail a bad one."""

from __future__ import annotations

from typing import Any

import pytest

from sim import (
    ANY,
    CheckFailed,
    FaultEvent,
    FaultSchedule,
    History,
    Model,
    TooBig,
    acknowledged_writes_survive,
    cas_map,
    check_linearizable,
    counter,
    exactly_once,
    expect_no_violations,
    register,
    shrink,
)
from sim.history import Op, Status

Step = tuple[str, str, dict[str, Any], Status, Any]


class Recorder:
    """A hand-made history: ``start`` and ``end`` operations in any interleaving."""

    def __init__(self) -> None:
        self.history = History()
        self.t = 1.0
        self.incarnation = 1

    def start(self, process: str, kind: str, **args: Any) -> Op:
        self.t += 0.001
        return self.history.invoke(process, kind, args, self.incarnation, self.t)

    def end(self, op: Op, status: Status, result: Any = None) -> Op:
        self.t += 0.001
        self.history.complete(op, status, result, self.t)
        return op

    def op(self, process: str, kind: str, status: Status, result: Any = None, **args: Any) -> Op:
        return self.end(self.start(process, kind, **args), status, result)

    def crash(self) -> None:
        self.history.fault("crash", self.t, host=self.incarnation)
        self.incarnation += 1


# -- linearizability against a model ---------------------------------------------------------


def test_concurrent_increments_fit_a_counter_in_either_order() -> None:
    r = Recorder()
    a, b = r.start("a", "incr"), r.start("b", "incr")
    r.end(b, "ok", 1)
    r.end(a, "ok", 2)
    r.op("c", "read", "ok", 2)
    assert check_linearizable(r.history, counter()) == []


def test_a_lost_increment_does_not_fit_a_counter() -> None:
    r = Recorder()
    r.op("a", "incr", "ok", 1)
    r.op("a", "incr", "ok", 2)
    r.crash()
    r.op("b", "read", "ok", 1)  # the second increment was acknowledged, and is gone
    [violation] = check_linearizable(r.history, counter())
    assert violation.invariant == "linearizable"
    assert "#2 read {} -> 1" in violation.message


def test_an_unknown_increment_may_or_may_not_have_happened_but_not_after_its_host_died() -> None:
    r = Recorder()
    r.op("a", "incr", "unknown", {"error": "crash"})
    r.crash()
    r.op("b", "read", "ok", 0)
    r.op("b", "read", "ok", 0)
    assert check_linearizable(r.history, counter()) == []
    late = Recorder()
    late.op("a", "incr", "unknown", {"error": "crash"})
    late.crash()
    late.op("b", "read", "ok", 0)
    late.op("b", "read", "ok", 1)  # it took effect after the host that ran it was gone
    assert len(check_linearizable(late.history, counter())) == 1


def test_a_register_and_a_failed_write() -> None:
    r = Recorder()
    r.op("a", "write", "ok", None, value="x")
    r.op("b", "write", "fail", {"error": "Overloaded"}, value="y")
    r.op("a", "read", "ok", "x")
    assert check_linearizable(r.history, register()) == []
    r.op("a", "read", "ok", "y")  # a refused write must never show
    assert len(check_linearizable(r.history, register())) == 1


def test_a_cas_map_checks_each_key_alone() -> None:
    r = Recorder()
    r.op("a", "put", "ok", None, key="k1", value=1)
    r.op("a", "cas", "ok", True, key="k1", expect=1, value=2)
    r.op("b", "cas", "ok", False, key="k2", expect=1, value=2)
    r.op("b", "get", "ok", 2, key="k1")
    r.op("b", "get", "ok", None, key="k2")
    assert check_linearizable(r.history, cas_map()) == []
    r.op("c", "cas", "ok", True, key="k1", expect=1, value=3)  # k1 holds 2: it cannot succeed
    [violation] = check_linearizable(r.history, cas_map())
    assert "cas-map 'k1'" in violation.message


def test_a_model_of_your_own() -> None:
    def step(state: tuple[str, ...], kind: str, args: dict[str, Any]) -> tuple[Any, Any]:
        if kind == "push":
            return (*state, args["item"]), ANY
        return state[1:], state[0] if state else None  # pop

    fifo = Model("fifo", (), step)
    r = Recorder()
    r.op("a", "push", "ok", None, item="x")
    r.op("a", "push", "ok", None, item="y")
    r.op("b", "pop", "ok", "x")
    assert check_linearizable(r.history, fifo) == []
    r.op("b", "pop", "ok", "x")
    assert len(check_linearizable(r.history, fifo)) == 1


def test_a_search_too_big_says_so() -> None:
    r = Recorder()
    ops = [r.start(f"p{i}", "incr") for i in range(12)]
    for op in ops:
        r.end(op, "unknown", None)
    r.op("z", "read", "ok", 99)
    with pytest.raises(TooBig, match="passed 100 configurations"):
        check_linearizable(r.history, counter(), limit=100)


# -- ready invariants ---------------------------------------------------------------------------


def test_acknowledged_writes_survive() -> None:
    r = Recorder()
    r.op("a", "order", "ok", None, id="o1")
    r.op("a", "order", "unknown", None, id="o2")
    r.op("a", "order", "fail", None, id="o3")
    assert acknowledged_writes_survive(r.history, ["o1"], kinds=["order"]) == []
    [lost] = acknowledged_writes_survive(r.history, ["o2"], kinds=["order"])
    assert lost.invariant == "no-lost-write" and "'o1' was acknowledged" in lost.message


def test_exactly_once_effects() -> None:
    r = Recorder()
    r.op("a", "send", "ok", None, id=1)
    r.op("a", "send", "unknown", None, id=2)
    r.op("a", "send", "fail", None, id=3)
    assert exactly_once(r.history, [1], kinds=["send"]) == []
    assert exactly_once(r.history, [1, 2], kinds=["send"]) == []
    found = {v.message for v in exactly_once(r.history, [1, 1, 2, 2, 3, 4], kinds=["send"])}
    assert found == {
        "1 was handled 2 times",
        "2 was handled 2 times",
        "3 was refused, and handled 1 times",
        "4 was handled and never sent",
    }
    assert [v.message for v in exactly_once(r.history, [], kinds=["send"])] == [
        "1 was sent and never handled"
    ]


def test_a_send_retried_under_its_id_is_one_message() -> None:
    r = Recorder()
    r.op("a", "send", "fail", None, id=1)  # refused, then sent again and acknowledged
    r.op("a", "send", "ok", None, id=1)
    r.op("a", "send", "unknown", None, id=2)
    r.op("a", "send", "ok", None, id=2)
    assert exactly_once(r.history, [1, 2], kinds=["send"]) == []
    found = [v.message for v in exactly_once(r.history, [1, 1], kinds=["send"])]
    assert found == ["1 was handled 2 times", "2 was sent and never handled"]


def test_expect_no_violations_raises_with_all_of_them() -> None:
    r = Recorder()
    r.op("a", "send", "ok", None, id=1)
    expect_no_violations(exactly_once(r.history, [1], kinds=["send"]))
    with pytest.raises(CheckFailed) as raised:
        expect_no_violations(
            exactly_once(r.history, [], kinds=["send"]),
            acknowledged_writes_survive(r.history, [], kinds=["send"]),
        )
    assert len(raised.value.violations) == 2
    assert "2 violations" in str(raised.value)


# -- shrinking --------------------------------------------------------------------------------


def noisy_schedule() -> FaultSchedule:
    events = [FaultEvent("slow-fsync", n, 0.01) for n in range(1, 21)]
    events += [FaultEvent("call-delay", n, 0.2) for n in range(1, 11)]
    events += [FaultEvent("crash", 0.37, 0.4)]
    events += [FaultEvent("power", 1.234, 0.3, files=("actors/a", "actors/b"))]
    return FaultSchedule(tuple(events))


def needs_the_power_loss(schedule: FaultSchedule) -> bool:
    """A failure that takes a power loss (not a mere crash) rolling back one file."""
    return any(e.kind == "power" and "actors/a" in e.files for e in schedule.events)


def test_shrinking_keeps_the_faults_that_matter_and_makes_them_mild() -> None:
    runs: list[FaultSchedule] = []

    def fails(s: FaultSchedule) -> bool:
        runs.append(s)
        return needs_the_power_loss(s)

    shrunk = shrink(noisy_schedule(), fails)
    assert shrunk.schedule == FaultSchedule((FaultEvent("power", 2.0, 0.0, files=("actors/a",)),))
    assert shrunk.runs == len(runs) == len({r.to_text() for r in runs})  # each tried once
    assert "32 faults -> 1" in shrunk.report()
    again = shrink(noisy_schedule(), needs_the_power_loss)
    assert again.schedule == shrunk.schedule and again.runs == shrunk.runs  # deterministic


def test_shrinking_stops_at_its_budget() -> None:
    shrunk = shrink(noisy_schedule(), needs_the_power_loss, max_runs=3)
    assert shrunk.runs == 3 and shrunk.exhausted
    assert needs_the_power_loss(shrunk.schedule)
    assert "the budget of runs ran out" in shrunk.report()


def test_a_failure_without_faults_shrinks_to_none() -> None:
    shrunk = shrink(noisy_schedule(), lambda s: True)
    assert len(shrunk.schedule) == 0 and shrunk.runs == 1


def test_a_crash_counted_in_steps_is_re_aimed_when_a_fault_before_it_goes() -> None:
    crash = FaultEvent("op-power", 5, 0.2, files=("actors/a",), steps=11)
    noise = FaultEvent("slow-fsync", 4, 0.0005)

    def fails(s: FaultSchedule) -> bool:
        # Without the slow fsync, the crash must land 3 steps in to hit the same moment.
        aim = 11 if noise in s.events else 3
        return any(e.kind == "op-power" and e.steps == aim and e.files for e in s.events)

    shrunk = shrink(FaultSchedule((crash, noise)), fails)
    assert shrunk.schedule == FaultSchedule(
        (FaultEvent("op-power", 5, 0.0, files=("actors/a",), steps=3),)
    )
    assert shrunk.tried["drop and re-aim"][1] == 1


def test_every_name_of_sim_is_what_it_says_whatever_was_imported_before() -> None:
    # A submodule imported under a name the package exports would shadow it.
    import importlib
    import pkgutil

    import sim

    for module in pkgutil.iter_modules(sim.__path__):
        importlib.import_module(f"sim.{module.name}")
    for name in sim.__all__:
        value = getattr(sim, name)
        assert getattr(value, "__name__", name) == name or not callable(value), name
        assert not isinstance(value, type(sim)), f"sim.{name} is a module"


def test_a_milder_fault_never_clashes_with_another_at_its_place() -> None:
    # The crash and the power loss at one time: the power loss cannot become a second crash.
    both = FaultSchedule((FaultEvent("crash", 1.0), FaultEvent("power", 1.0)))
    shrunk = shrink(both, lambda s: len(s) == 2)
    assert shrunk.schedule == both
