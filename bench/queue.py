"""Queues (docs/reference.md §12): send_batch vs raw sqlite3, push delivery vs huey,
producers vs queues.

1. ``send_batch(1000)`` through ``ak.queue.Client`` from an actor, on a real ``Host`` over
   ``FileStorage`` (fsync in a worker thread), vs raw ``sqlite3`` inserting the same rows into
   the same schema (``queues.schema``) in one transaction, WAL, synchronous=FULL.
   Rows per second. Target >= 0.5x.
2. Push delivery end to end: a producer actor sends N messages, one durable ``send`` each, to a
   queue whose consumer (``@ak.queue.consumer``, batch 10) acks them; the clock runs from the
   first send to the last ack. Baseline, message for message: huey with
   ``SqliteHuey(fsync=True)``, its consumer started in this process with one worker thread
   (like the one consumer actor) and short polling (1 ms), enqueuing the same N tasks one by
   one and running them; from the first enqueue to the last task done. Messages per second.
   Target >= 3x. The same feed with ``send_batch`` of 100 is shown beside it, without a target
   (huey has no batch enqueue), and so is this disk's write+fdatasync rate, which bounds a
   producer that waits for each durable send.
3. 32 producer actors each sending one durable message at a time, to one queue and spread over
   8 queues: sends per second, both reported (no target).
4. The queue features of ``bench/queue_features.py``: keyed vs plain sends, leasing from
   10,000 groups vs an ungrouped queue, and a cron schedule every second for an hour.

Each round opens the host afresh on the same files and runs every actorkeep side, then huey
(huey first in odd rounds); printed are each side's min / median / max and the ratio of each
round's pair. Files live in a temporary directory under ``.bench-tmp/`` in the repository (the
project's disk), removed afterwards.

    python bench/queue.py [--quick]
"""

from __future__ import annotations

import os
import sys

# Run as a script, this file's directory comes first on sys.path, and this file (queue.py)
# would shadow the standard library's ``queue``, which trio and huey import: put the
# repository root there instead.
_HERE = os.path.dirname(os.path.abspath(__file__))
if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _HERE:
    sys.path[0] = os.path.dirname(_HERE)

import argparse
import contextlib
import sqlite3
import statistics
import tempfile
import threading
import time
from pathlib import Path

import trio

import actorkeep as ak
from bench import queue_features as features
from bench.driver import call, spread
from queues import Queue
from queues.schema import INDEXES, SCHEMA

TARGET_BATCH = 0.5
TARGET_PUSH = 3.0
PRODUCERS = 32
QUEUES = 8
BATCH = 1000
BENCH_TMP = Path(__file__).resolve().parent.parent / ".bench-tmp"
BODY = bytes(range(100))

app = ak.App()
app.mount(Queue, "queue")
acked = [0]
all_acked = trio.Event()
expected = [0]


@app.actor("producer")
class Producer(ak.Actor):
    @ak.rpc
    async def batches(self, queue: str, count: int) -> int:
        """``count`` calls of ``send_batch`` with 1,000 bodies; the rows sent."""
        q = ak.queue.Client(queue)
        bodies = [BODY] * BATCH
        for _ in range(count):
            await q.send_batch(bodies)
        return count * BATCH

    @ak.rpc
    async def sends(self, queue: str, n: int, per: int, until: float | None = None) -> int:
        """Send ``n`` messages, ``per`` at a time (1: ``send``), or until ``until``."""
        q = ak.queue.Client(queue)
        sent = 0
        while sent < n and (until is None or sent == 0 or self.now() < until):
            if per == 1:
                await q.send(BODY)
                sent += 1
            else:
                k = min(per, n - sent)
                await q.send_batch([BODY] * k)
                sent += k
        return sent

    @ak.rpc
    async def configure(self, queue: str, consumer: str | None) -> None:
        await ak.queue.Client(queue).configure(ak.queue.Config(consumer=consumer, batch_size=10))


@app.actor("consumer")
class Consumer(ak.Actor):
    @ak.queue.consumer
    async def handle(self, msg: ak.queue.Lease) -> None:
        acked[0] += 1
        if acked[0] >= expected[0]:
            all_acked.set()


# -- 1. send_batch vs raw sqlite3 ------------------------------------------------------------


async def batch_rate(host: ak.Host, count: int, k: int) -> float:
    start = time.perf_counter()
    rows = await call(host, "producer/b", "batches", queue=f"queue/batch{k}", count=count)
    return float(rows) / (time.perf_counter() - start)


def open_raw(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    for statement in SCHEMA + INDEXES:
        conn.execute(statement)
    return conn


def raw_batch_rate(conn: sqlite3.Connection, count: int) -> float:
    """``count`` transactions of 1,000 inserted rows each; rows per second."""
    start = time.perf_counter()
    for _ in range(count):
        now = time.time()
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO actorkeep_queue (body, enqueued_at, visible_at, priority) "
            "VALUES (?, ?, ?, ?)",
            [(BODY, now, now, 0)] * BATCH,
        )
        conn.execute("COMMIT")
    return count * BATCH / (time.perf_counter() - start)


# -- 2. push delivery vs huey ----------------------------------------------------------------


async def push_rate(host: ak.Host, n: int, per: int, k: int) -> float:
    queue = f"queue/push{k}-{per}"
    await call(host, "producer/setup", "configure", queue=queue, consumer="consumer/c")
    global all_acked
    acked[0] = 0
    expected[0] = n
    all_acked = trio.Event()
    start = time.perf_counter()
    with trio.fail_after(300):  # fail, never hang, if deliveries stop
        await call(host, "producer/p", "sends", queue=queue, n=n, per=per)
        await all_acked.wait()
    return n / (time.perf_counter() - start)


def huey_rate(tmp: Path, n: int, k: int) -> float:
    """Enqueue ``n`` tasks one by one while a consumer thread runs them; tasks per second."""
    import logging

    from huey import SqliteHuey

    logging.getLogger("huey").setLevel(logging.ERROR)
    huey = SqliteHuey(f"bench{k}", filename=str(tmp / f"huey{k}.db"), fsync=True)
    done = [0]
    finished = threading.Event()

    @huey.task()  # type: ignore[untyped-decorator]
    def work(body: bytes) -> None:
        done[0] += 1
        if done[0] >= n:
            finished.set()

    consumer = huey.create_consumer(
        workers=1,
        worker_type="thread",
        periodic=False,
        initial_delay=0.001,
        backoff=1.0,
        max_delay=0.001,
        check_worker_health=False,
    )
    consumer.start()
    try:
        start = time.perf_counter()
        for _ in range(n):
            work(BODY)
        if not finished.wait(timeout=300):
            raise RuntimeError(f"huey ran only {done[0]} of {n} tasks")
        return n / (time.perf_counter() - start)
    finally:
        consumer.stop(graceful=True)
        huey.storage.close()


async def fsync_rate(tmp: Path, n: int) -> float:
    """Sequential small write + fdatasync in a worker thread, as FileStorage syncs: per second."""
    path = tmp / "fsync-floor"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        start = time.perf_counter()
        for _ in range(n):
            os.write(fd, BODY)
            await trio.to_thread.run_sync(os.fdatasync, fd)
        return n / (time.perf_counter() - start)
    finally:
        os.close(fd)
        path.unlink()


# -- 3. producers vs queues ------------------------------------------------------------------


async def producers_rate(host: ak.Host, queues: int, seconds: float, limit: int) -> float:
    counts = [0] * PRODUCERS
    until = host.clock.now() + seconds

    async def one(i: int) -> None:
        counts[i] = await call(
            host, f"producer/s{i}", "sends", queue=f"queue/many{i % queues}", n=limit, per=1,
            until=until,
        )  # fmt: skip

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(PRODUCERS):
            nursery.start_soon(one, i)
    return sum(counts) / (time.perf_counter() - start)


# -- the run ---------------------------------------------------------------------------------


Results = dict[str, list[float]]


async def measure_actorkeep(tmp: Path, r: int, quick: bool, results: Results) -> None:
    """One round of the actorkeep sides (and of raw sqlite3 and the fsync floor, beside them),
    on a host opened on the same data directory each round."""
    count = 2 if quick else 20
    n = 200 if quick else 5000
    seconds = 0.2 if quick else 2.0
    conn = open_raw(tmp / "raw.sqlite")
    host = ak.Host(app, ak.FileStorage(tmp / "data"))
    try:
        async with host.open():
            if r == 0:  # warm-up: files and directories exist
                await batch_rate(host, 1, 0)
                raw_batch_rate(conn, 1)
                await producers_rate(host, QUEUES, 0.0, 1)
                await producers_rate(host, 1, 0.0, 1)
            results["batch"].append(await batch_rate(host, count, r + 1))
            results["raw"].append(raw_batch_rate(conn, count))
            results["push1"].append(await push_rate(host, n, 1, r))
            results["fsync"].append(await fsync_rate(tmp, n))
            results["push100"].append(await push_rate(host, n, 100, r))
            results["one_queue"].append(await producers_rate(host, 1, seconds, 10**6))
            results["eight_queues"].append(await producers_rate(host, QUEUES, seconds, 10**6))
    finally:
        conn.close()


def ratios(results: Results, ours: str, theirs: str) -> list[float]:
    """The ratio of each round's pair."""
    return [a / b for a, b in zip(results[ours], results[theirs], strict=True)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a tiny run (smoke test)")
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 5)
    n = 200 if args.quick else 5000

    load_before = os.getloadavg()[0]
    results: Results = {
        k: []
        for k in ("batch", "raw", "push1", "fsync", "push100", "huey", "one_queue", "eight_queues")
    }
    BENCH_TMP.mkdir(exist_ok=True)
    try:
        with tempfile.TemporaryDirectory(dir=BENCH_TMP, prefix="queue-") as tmp:
            for r in range(rounds):  # huey's consumer wants the main thread, outside trio
                if r % 2:
                    results["huey"].append(huey_rate(Path(tmp), n, r))
                trio.run(measure_actorkeep, Path(tmp), r, args.quick, results)
                if not r % 2:
                    results["huey"].append(huey_rate(Path(tmp), n, r))
    finally:
        with contextlib.suppress(OSError):
            BENCH_TMP.rmdir()

    med = {k: statistics.median(v) for k, v in results.items()}
    print(
        f"queue: {rounds} rounds, the sides alternating; min / median / max (load average "
        f"{load_before:.2f} before, {os.cpu_count()} cores)"
    )
    for k, v in results.items():
        print(f"  {k:13} {spread(v, 0)} per second")
    batch = ratios(results, "batch", "raw")
    print(
        f"queue send_batch({BATCH}): {med['batch']:,.0f} rows/s, raw sqlite3 batched insert "
        f"{med['raw']:,.0f} rows/s, ratio {spread(batch, 2)}x (target >= {TARGET_BATCH:g}x, "
        f"{'met' if statistics.median(batch) >= TARGET_BATCH else 'MISSED'})"
    )
    push = ratios(results, "push1", "huey")
    print(
        f"queue push delivery, message for message (one durable send each, consumer batch 10): "
        f"{med['push1']:,.0f} msgs/s, huey SqliteHuey enqueuing one by one {med['huey']:,.0f} "
        f"msgs/s, ratio {spread(push, 2)}x (target >= {TARGET_PUSH:g}x, "
        f"{'met' if statistics.median(push) >= TARGET_PUSH else 'MISSED'}); one producer waits "
        f"for each fsync: this disk's write+fdatasync loop does {med['fsync']:,.0f}/s"
    )
    print(
        f"queue push delivery fed by send_batch(100): {med['push100']:,.0f} msgs/s, "
        f"{spread(ratios(results, 'push100', 'huey'), 2)}x huey (no target: one fsync per "
        f"100 messages against huey's one per message, which has no batch enqueue)"
    )
    print(
        f"queue durable send, {PRODUCERS} producers: one queue {med['one_queue']:,.0f} sends/s, "
        f"{QUEUES} queues {med['eight_queues']:,.0f} sends/s, "
        f"ratio {med['eight_queues'] / med['one_queue']:.2f}x (no target)"
    )
    features.run(args.rounds or (1 if args.quick else features.ROUNDS), args.quick)


if __name__ == "__main__":
    main()
