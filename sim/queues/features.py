"""The queue-features scenario: keyed, grouped and expiring sends to one rate-limited pull
queue, leased, acked, retried, failed and forgotten by workers while the host crashes and
loses power; then checked (docs/simulation.md).

The invariants, over the history's operations (real-time order; virtual time):

- ``key-unique``: never two live messages with one key: a send with key ``k`` that answers
  a new id while an earlier answered send of ``k`` got another one needs that message finished
  (acked or failed with True, or dead-lettered) before it.
- ``group-exclusive``: never two leased messages of one group: no lease of another message of
  the group falls wholly inside a lease that was neither settled nor dead-lettered meanwhile.
- ``group-fifo``: within a group, messages are leased in send order: once a message was
  leased, no message of the group sent before it is leased again (a retry blocks its group).
- ``rate``: over any span of ``t`` seconds the leases handed out hold at most
  ``burst + rate * t`` messages.

Pull leases are durable before they answer, and so is each lease's spending of the bucket, so
power loss excuses none of these.
"""

from __future__ import annotations

import dataclasses
import random
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import trio

import actorkeep as ak
import queues
from actorkeep.queue import Config
from actorkeep.wire.queue import Lease, Outcome, Retry
from queues.queue import Queue
from queues.sending import PLAIN, SendOptions

from ..check import Violation
from ..faults import FaultDraw
from ..history import History, Op
from ..runner import Scenario, Setup
from ..world import World

QUEUE = "feature-queue/q"
CLIENT = "sim-feature-client"
RATE, BURST = 20.0, 5
VISIBILITY = (0.2, 1.0)
EPS = 1e-6


class FeatureClient(ak.Actor):
    """Runs one queue operation per call: ``["ok", value]`` or ``["lost"|"refused"|"error",
    why]``."""

    @ak.rpc
    async def op(self, name: str, args: dict[str, Any]) -> list[Any]:
        q = ak.queue.Client(QUEUE)
        try:
            if name == "send":
                i = await q.send(
                    args["body"], key=args["key"], group=args["group"], expires=args["expires"]
                )
                return ["ok", i]
            if name == "lease":
                leases = await q.lease(args["max"], args["visibility"], worker=args["worker"])
                return ["ok", [[x.id, x.attempt, x.body, x.key, x.group] for x in leases]]
            if name in ("ack", "retry", "fail"):
                if name == "ack":
                    ok = await q.ack(args["id"], args["attempt"])
                elif name == "retry":
                    ok = await q.retry(args["id"], args["attempt"], delay=0.05)
                else:
                    ok = await q.fail(args["id"], args["attempt"], "the worker gave up")
                return ["ok", ok]
            if name == "configure":
                await q.configure(Config(**args["config"]))
                return ["ok", None]
            if name == "dead":
                items = await q.dead_letters(limit=1000)
                return ["ok", [[d.id, d.body, d.reason, d.failed_at] for d in items]]
        except ak.Overloaded as exc:
            return ["refused", str(exc)]
        except ak.CallTimeout as exc:
            return ["lost", str(exc)]
        except ak.RemoteError as exc:
            return ["error", f"{type(exc).__name__}: {exc}"]
        raise ValueError(f"unknown op {name!r}")


def _classify(reply: Any) -> tuple[Any, Any]:
    what, value = reply
    if what == "ok":
        return "ok", value
    if what == "refused":
        return "fail", value
    return "unknown", value


async def op(world: World, process: str, name: str, args: dict[str, Any]) -> Op:
    return await world.invoke(
        process,
        f"feature.{name}",
        args,
        lambda: world.rpc(f"{CLIENT}/{process}", "op", timeout=None, name=name, args=args),
        classify=_classify,
    )


# -- the plan and the workload -----------------------------------------------------------------


@dataclass(frozen=True)
class FeaturePlan:
    producers: int
    sends: int
    workers: int
    rounds: int
    keys: int  # how many distinct keys the sends draw from
    groups: int


def draw_plan(rng: random.Random) -> FeaturePlan:
    return FeaturePlan(
        producers=rng.randint(1, 3),
        sends=rng.randint(5, 15),
        workers=rng.randint(1, 3),
        rounds=rng.randint(8, 20),
        keys=rng.randint(2, 6),
        groups=rng.randint(1, 3),
    )


async def producer(w: World, p: str, plan: FeaturePlan, rng: random.Random) -> None:
    for n in range(plan.sends):
        args = {
            "body": f"{p}.{n}".encode(),
            "key": f"k{rng.randrange(plan.keys)}" if rng.random() < 0.5 else None,
            "group": f"g{rng.randrange(plan.groups)}" if rng.random() < 0.6 else None,
            "expires": rng.uniform(0.5, 4.0) if rng.random() < 0.2 else None,
        }
        await op(w, p, "send", args)
        await trio.sleep(rng.uniform(0, 0.2))


async def worker(w: World, p: str, plan: FeaturePlan, rng: random.Random) -> None:
    for _ in range(plan.rounds):
        args = {"max": rng.randint(1, 4), "visibility": rng.uniform(*VISIBILITY), "worker": p}
        leased = await op(w, p, "lease", args)
        if leased.status == "ok":
            for i, attempt, *_ in leased.result:
                await trio.sleep(rng.uniform(0, 0.1))
                r = rng.random()
                what = "ack" if r < 0.7 else "retry" if r < 0.85 else "fail" if r < 0.9 else None
                if what is not None:
                    await op(w, p, what, {"id": i, "attempt": attempt})
        await trio.sleep(rng.uniform(0, 0.3))


async def drain(w: World) -> None:
    """Lease and ack until ten leases in a row (five seconds, longer than any visibility,
    backoff or expiry here) found nothing."""
    empty = 0
    while empty < 10:
        leased = await op(w, "drain", "lease", {"max": 10, "visibility": 5.0, "worker": "drain"})
        got = leased.result if leased.status == "ok" else []
        for i, attempt, *_ in got:
            await op(w, "drain", "ack", {"id": i, "attempt": attempt})
        empty = 0 if got or leased.status != "ok" else empty + 1
        await trio.sleep(0.5)


def workload(plan: FeaturePlan, draw: FaultDraw) -> Any:
    async def main(w: World) -> None:
        config = {"max_attempts": 3, "backoff_base": 0.05, "backoff_max": 0.2}
        args = {"config": {**config, "rate": RATE, "burst": BURST}}
        for _ in range(20):  # again until acknowledged: the checker holds the rate from then
            if (await op(w, "setup", "configure", args)).status == "ok":
                break
        rng = w.rng("feature-workload")
        async with trio.open_nursery() as nursery:
            # Not cancelled when the clients end: a crash's restart must not be cut short.
            nursery.start_soon(w.timed_faults, w.rng("timed-faults"), draw.timed, 5.0, draw.power_p)
            for k in range(plan.producers):
                nursery.start_soon(producer, w, f"p{k}", plan, random.Random(rng.random()))
            for k in range(plan.workers):
                nursery.start_soon(worker, w, f"w{k}", plan, random.Random(rng.random()))
        w.heal()
        await w.wait_up()
        await drain(w)
        await op(w, "final", "dead", {})

    return main


# -- the checker -------------------------------------------------------------------------------


def check_features(history: History, rate: float = RATE, burst: int = BURST) -> list[Violation]:
    ops = [o for o in history.ops if o.kind.startswith("feature.")]
    found: list[Violation] = []
    dead: dict[int, float] = {}
    for o in ops:
        if o.kind == "feature.dead" and o.status == "ok":
            dead.update({i: failed_at for i, _, _, failed_at in o.result})
    settled: dict[tuple[int, int], list[Op]] = defaultdict(list)
    for o in ops:
        if o.kind in ("feature.ack", "feature.retry", "feature.fail") and o.result is not False:
            settled[(o.args["id"], o.args["attempt"])].append(o)
    finished: dict[int, list[Op]] = defaultdict(list)
    for o in ops:
        if o.kind in ("feature.ack", "feature.fail") and o.result is not False:
            finished[o.args["id"]].append(o)

    # key-unique
    by_key: dict[str, list[Op]] = defaultdict(list)
    for o in ops:
        if o.kind == "feature.send" and o.status == "ok" and o.args["key"] is not None:
            by_key[o.args["key"]].append(o)
    for key, sends in by_key.items():
        for s1 in sends:
            for s2 in sends:
                if s1.result == s2.result or not s1.precedes(s2):
                    continue
                done = any(f.invoke_index < s2.complete_index for f in finished[s1.result])
                done = done or dead.get(s1.result, float("inf")) <= s2.complete_time
                if not done:
                    found.append(
                        Violation(
                            "key-unique",
                            f"key {key!r}: id {s2.result} queued while {s1.result} was live",
                            (s1.id, s2.id),
                        )
                    )

    # the leases, by group
    leases: list[tuple[Op, int, int, str]] = []
    for o in ops:
        if o.kind == "feature.lease" and o.status == "ok":
            leases += [(o, i, a, g) for i, a, _, _, g in o.result if g is not None]
    for o1, i1, a1, g1 in leases:
        until = o1.invoke_time + o1.args["visibility"]
        for o2, i2, _, g2 in leases:
            if g1 != g2 or i1 == i2 or not o1.precedes(o2) or o2.complete_time >= until:
                continue
            freed = any(s.invoke_index < o2.complete_index for s in settled[(i1, a1)])
            freed = freed or dead.get(i1, float("inf")) <= o2.complete_time
            if not freed:
                found.append(
                    Violation(
                        "group-exclusive",
                        f"group {g1!r}: {i2} leased while {i1} (attempt {a1}) was",
                        (o1.id, o2.id),
                    )
                )
    for o1, i1, _, g1 in leases:
        for o2, i2, _, g2 in leases:
            if g1 == g2 and i2 < i1 and o1.precedes(o2):
                found.append(
                    Violation(
                        "group-fifo",
                        f"group {g1!r}: {i2} leased after {i1}, which was sent later",
                        (o1.id, o2.id),
                    )
                )

    # rate, from the first acknowledged configure (one whose outcome is unknown may not hold)
    configured = [
        o.complete_time for o in ops if o.kind == "feature.configure" and o.status == "ok"
    ]
    if not configured:
        found.append(
            Violation("rate", "no configure was acknowledged: the rate could not be checked")
        )
    since = min(configured, default=float("inf"))
    handed = sorted(
        (
            o
            for o in ops
            if o.kind == "feature.lease"
            and o.status == "ok"
            and o.result
            and o.invoke_time >= since
        ),
        key=lambda o: o.complete_time,
    )
    for a, first in enumerate(handed):
        total = 0
        for last in handed[a:]:
            total += len(last.result)
            span = last.complete_time - first.invoke_time
            if total > burst + rate * span + EPS:
                found.append(
                    Violation(
                        "rate",
                        f"{total} messages leased within {span:.3f} s (at most "
                        f"{burst} + {rate} per second)",
                        (first.id, last.id),
                    )
                )
                break
    return found[:20]


# -- planted bugs ------------------------------------------------------------------------------


class KeylessQueue(Queue):
    """Forgets the keys of sends: a second send of a live key queues a second message."""

    async def send(
        self, bodies: list[bytes], delay: float, priority: int, opts: SendOptions = PLAIN
    ) -> list[int]:
        return await super().send(bodies, delay, priority, dataclasses.replace(opts, keys=None))


class UngroupedQueue(Queue):
    """Leaves every message of a group leasable: two of a group are leased at once."""

    async def send(
        self, bodies: list[bytes], delay: float, priority: int, opts: SendOptions = PLAIN
    ) -> list[int]:
        ids = await super().send(bodies, delay, priority, opts)
        self.sql.exec("UPDATE actorkeep_queue SET blocked = 0 WHERE blocked = 1")
        return ids


class RetryUnblocksQueue(Queue):
    """A retried message lets the next of its group go: the group is no longer FIFO."""

    def settle(self, now: float, outcomes: list[Outcome]) -> tuple[list[bool], float | None]:
        results, earliest = super().settle(now, outcomes)
        for o, ok in zip(outcomes, results, strict=True):
            if ok and isinstance(o, Retry):
                self.sql.exec(
                    "UPDATE actorkeep_queue SET blocked = 0 WHERE id = (SELECT MIN(id) FROM "
                    "actorkeep_queue WHERE id > ? AND grp = (SELECT grp FROM actorkeep_queue "
                    "WHERE id = ?))",
                    (o.id, o.id),
                )
        return results, earliest


class ExpiryUnblocksQueue(Queue):
    """A message that expires lets the one after it in its group go, even when it was not
    its group's head (queues/groups.py links that one to the message before the expired one
    instead): two of a group leasable at once, out of order."""

    def sweep(self, now: float) -> None:
        after = [
            i
            for (i,) in self.sql.exec(
                "SELECT id FROM actorkeep_queue WHERE prev IN (SELECT id FROM actorkeep_queue "
                "WHERE expires_at IS NOT NULL AND expires_at <= ?)",
                (now,),
            ).fetchall()
        ]
        super().sweep(now)
        if after:
            self.sql.exec(
                "UPDATE actorkeep_queue SET blocked = 0, prev = NULL "
                f"WHERE id IN ({','.join('?' * len(after))})",
                after,
            )


class UnlimitedQueue(Queue):
    """Ignores its rate when it leases."""

    def lease(
        self,
        now: float,
        n: int,
        visibility: float,
        durable: bool = False,
        worker: str | None = None,
    ) -> list[Lease]:
        cfg = self.cfg
        self.cfg = dataclasses.replace(cfg, rate=None, burst=None)
        try:
            return super().lease(now, n, visibility, durable, worker)
        finally:
            self.cfg = cfg


FEATURE_BUGS: dict[str, type[Queue]] = {
    "key-ignored": KeylessQueue,
    "group-ignored": UngroupedQueue,
    "retry-unblocks-group": RetryUnblocksQueue,
    "expiry-unblocks-group": ExpiryUnblocksQueue,
    "rate-ignored": UnlimitedQueue,
}


def make_app(queue_cls: type[Queue] = queues.Queue) -> ak.App:
    app = ak.App()
    app.mount(queue_cls, "feature-queue", access="internal")
    app.mount(FeatureClient, CLIENT)
    return app


def setup(plan: FeaturePlan, queue_cls: Any, draw: FaultDraw) -> Setup:
    return Setup(
        app=make_app(queue_cls or queues.Queue),
        workload=lambda world: workload(plan, draw),
        check=check_features,
        ops=lambda history: len(history.ops),
        summary=dataclasses.asdict(plan),
    )


QUEUE_FEATURES = Scenario(
    "queue-features", "queue-features-scenario", FEATURE_BUGS, draw_plan, setup
)

__all__ = ["FEATURE_BUGS", "QUEUE_FEATURES", "check_features", "make_app"]
