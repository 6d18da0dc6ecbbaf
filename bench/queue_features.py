"""Queue features (issue 18), run by ``bench/queue.py`` after its own sections, or alone:

1. Keyed sends vs plain sends, through ``ak.queue.Client`` from an actor on a real ``Host``
   over ``FileStorage``: ``send_batch`` of 1,000 bodies each with its own key, vs the same
   without keys, 50 batches per side per round into a fresh queue (its file made first, not
   timed); and one durable ``send`` at
   a time, 300 per side. Time per message; target: a keyed send costs at most 1.2x a plain
   one.
2. Leasing from 10,000 groups of 10 messages vs from an ungrouped queue of the same 100,000
   messages: a worker leases 100 at a time and acks each lease with one ``settle`` until the
   queue is empty (each ack of a grouped message lets the next of its group go). The groups
   are named as an application's users would be (``user-`` and eight hex digits, spread over
   the name order), the i-th message in the ``i % 10,000``-th: names that sort in send order
   (``g0``, ``g1``, ...) would keep a settle's groups together in any index of names and
   flatter a design that has one. Messages per second; target: grouped at least 0.8x
   ungrouped.
3. Polling a queue with 100,000 messages waiting and none visible vs polling an empty queue:
   half the messages delayed by a day, half leased for a day (their first attempt of five:
   leases running), all made in the first round, not timed; 300 ``lease(10)`` calls per side
   per round, each finding nothing. Time per lease; target (decision 0024): at most 1.5x the
   empty queue's, whatever waits behind the visible messages.
4. A cron schedule firing every second (``* * * * * *``) for an hour of virtual time on a
   test host under ``trio.testing.MockClock``: it must fire 3,600 times, none early, none
   twice. The wall time it takes is shown.

The sides of 1 to 3 alternate order each round; printed are min / median / max and the ratio
of each round's pair.

    python bench/queue_features.py [--quick] [--rounds N]   (15 rounds by default)
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _HERE:
    sys.path[0] = os.path.dirname(_HERE)  # this folder's queue.py shadows the stdlib's

import argparse
import contextlib
import itertools
import math
import statistics
import tempfile
import time
from pathlib import Path

import trio
import trio.testing

import actorkeep as ak
from bench.driver import call, spread
from queues import Queue

TARGET_KEYED = 1.2
TARGET_GROUPED = 0.8
TARGET_POLL = 1.5
GROUPS, PER_GROUP = 10_000, 10
LEASE = 100
BATCH = 1000
BODY = bytes(range(100))
HOUR = 3600
WAITING, POLLS = 100_000, 300
QUICK_GROUPS, QUICK_WAITING, QUICK_SPAN = 1_000, 10_000, 60  # --quick: a smoke run
#: Rounds by default. One round's grouped/ungrouped ratio swings from 0.56x to 0.99x on the
#: project's 2-core VM (both sides' rates vary by a third from round to round), so the
#: median needs many rounds to settle: with 5 to 7 it moved between 0.75x and 0.82x.
ROUNDS = 15
BENCH_TMP = Path(__file__).resolve().parent.parent / ".bench-tmp"


def group_name(n: int) -> str:
    """The ``n``-th group's name: distinct for n < 2**32, in no relation to ``n``'s order."""
    return f"user-{n * 2654435761 % 2**32:08x}"


app = ak.App()
app.mount(Queue, "queue")
fired: list[tuple[float, float]] = []  # (due, now) of each cron run


@app.actor("producer")
class Producer(ak.Actor):
    @ak.rpc
    async def batches(self, queue: str, count: int, keyed: bool) -> float:
        """``count`` ``send_batch`` calls of 1,000 bodies; seconds taken."""
        q = ak.queue.Client(queue)
        bodies = [BODY] * BATCH
        # Made before the clock starts: the sends are timed, not the making of their keys.
        keys = [[f"{queue}-{b}-{i}" for i in range(BATCH)] if keyed else None for b in range(count)]
        await q.send(BODY)  # not timed: the queue's file exists
        start = time.perf_counter()
        for b in range(count):
            await q.send_batch(bodies, keys=keys[b])
        return time.perf_counter() - start

    @ak.rpc
    async def singles(self, queue: str, n: int, keyed: bool) -> float:
        """``n`` durable sends one at a time; seconds taken."""
        q = ak.queue.Client(queue)
        await q.send(BODY)  # not timed: the queue's file exists
        start = time.perf_counter()
        for i in range(n):
            await q.send(BODY, key=f"{queue}-{i}" if keyed else None)
        return time.perf_counter() - start

    @ak.rpc
    async def fill(self, queue: str, groups: int, grouped: bool) -> None:
        """``groups * PER_GROUP`` messages, the i-th in group ``i % groups`` (``grouped``)."""
        q = ak.queue.Client(queue)
        for start in range(0, groups * PER_GROUP, BATCH):
            ids = range(start, start + BATCH)
            names = [group_name(i % groups) for i in ids] if grouped else None
            await q.send_batch([BODY] * BATCH, groups=names)

    @ak.rpc
    async def waiting(self, queue: str, n: int) -> None:
        """``n`` messages not visible: half leased for a day, half delayed by a day."""
        q = ak.queue.Client(queue)
        for _ in range(0, n // 2, BATCH):
            await q.send_batch([BODY] * BATCH)
            if len(await q.lease(BATCH, visibility=86_400.0)) != BATCH:
                raise RuntimeError(f"{queue} did not lease {BATCH}")
        for _ in range(0, n - n // 2, BATCH):
            await q.send_batch([BODY] * BATCH, delay=86_400.0)

    @ak.rpc
    async def polls(self, queue: str, n: int) -> float:
        """``n`` leases that find nothing visible; seconds taken."""
        q = ak.queue.Client(queue)
        await q.lease(10, visibility=30.0)  # not timed: the queue's file exists
        start = time.perf_counter()
        for _ in range(n):
            if await q.lease(10, visibility=30.0):
                raise RuntimeError(f"{queue} had a visible message")
        return time.perf_counter() - start

    @ak.rpc
    async def drain(self, queue: str, n: int) -> float:
        """Lease ``LEASE`` at a time and ack each lease in one settle until ``n`` are done;
        seconds taken."""
        q = ak.queue.Client(queue)
        done = 0
        start = time.perf_counter()
        while done < n:
            leases = await q.lease(LEASE, visibility=600.0)
            if not leases:
                raise RuntimeError(f"{queue} ran dry after {done} messages")
            await q.settle([ak.queue.Ack(x.id, x.attempt) for x in leases])
            done += len(leases)
        return time.perf_counter() - start


@app.actor("ticker")
class Ticker(ak.Actor):
    @ak.rpc
    async def start(self) -> None:
        await self.schedule("tick", cron="* * * * * *", key="tick")

    @ak.rpc
    async def stop(self) -> None:
        await self.cancel_schedule("tick")

    async def tick(self, run: ak.ScheduleRun) -> None:
        fired.append((run.due, self.now()))


Results = dict[str, list[float]]


async def measure(tmp: Path, r: int, quick: bool, results: Results) -> None:
    """One round of sections 1 and 2 on a host opened afresh on the same directory."""
    count, singles = (2, 30) if quick else (50, 300)
    groups = QUICK_GROUPS if quick else GROUPS
    drained = groups * PER_GROUP  # every message
    host = ak.Host(app, ak.FileStorage(tmp / "data"))
    async with host.open():
        sides = [False, True] if r % 2 == 0 else [True, False]
        for keyed in sides:
            name = "keyed" if keyed else "plain"
            q = f"queue/{name}-batch{r}"
            seconds = await call(host, "producer/p", "batches", queue=q, count=count, keyed=keyed)
            results[f"{name}_batch"].append(seconds / (count * BATCH) * 1e6)
            q = f"queue/{name}-single{r}"
            seconds = await call(host, "producer/p", "singles", queue=q, n=singles, keyed=keyed)
            results[f"{name}_single"].append(seconds / singles * 1e6)
        for grouped in [not s for s in sides]:
            name = "grouped" if grouped else "ungrouped"
            q = f"queue/{name}{r}"
            await call(host, "producer/p", "fill", queue=q, groups=groups, grouped=grouped)
            seconds = await call(host, "producer/p", "drain", queue=q, n=drained)
            results[name].append(drained / seconds)
        waiting_n, polls = (QUICK_WAITING, 30) if quick else (WAITING, POLLS)
        if r == 0:
            await call(host, "producer/p", "waiting", queue="queue/waiting", n=waiting_n)
        for waiting in sides:
            name = "poll_waiting" if waiting else "poll_empty"
            q = "queue/waiting" if waiting else "queue/empty"
            seconds = await call(host, "producer/p", "polls", queue=q, n=polls)
            results[name].append(seconds / polls * 1e6)


async def cron_span(tmp: str, span: int) -> float:
    """``span`` seconds of virtual time with a schedule every second; wall seconds taken."""
    fired.clear()
    start = time.perf_counter()
    async with ak.testing.open_host(app, tmp) as host:
        await call(host.host, "ticker/t", "start")
        # to half a second past the span-th whole second: exactly ``span`` occurrences
        t0 = host.host.clock.now()
        await trio.sleep(math.floor(t0) + span + 0.5 - t0)
        await call(host.host, "ticker/t", "stop")
    return time.perf_counter() - start


def check_cron() -> tuple[int, int, int, bool]:
    """How many runs, how many early, how many twice, and whether the dues are every second."""
    dues = [due for due, _ in fired]
    early = sum(now < due for due, now in fired)
    twice = len(dues) - len(set(dues))
    steps = {round(b - a, 6) for a, b in itertools.pairwise(dues)}
    return len(fired), early, twice, steps == {1.0}


def report(results: Results, groups: int, waiting: int, span: int, cron_seconds: float) -> bool:
    """Print the lines; True if every target was met."""
    ok = True
    for side in ("batch", "single"):
        ratio = [
            k / p for k, p in zip(results[f"keyed_{side}"], results[f"plain_{side}"], strict=True)
        ]
        met = statistics.median(ratio) <= TARGET_KEYED
        ok &= met
        what = f"send_batch({BATCH})" if side == "batch" else "send, one at a time"
        print(
            f"queue keyed {what}: keyed {spread(results[f'keyed_{side}'], 1)} us/message, plain "
            f"{spread(results[f'plain_{side}'], 1)} us/message, ratio {spread(ratio, 2)}x "
            f"(target <= {TARGET_KEYED:g}x, {'met' if met else 'MISSED'})"
        )
    ratio = [g / u for g, u in zip(results["grouped"], results["ungrouped"], strict=True)]
    met = statistics.median(ratio) >= TARGET_GROUPED
    ok &= met
    print(
        f"queue lease+ack from {groups:,} groups of {PER_GROUP}: {spread(results['grouped'], 0)} "
        f"msgs/s, ungrouped {spread(results['ungrouped'], 0)} msgs/s, ratio {spread(ratio, 2)}x "
        f"(target >= {TARGET_GROUPED:g}x, {'met' if met else 'MISSED'})"
    )
    ratio = [d / e for d, e in zip(results["poll_waiting"], results["poll_empty"], strict=True)]
    met = statistics.median(ratio) <= TARGET_POLL
    ok &= met
    print(
        f"queue lease with {waiting:,} messages waiting (half leased, half delayed) and none "
        f"visible: {spread(results['poll_waiting'], 1)} us, empty queue "
        f"{spread(results['poll_empty'], 1)} us, ratio {spread(ratio, 2)}x "
        f"(target <= {TARGET_POLL:g}x, {'met' if met else 'MISSED'})"
    )
    runs, early, twice, every_second = check_cron()
    met = runs == span and early == 0 and twice == 0 and every_second
    ok &= met
    print(
        f"cron every second for {span:,} s of virtual time: {runs:,} runs, {early} early, "
        f"{twice} twice, one per second: {every_second} ({cron_seconds:.1f} s of wall time; "
        f"target {span:,} runs, none early or twice: {'met' if met else 'MISSED'})"
    )
    return ok


def run(rounds: int, quick: bool) -> bool:
    results: Results = {
        k: []
        for k in (
            "plain_batch",
            "keyed_batch",
            "plain_single",
            "keyed_single",
            "grouped",
            "ungrouped",
            "poll_waiting",
            "poll_empty",
        )
    }
    BENCH_TMP.mkdir(exist_ok=True)
    try:
        with tempfile.TemporaryDirectory(dir=BENCH_TMP, prefix="queue-features-") as tmp:
            for r in range(rounds):
                trio.run(measure, Path(tmp), r, quick, results)
            clock = trio.testing.MockClock(autojump_threshold=0)
            span = QUICK_SPAN if quick else HOUR
            cron_seconds = trio.run(cron_span, str(Path(tmp) / "cron"), span, clock=clock)
    finally:
        with contextlib.suppress(OSError):
            BENCH_TMP.rmdir()
    print(f"queue features: {rounds} rounds, the sides alternating; min / median / max")
    return report(
        results,
        QUICK_GROUPS if quick else GROUPS,
        QUICK_WAITING if quick else WAITING,
        span,
        cron_seconds,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a tiny run (smoke test)")
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args(argv)
    run(args.rounds or (1 if args.quick else ROUNDS), args.quick)


if __name__ == "__main__":
    main()
