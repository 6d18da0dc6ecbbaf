"""The queue scenario of the simulator: durable pull leases, the workload, the checker."""

from __future__ import annotations

from typing import Any

import pytest
import trio

import queues
from sim import World, run_seed
from sim.check import check_errors
from sim.faults import Faults
from sim.history import History, Op, Status
from sim.queues.bugs import PlainLeaseQueue
from sim.queues.checker import check_queue
from sim.queues.workload import PULL, PUSH, PushRecorder, make_app, queue_op

MAX = {PULL: 3}
PULL_FILE = f"actors/{PULL}"


# -- durable pull leases --------------------------------------------------------------------
def _lease_power_loss_lease(queue_cls: type[queues.Queue]) -> tuple[World, list[Op]]:
    """send, lease (visibility 1 s), power loss that rolls back every unsynced file, restart,
    wait out the lease, lease again, then ack with the first lease's name."""
    world = World(make_app(PushRecorder(), queue_cls), seed=0, faults=Faults(rollback_p=1.0))
    ops: list[Op] = []

    async def main(w: World) -> None:
        sent = {"queue": PULL, "bodies": [b"m"], "delay": 0.0}
        ops.append(await queue_op(w, "p0", "send", sent))
        ops.append(await queue_op(w, "w0", "lease", {"queue": PULL, "max": 1, "visibility": 1.0}))
        assert w.crash(power_loss=True)
        await w.restart(2.0)
        ops.append(await queue_op(w, "w1", "lease", {"queue": PULL, "max": 1, "visibility": 1.0}))
        (i, attempt, _), *_ = ops[1].result
        ops.append(await queue_op(w, "w0", "ack", {"queue": PULL, "id": i, "attempt": attempt}))

    world.run(main)
    return world, ops


def test_a_pull_lease_survives_power_loss_and_its_name_is_never_reused() -> None:
    world, (send, first, second, late_ack) = _lease_power_loss_lease(queues.Queue)
    (i,) = send.result
    assert first.result == [[i, 1, b"m"]]
    assert second.result == [[i, 2, b"m"]]  # the first lease was durable: attempts went up
    assert late_ack.status == "ok" and late_ack.result is False  # stale: nothing changed
    assert check_queue(world.history, MAX, require_drained=False) == []


def test_plain_leases_reuse_names_after_power_loss_and_the_checker_sees_it() -> None:
    """What the queue did before leases were durable: the stale ack settles the new lease."""
    world, (_, first, second, late_ack) = _lease_power_loss_lease(PlainLeaseQueue)
    assert PULL_FILE in world.history.faults[0].detail["rolled_back"]
    assert second.result == first.result  # the same name (id, 1) handed out twice
    assert late_ack.result is True
    found = {v.invariant for v in check_queue(world.history, MAX, require_drained=False)}
    assert found == {"attempts-increase"}


def test_a_lease_costs_one_fsync_and_an_empty_lease_none() -> None:
    world = World(make_app(PushRecorder()), seed=0)
    syncs: list[int] = []

    async def main(w: World) -> None:
        lease = {"queue": PULL, "max": 5, "visibility": 1.0}
        await queue_op(w, "p0", "send_batch", {"queue": PULL, "bodies": [b"a", b"b"], "delay": 0})
        await queue_op(w, "w0", "stats", {"queue": PULL})
        await trio.sleep(1)  # the new caller w0 is registered (registry.py): its own syncs
        for _ in range(2):  # the first takes both messages, the second finds none
            before = w.storage.syncs
            await queue_op(w, "w0", "lease", lease)
            syncs.append(w.storage.syncs - before)

    world.run(main)
    assert syncs == [1, 0]


# -- call faults are recorded, never raised -------------------------------------------------
@pytest.mark.parametrize(
    ("faults", "status"),
    [(Faults(call_refuse_p=1.0), "fail"), (Faults(reply_loss_p=1.0), "unknown")],
)
def test_refused_calls_fail_and_lost_replies_are_unknown(faults: Faults, status: Status) -> None:
    world = World(make_app(PushRecorder()), seed=0, faults=faults)
    ops: list[Op] = []

    async def main(w: World) -> None:
        sent = {"queue": PULL, "bodies": [b"m"], "delay": 0.0}
        ops.append(await queue_op(w, "p0", "send", sent))
        ops.append(await queue_op(w, "p0", "stats", {"queue": PULL}))

    world.run(main)
    assert [op.status for op in ops] == [status, status]
    assert check_errors(world.history) == []
    assert check_queue(world.history, MAX, require_drained=False) == []


# -- the scenario ---------------------------------------------------------------------------
def test_a_sweep_is_clean_and_exercises_the_faults() -> None:
    results = [run_seed("queues", seed) for seed in range(60)]
    assert [(r.seed, str(v)) for r in results for v in r.violations] == []
    faults = {f.kind for r in results for f in r.history.faults}
    assert {"crash", "power-loss", "call-refused", "reply-lost"} <= faults
    deliveries = [f for r in results for f in r.history.observations if f.kind == "queue.deliver"]
    assert {f.detail["outcome"] for f in deliveries} == {"ack", "raise", "later"}
    dead = [op for r in results for op in r.history.ops if op.kind == "queue.dead_letters"]
    assert any(op.result for op in dead)  # max_attempts is small enough to dead-letter
    ops = sum(r.ops for r in results) / len(results)
    assert 60 <= ops <= 400


def test_a_seed_replays_exactly() -> None:
    a, b = run_seed("queues", 7), run_seed("queues", 7)
    assert a.trace_hash == b.trace_hash
    assert run_seed("queues", 8).trace_hash != a.trace_hash


@pytest.mark.parametrize(
    ("bug", "invariants"),
    [
        ("ack-stale", {"stale-ack-refused"}),
        ("lazy-send", {"no-phantom", "no-lost-message"}),
        ("lease-reuse", {"attempts-increase"}),
    ],
)
def test_a_planted_bug_is_reported_with_its_seed(bug: str, invariants: set[str]) -> None:
    for seed in range(40):
        result = run_seed("queues", seed, bug)
        if result.violations:
            break
    else:
        pytest.fail(f"40 seeds did not catch {bug}")
    assert {v.invariant for v in result.violations} & invariants
    again = run_seed("queues", seed, bug)
    assert [str(v) for v in again.violations] == [str(v) for v in result.violations]


# -- the checker on small histories ---------------------------------------------------------
class Script:
    """Builds a history one completed operation (or fault, or delivery) at a time."""

    def __init__(self) -> None:
        self.history = History()
        self.t = 1.0

    def op(self, kind: str, args: dict[str, Any], result: Any, status: Status = "ok") -> Op:
        op = self.history.invoke("c0", f"queue.{kind}", {"queue": PULL, **args}, 1, self.t)
        self.history.complete(op, status, result, self.t + 0.001)
        self.t += 0.002
        return op

    def send(self, *bodies: bytes, ids: list[int] | None, status: Status = "ok") -> Op:
        return self.op("send_batch", {"bodies": list(bodies), "delay": 0.0}, ids, status)

    def lease(self, *leases: tuple[int, int, bytes]) -> Op:
        return self.op("lease", {"max": 10, "visibility": 1.0}, [list(x) for x in leases])

    def ack(self, i: int, attempt: int, result: bool = True) -> Op:
        return self.op("ack", {"id": i, "attempt": attempt}, result)

    def power_loss(self, *files: str) -> None:
        self.history.fault("power-loss", self.t, host=1, rolled_back=list(files))

    def deliver(self, i: int, attempt: int, body: bytes, outcome: str = "ack") -> None:
        self.history.observe(
            "queue.deliver", self.t, queue=PUSH, id=i, attempt=attempt, body=body, outcome=outcome
        )

    def leased(self, i: int, attempt: int) -> None:
        """The push queue reports handing out lease ``(i, attempt)``."""
        self.history.observe("queue.leased", self.t, queue=PUSH, id=i, attempt=attempt)

    def final(self, *dead: tuple[int, bytes, int], live: int = 0, queue: str = PULL) -> None:
        self.op("stats", {"queue": queue, "final": True}, [live, 0, 0, len(dead)])
        items = [[i, body, attempts, "max attempts exceeded"] for i, body, attempts in dead]
        self.op("dead_letters", {"queue": queue, "after": 0, "limit": 100, "final": True}, items)

    def check(self, max_attempts: dict[str, int] = MAX) -> set[str]:
        return {v.invariant for v in check_queue(self.history, max_attempts)}


def test_a_phantom_and_a_visible_failed_send_are_reported() -> None:
    s = Script()
    s.send(b"gone", ids=None, status="fail")
    s.lease((1, 1, b"gone"), (2, 1, b"nobody"))
    assert s.check() >= {"failed-send-invisible", "no-phantom"}


def test_a_lost_acknowledged_send_is_reported() -> None:
    s = Script()
    s.send(b"a", b"b", ids=[1, 2])
    s.lease((1, 1, b"a"))
    s.ack(1, 1)
    s.final()  # message 2 is neither dead nor acked
    assert s.check() == {"no-lost-message"}
    t = Script()
    t.send(b"a", b"b", ids=[1, 2])
    t.lease((1, 1, b"a"))
    t.ack(1, 1)
    t.final((2, b"b", 3))
    assert t.check() == set()


def test_attempts_going_down_and_a_reused_lease_name_are_reported() -> None:
    s = Script()
    s.send(b"a", ids=[1])
    s.lease((1, 2, b"a"))
    s.lease((1, 1, b"a"))
    s.ack(1, 1)  # and so this ack is of a stale lease
    s.final()
    assert s.check() == {"attempts-increase", "stale-ack-refused"}
    t = Script()
    t.send(b"a", ids=[1])
    t.lease((1, 1, b"a"))
    t.power_loss(PULL_FILE)  # pull leases are durable: a power loss excuses nothing
    t.lease((1, 1, b"a"))
    t.ack(1, 1)
    t.final()
    assert t.check() == {"attempts-increase"}


def test_a_stale_ack_that_settled_is_reported() -> None:
    s = Script()
    s.send(b"a", ids=[1])
    s.lease((1, 1, b"a"))
    s.lease((1, 2, b"a"))  # the first lease ran out; someone else holds the message now
    s.ack(1, 1, result=True)
    s.final()
    assert s.check() == {"stale-ack-refused", "no-lost-message"}


def test_a_redelivery_after_an_ack_needs_a_power_loss_of_the_queue_file() -> None:
    def run(*rolled: str) -> set[str]:
        s = Script()
        s.send(b"a", ids=[1])
        s.lease((1, 1, b"a"))
        s.ack(1, 1)
        if rolled:
            s.power_loss(*rolled)
        s.lease((1, 2, b"a"))  # the ack was a plain write: it may be undone
        s.ack(1, 2)
        s.final()
        return s.check()

    assert run(PULL_FILE) == set()
    assert run() == {"acked-stays-acked"}
    assert run("actors/queue/other") == {"acked-stays-acked"}


def test_push_deliveries_may_repeat_an_attempt_only_after_a_rollback() -> None:
    def run(rolled: bool) -> set[str]:
        s = Script()
        s.op("send", {"queue": PUSH, "bodies": [b"p"], "delay": 0.0}, [1])
        s.deliver(1, 1, b"p", "raise")
        s.deliver(1, 2, b"p", "ack")
        if rolled:
            s.power_loss(f"actors/{PUSH}")
        s.deliver(1, 1, b"p", "ack")  # push leases are plain writes
        s.final(queue=PUSH)
        return s.check({PUSH: 3})

    assert run(True) == set()
    assert run(False) == {"attempts-increase"}


def test_a_push_delivery_held_up_on_its_way_begins_when_its_lease_was_handed_out() -> None:
    """On a cluster, a push call held up in a cut link reaches the consumer after later
    deliveries: it began when the queue leased it, not when the consumer saw it."""

    def late_old_lease(leased: bool) -> set[str]:
        s = Script()
        s.op("send", {"queue": PUSH, "bodies": [b"p"], "delay": 0.0}, [1])
        if leased:
            s.leased(1, 1)  # the old owner's lease: its call is held up
        s.power_loss(f"actors/{PUSH}")  # the old owner's plain lease is lost: a takeover
        if leased:
            s.leased(1, 1)  # the new owner leases the same name again
        s.deliver(1, 1, b"p", "ack")  # one of the two arrives
        s.deliver(1, 1, b"p", "ack")  # then the other: the same name twice
        s.final(queue=PUSH)
        return s.check({PUSH: 3})

    def late_lower_attempt(leased: bool) -> set[str]:
        s = Script()
        s.op("send", {"queue": PUSH, "bodies": [b"p"], "delay": 0.0}, [1])
        if leased:
            s.leased(1, 1)  # its call is held up past the visibility: leased again
            s.leased(1, 2)
        s.deliver(1, 2, b"p", "ack")
        s.deliver(1, 1, b"p", "ack")  # the held-up first attempt arrives last
        s.final(queue=PUSH)
        return s.check({PUSH: 3})

    assert late_old_lease(True) == set()
    assert late_old_lease(False) == {"attempts-increase"}  # as the consumer saw them
    assert late_lower_attempt(True) == set()
    assert late_lower_attempt(False) == {"attempts-increase"}


def test_a_queue_that_does_not_drain_is_a_liveness_violation() -> None:
    s = Script()
    s.send(b"a", ids=[1])
    s.final(live=1)
    assert s.check() == {"liveness"}
    t = Script()
    t.send(b"a", ids=[1])
    assert t.check() == {"liveness"}  # no final state at all
