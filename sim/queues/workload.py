"""The queue workload: producers, pull workers and a push consumer on two queues, under faults.

Two queues of the ready class ``queues.Queue``: ``queue/pull``, where worker processes lease,
ack, retry, extend and settle (and sometimes forget a lease, ack late, or replay an old lease),
and ``queue/push``, configured with ``consumer=``, whose alarm pushes batches to the actor
``sim-queue-consumer/c``. The consumer reports every delivery to the world
(``History.observe("queue.deliver", ...)``) and acks, raises or returns ``RetryLater`` at
random; the queues report every lease they hand out (``queue.leased``), so that a delivery
held up on its way (a cut link between hosts) is known to have begun when it was leased.
Every body is unique (``<process>.<n>`` or ``<process>.<n>.<k>``), so a body seen names its
send. Client actors (``sim-queue-client/<process>``) run one queue operation per call and
return plain outcomes: a refused call (``Overloaded``) is a definite failure, a lost reply
(``CallTimeout``) is unknown.

After the fault phase the world heals; a final process drains the pull queue and the consumer
acks everything, within ``DRAIN_BOUND`` virtual seconds; then the final state of both queues
(stats and every dead letter) is read for the checker (sim/queues/checker.py).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio

import actorkeep as ak
import queues
from actorkeep.queue import Ack, Config, Lease, Retry, RetryLater
from actorkeep.wire.queue import Outcome

from ..history import Op, Status
from ..world import World

QUEUE_CLASS = "queue"
CLIENT_CLASS = "sim-queue-client"
CONSUMER_CLASS = "sim-queue-consumer"
PULL = f"{QUEUE_CLASS}/pull"
PUSH = f"{QUEUE_CLASS}/push"
CONSUMER = f"{CONSUMER_CLASS}/c"
#: Virtual seconds the heal may take to drain both queues. Longer than any visibility,
#: backoff, late alarm, or alarm retry (2 s doubling) a fault phase can leave behind.
DRAIN_BOUND = 300.0
#: Backoff of both queues: short, so that retries come back within a run.
BACKOFF_BASE, BACKOFF_MAX = 0.02, 0.2
#: The kinds of operation that send (each has ``bodies`` and ``delay`` in its args).
SEND_KINDS = ("queue.send", "queue.send_delayed", "queue.send_batch")


# -- the app -----------------------------------------------------------------------------------


class QueueClientActor(ak.Actor):
    """Runs one ``ak.queue`` operation per call and returns a plain, msgpack-able outcome:
    ``["ok", value]``, ``["refused", why]`` (``Overloaded``: the queue never saw it),
    ``["lost", why]`` (``CallTimeout``: it may have happened) or ``["error", why]``."""

    @ak.rpc
    async def op(self, name: str, args: dict[str, Any]) -> list[Any]:
        q = ak.queue.Client(args["queue"])
        try:
            return ["ok", await _run(q, name, args)]
        except ak.Overloaded as exc:
            return ["refused", str(exc)]
        except ak.CallTimeout as exc:
            return ["lost", str(exc)]
        except ak.RemoteError as exc:
            return ["error", f"{type(exc).__name__}: {exc}"]


def _outcome(item: list[Any]) -> Outcome:
    """``[op, id, attempt, delay, error]`` as an ``Ack`` or ``Retry``."""
    what, i, attempt, delay, error = item
    return Ack(i, attempt) if what == "ack" else Retry(i, attempt, delay, error)


async def _run(q: ak.queue.Client, name: str, a: dict[str, Any]) -> Any:
    if name == "send":
        return [await q.send(a["bodies"][0], delay=a["delay"])]
    if name == "send_delayed":
        return [await q.send_delayed(a["bodies"][0], a["delay"])]
    if name == "send_batch":
        return await q.send_batch(a["bodies"], delay=a["delay"])
    if name == "lease":
        return [[x.id, x.attempt, x.body] for x in await q.lease(a["max"], a["visibility"])]
    if name == "ack":
        return await q.ack(a["id"], a["attempt"])
    if name == "retry":
        return await q.retry(a["id"], a["attempt"], a["delay"], a["error"])
    if name == "settle":
        return await q.settle([_outcome(x) for x in a["outcomes"]])
    if name == "extend":
        return await q.extend(a["id"], a["attempt"], a["visibility"])
    if name == "get":
        job = await q.get(a["id"])
        return None if job is None else [job.state, job.attempts, job.body]
    if name == "stats":
        st = await q.stats()
        return [st.ready, st.delayed, st.leased, st.dead]
    if name == "dead_letters":
        items = await q.dead_letters(a["limit"], a["after"])
        return [[d.id, d.body, d.attempts, d.reason] for d in items]
    if name == "configure":
        await q.configure(Config.from_wire(a["config"]))
        return None
    raise ValueError(f"unknown queue op {name!r}")


class PushRecorder:
    """The world's ear inside the push consumer: it reports each delivery and draws what the
    consumer does with it (every random choice from the seed's ``push-consumer`` stream)."""

    def __init__(self) -> None:
        self.world: World | None = None
        self.rng = random.Random(0)
        self.healed = False
        self.weights: tuple[int, int, int] = (1, 0, 0)  # ack, raise, later
        self.slow_p = 0.0
        self.slow_max = 0.0
        self.later_delays = [0.0]

    def deliver(self, msg: Lease) -> tuple[str, float, float]:
        """Report ``msg``; its outcome ("ack", "raise" or "later"), the seconds the handler
        takes, and the delay of a "later"."""
        world = self.world
        assert world is not None, "run_queue_workload sets the recorder's world"
        if self.healed:
            outcome, pause, delay = "ack", 0.0, 0.0
        else:
            outcome = self.rng.choices(("ack", "raise", "later"), self.weights)[0]
            slow = self.rng.random() < self.slow_p
            pause = self.rng.uniform(0.0, self.slow_max) if slow else 0.0
            delay = self.rng.choice(self.later_delays)
        inc = world.current
        # A crashed incarnation's consumer may still run a step while it dies: whatever it
        # decides cannot reach its (dead) queue, so it is not a delivery anyone saw.
        if inc is not None and inc.alive:
            world.history.observe(
                "queue.deliver",
                world.now(),
                queue=PUSH,
                id=msg.id,
                attempt=msg.attempt,
                body=msg.body,
                outcome=outcome,
                host=inc.number,
            )
        return outcome, pause, delay


class PushConsumer(ak.Actor):
    """The push queue's consumer: reports each message, then acks, raises or retries later."""

    @ak.queue.consumer(queues=[PUSH])
    async def handle(self, msg: Lease) -> RetryLater | None:
        recorder: PushRecorder = self.options["recorder"]
        outcome, pause, delay = recorder.deliver(msg)
        if pause > 0:
            await trio.sleep(pause)  # sometimes longer than the push call's timeout
        if outcome == "raise":
            raise RuntimeError(f"sim: the consumer fails message {msg.id}")
        if outcome == "later":
            return RetryLater(delay)
        return None


class ObservedLeases(queues.Queue):
    """Mixed into the queue class: reports each lease it hands out, with the world's time."""

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> None:
        """It takes ``recorder`` besides the queue's own options."""
        super().check_options({k: v for k, v in options.items() if k != "recorder"})

    def lease(
        self,
        now: float,
        n: int,
        visibility: float,
        durable: bool = False,
        worker: str | None = None,
    ) -> list[Lease]:
        leases = super().lease(now, n, visibility, durable, worker)
        recorder: PushRecorder = self.options["recorder"]
        world = recorder.world
        inc = None if world is None else world.current
        if world is not None and inc is not None and inc.alive:
            for x in leases:
                world.history.observe(
                    "queue.leased", world.now(), queue=self.address, id=x.id, attempt=x.attempt
                )
        return leases


def make_app(recorder: PushRecorder, queue_cls: type[queues.Queue] = queues.Queue) -> ak.App:
    """The queues (internal, reporting their leases), the client actors and the consumer."""
    app = ak.App()
    observed = type(queue_cls.__name__, (ObservedLeases, queue_cls), {})
    app.mount(observed, QUEUE_CLASS, access="internal", recorder=recorder)
    app.mount(QueueClientActor, CLIENT_CLASS)
    app.mount(PushConsumer, CONSUMER_CLASS, recorder=recorder)
    return app


# -- recording operations ----------------------------------------------------------------------


def classify(reply: Any) -> tuple[Status, Any]:
    """ok; refused -> fail (nothing happened); lost -> unknown; error -> unknown, and an
    error while the host is up is a violation (``check_errors``)."""
    tag, value = reply
    if tag == "ok":
        return "ok", value
    if tag == "refused":
        return "fail", {"refused": value}
    if tag == "lost":
        return "unknown", {"lost": value}
    return "unknown", {"error": value, "host_alive": True}


async def queue_op(world: World, process: str, name: str, args: dict[str, Any]) -> Op:
    """Run one queue operation as client ``process`` and record it as ``queue.<name>``."""
    address = f"{CLIENT_CLASS}/{process}"
    return await world.invoke(
        process,
        f"queue.{name}",
        args,
        lambda: world.rpc(address, "op", timeout=None, name=name, args=args),
        classify=classify,
    )


def live(stats: list[int]) -> int:
    """Messages ready, delayed or leased in a recorded ``stats`` result."""
    return stats[0] + stats[1] + stats[2]


# -- the plan ----------------------------------------------------------------------------------


@dataclass
class QueuePlan:
    """A run's shape, drawn from the seed."""

    producers: int
    sends: int  # operations per producer
    workers: int
    rounds: int  # iterations per pull worker
    push_share: float  # the fraction of sends that go to the push queue
    pull_max_attempts: int
    push_max_attempts: int
    batch_size: int  # of push deliveries
    push_visibility: float  # of push deliveries (also the push call's timeout)
    visibilities: list[float]  # what pull workers lease with
    think: list[float]
    delays: list[float]  # explicit retry delays, RetryLater delays
    consumer_weights: tuple[int, int, int]  # ack, raise, later
    slow_p: float  # how often the consumer takes its time

    def max_attempts(self) -> dict[str, int]:
        return {PULL: self.pull_max_attempts, PUSH: self.push_max_attempts}


def draw_plan(rng: random.Random) -> QueuePlan:
    return QueuePlan(
        producers=rng.randint(1, 3),
        sends=rng.randint(6, 16),
        workers=rng.randint(1, 3),
        rounds=rng.randint(8, 22),
        push_share=rng.choice([0.0, 0.3, 0.5, 0.7]),
        pull_max_attempts=rng.choice([3, 4]),
        push_max_attempts=rng.choice([3, 4]),
        batch_size=rng.choice([1, 2, 4]),
        push_visibility=rng.choice([0.3, 1.0]),
        visibilities=rng.choice([[0.05, 0.2], [0.2, 1.0], [0.05, 1.0]]),
        think=rng.choice([[0.0], [0.0, 0.01, 0.05], [0.0, 0.05, 0.2]]),
        delays=rng.choice([[0.0, 0.05], [0.0, 0.05, 0.3]]),
        consumer_weights=rng.choice([(8, 1, 1), (5, 3, 2), (3, 5, 2)]),
        slow_p=rng.choice([0.0, 0.0, 0.1]),
    )


def _config(plan: QueuePlan, queue: str) -> Config:
    if queue == PUSH:
        return Config(
            consumer=CONSUMER,
            batch_size=plan.batch_size,
            visibility=plan.push_visibility,
            max_attempts=plan.push_max_attempts,
            backoff_base=BACKOFF_BASE,
            backoff_max=BACKOFF_MAX,
        )
    return Config(
        max_attempts=plan.pull_max_attempts, backoff_base=BACKOFF_BASE, backoff_max=BACKOFF_MAX
    )


# -- the processes -----------------------------------------------------------------------------


async def configure(world: World, plan: QueuePlan) -> None:
    """Configure both queues before anything is sent (again until acknowledged)."""
    for queue in (PULL, PUSH):
        args = {"queue": queue, "config": _config(plan, queue).to_wire()}
        for _ in range(20):
            op = await queue_op(world, "setup", "configure", args)
            if op.status == "ok":
                break


async def producer(world: World, process: str, plan: QueuePlan, rng: random.Random) -> None:
    """Sends (single, delayed, batches) to both queues, and reads what it sent."""
    sent: list[tuple[str, int]] = []
    for n in range(plan.sends):
        await trio.sleep(rng.choice(plan.think))
        queue = PUSH if rng.random() < plan.push_share else PULL
        kind = rng.choices(
            ["send", "send_delayed", "send_batch", "get", "stats"], [40, 15, 25, 12, 8]
        )[0]
        body = f"{process}.{n}".encode()
        args: dict[str, Any]
        if kind == "get" and sent:
            queue, i = rng.choice(sent)
            args = {"queue": queue, "id": i}
        elif kind == "stats":
            args = {"queue": queue}
        elif kind == "send_batch":
            bodies = [body + f".{k}".encode() for k in range(rng.randint(2, 5))]
            args = {"queue": queue, "bodies": bodies, "delay": rng.choice([0.0, 0.0, 0.1])}
        elif kind == "send_delayed":
            args = {"queue": queue, "bodies": [body], "delay": rng.choice([0.01, 0.1, 0.5])}
        else:
            kind = "send"
            args = {"queue": queue, "bodies": [body], "delay": 0.0}
        op = await queue_op(world, process, kind, args)
        if op.kind in SEND_KINDS and op.status == "ok":
            sent.extend((queue, i) for i in op.result)


async def pull_worker(world: World, process: str, plan: QueuePlan, rng: random.Random) -> None:
    """Leases from the pull queue and does something with each lease, good or bad."""
    old: list[tuple[int, int]] = []  # every lease this worker was handed
    for _ in range(plan.rounds):
        await trio.sleep(rng.choice(plan.think))
        r = rng.random()
        if old and r < 0.08:  # replay an old lease: stale unless nobody leased it since
            i, attempt = rng.choice(old)
            await _settle_one(world, process, rng.choice(["ack", "retry", "extend"]), i, attempt)
            continue
        if r < 0.13:
            await queue_op(world, process, "stats", {"queue": PULL})
            continue
        visibility = rng.choice(plan.visibilities)
        args = {"queue": PULL, "max": rng.choice([1, 1, 2, 3]), "visibility": visibility}
        op = await queue_op(world, process, "lease", args)
        if op.status != "ok" or not op.result:
            await trio.sleep(rng.choice([0.01, 0.05]))
            continue
        leases = [(i, attempt) for i, attempt, _ in op.result]
        old.extend(leases)
        if len(leases) > 1 and rng.random() < 0.4:
            outcomes = [
                ["ack", i, a, None, None]
                if rng.random() < 0.6
                else ["retry", i, a, rng.choice([None, *plan.delays]), "sim: batch item failed"]
                for i, a in leases
            ]
            await queue_op(world, process, "settle", {"queue": PULL, "outcomes": outcomes})
            continue
        for i, attempt in leases:
            await _handle(world, process, plan, rng, i, attempt, visibility)


async def _handle(
    world: World,
    process: str,
    plan: QueuePlan,
    rng: random.Random,
    i: int,
    attempt: int,
    visibility: float,
) -> None:
    what = rng.choices(
        ["ack", "slow-ack", "late-ack", "retry", "forget", "extend", "get"],
        [35, 10, 10, 18, 12, 8, 7],
    )[0]
    if what == "forget":  # the worker "crashes": the lease runs out
        return
    if what == "slow-ack":
        await trio.sleep(rng.uniform(0.0, visibility / 2))
    elif what == "late-ack":  # after the lease ran out: stale if someone leased it since
        await trio.sleep(visibility * rng.uniform(1.1, 2.0))
    elif what == "retry":
        delay = rng.choice([None, *plan.delays])
        error = rng.choice([None, f"sim: {process} failed"])
        args = {"queue": PULL, "id": i, "attempt": attempt, "delay": delay, "error": error}
        await queue_op(world, process, "retry", args)
        return
    elif what == "extend":
        await trio.sleep(visibility / 2)
        args = {"queue": PULL, "id": i, "attempt": attempt, "visibility": visibility * 2}
        await queue_op(world, process, "extend", args)
        await trio.sleep(visibility)
    elif what == "get":
        await queue_op(world, process, "get", {"queue": PULL, "id": i})
    await _settle_one(world, process, "ack", i, attempt)


async def _settle_one(world: World, process: str, what: str, i: int, attempt: int) -> None:
    args: dict[str, Any] = {"queue": PULL, "id": i, "attempt": attempt}
    if what == "retry":
        args.update(delay=0.0, error=None)
    elif what == "extend":
        args["visibility"] = 0.5
    await queue_op(world, process, what, args)


# -- the heal ----------------------------------------------------------------------------------


async def drain_pull(world: World) -> None:
    """Lease and ack until the pull queue's stats show nothing live (or the bound passes)."""
    deadline = world.now() + DRAIN_BOUND
    pause = 0.05
    while world.now() < deadline:
        st = await queue_op(world, "final", "stats", {"queue": PULL})
        if st.status == "ok" and live(st.result) == 0:
            return
        op = await queue_op(
            world, "final", "lease", {"queue": PULL, "max": 100, "visibility": 60.0}
        )
        if op.status == "ok" and op.result:
            outcomes = [["ack", i, a, None, None] for i, a, _ in op.result]
            await queue_op(world, "final", "settle", {"queue": PULL, "outcomes": outcomes})
            pause = 0.05
        else:
            await trio.sleep(pause)  # leases of forgetful workers, delays and backoffs
            pause = min(pause * 2, 8.0)


async def wait_push(world: World) -> None:
    """Wait until the push queue's stats show nothing live (or the bound passes)."""
    deadline = world.now() + DRAIN_BOUND
    pause = 0.1
    while world.now() < deadline:
        st = await queue_op(world, "final", "stats", {"queue": PUSH})
        if st.status == "ok" and live(st.result) == 0:
            return
        await trio.sleep(pause)
        pause = min(pause * 2, 8.0)


async def final_state(world: World) -> None:
    """Each queue's final stats and all its dead letters, marked ``final`` for the checker."""
    for queue in (PULL, PUSH):
        await queue_op(world, "final", "stats", {"queue": queue, "final": True})
        after = 0
        while True:
            args = {"queue": queue, "after": after, "limit": 100, "final": True}
            op = await queue_op(world, "final", "dead_letters", args)
            if op.status != "ok" or len(op.result) < 100:
                break
            after = op.result[-1][0]


def run_queue_workload(
    world: World, plan: QueuePlan, recorder: PushRecorder, fault_count: int, power_p: float
) -> Callable[[World], Any]:
    """The ``main`` of a queue scenario for ``World.run``."""
    recorder.world = world
    recorder.rng = world.rng("push-consumer")
    recorder.weights = plan.consumer_weights
    recorder.slow_p = plan.slow_p
    recorder.slow_max = plan.push_visibility * 1.5
    recorder.later_delays = plan.delays

    async def main(w: World) -> None:
        await configure(w, plan)
        async with trio.open_nursery() as nursery:
            for i in range(plan.producers):
                nursery.start_soon(producer, w, f"p{i}", plan, w.rng(f"producer/p{i}"))
            for i in range(plan.workers):
                nursery.start_soon(pull_worker, w, f"w{i}", plan, w.rng(f"worker/w{i}"))
            if fault_count:
                think = sum(plan.think) / len(plan.think)
                span = plan.rounds * (think + 0.05) + 0.1
                nursery.start_soon(
                    w.timed_faults, w.rng("timed-faults"), fault_count, span, power_p
                )
        w.heal()
        recorder.healed = True
        await w.wait_up()
        await drain_pull(w)
        await wait_push(w)
        w.history.note("drained: final state")
        await final_state(w)

    return main
