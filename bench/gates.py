"""The durability path (decision 0015): gated writes and group commit against the disk itself,
side by side in one run.

1. One queue, 32 producer actors each awaiting one durable ``send`` at a time: sends/s and
   sends per fsync (the fdatasync calls of the host are counted), vs a plain loop appending
   100 bytes to a file and calling fdatasync, one by one, on the same disk (in this thread:
   no hand-off). Target: more than 1.5 sends per fsync, and above the loop's rate.
2. One KV shard, 32 calling actors: durable puts vs the same callers' local puts. Target:
   >= 0.7x.
3. One calling actor, one shard: durable puts vs raw ``sqlite3`` autocommit inserts (WAL,
   ``synchronous=FULL``) of the same rows in this thread. Target: >= 0.7x. Beside it, the
   ceiling of any design that keeps the fsync off the event loop: a local put's p50 plus one
   fdatasync the host's way (6.: its io_uring, or a sync thread), against the raw insert.
4. Push delivery fed by 32 producer actors' single durable sends (one push queue, batch 10, a
   consumer actor that acks) vs huey (``SqliteHuey(fsync=True)``, one worker thread) fed by 32
   threads enqueuing one task at a time: the same number of messages, first send to last ack.
   Target: >= 3x.
5. KV local put latency, one caller, 20,000 puts of 100 bytes through the client: p50, p99 and
   p99.9. Target: p99.9 <= 3x p50. Beside it, the same ratio for raw sqlite3 inserts of the
   same rows with the shard's settings and for a pure-Python loop that takes as long as the
   put's p50: what the machine itself gives.
6. The hand-off to a sync thread: ``Syncer.run`` (the host's sync threads) vs
   ``trio.to_thread.run_sync``, of a function that does nothing and of a write in place +
   fdatasync, and the same fdatasync through the host's io_uring (decision 0026):
   microseconds per call (no target; the sync worker must not cost more).

Every side runs once per round, the rounds interleave the sides, and min/median/max over the
rounds are printed. Files live under ``.bench-tmp/`` in the repository (the project's disk).

    python bench/gates.py [--quick] [--rounds N] [--threads]

``--threads``: the host's fdatasyncs go to its sync threads, as on a machine without io_uring.
"""

from __future__ import annotations

# Run as a script, this file's directory comes first on sys.path, where bench/http.py and
# bench/queue.py would shadow the standard library modules of those names (trio imports
# `queue`). Put the repository root there instead, before anything else is imported.
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _HERE:
    sys.path[0] = os.path.dirname(_HERE)

import argparse
import contextlib
import math
import sqlite3
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import trio

import actorkeep as ak
import shards
from actorkeep.runtime import storage
from actorkeep.runtime.syncer import Syncer
from bench.driver import call, spread
from queues import Queue

PRODUCERS = 32
BODY = bytes(range(100))
BENCH_TMP = Path(__file__).resolve().parent.parent / ".bench-tmp"
TARGETS = {"per_fsync": 1.5, "shard": 0.7, "single": 0.7, "push": 3.0, "tail": 3.0}

app = ak.App()
app.mount(Queue, "queue")
app.mount(shards.KVShard, "kv")
kv = ak.kv.Client("kv", shards=1)
acked = [0]
expected = [0]
all_acked = trio.Event()


@app.actor("producer")
class Producer(ak.Actor):
    @ak.rpc
    async def sends(self, queue: str, n: int, until: float | None = None) -> int:
        """Durable sends, one at a time: ``n`` of them, or as many as fit before ``until``."""
        q = ak.queue.Client(queue)
        sent = 0
        while sent < n and (until is None or self.now() < until):
            await q.send(BODY)
            sent += 1
        return sent

    @ak.rpc
    async def configure(self, queue: str) -> None:
        await ak.queue.Client(queue).configure(
            ak.queue.Config(consumer="consumer/c", batch_size=10)
        )


@app.actor("caller")
class Caller(ak.Actor):
    @ak.rpc
    async def puts(self, until: float, local: bool) -> int:
        """Puts of this caller's own keys until ``until``; how many."""
        n = 0
        prefix = self.name
        while self.now() < until:
            await kv.put(f"{prefix}/{n % 1000}", BODY, local=local)
            n += 1
        return n

    @ak.rpc
    async def latencies(self, n: int) -> list[float]:
        """``n`` local puts, one at a time; each one's latency in seconds."""
        out = []
        clock = time.perf_counter
        for i in range(n):
            start = clock()
            await kv.put(f"lat/{i % 5000}", BODY, local=True)
            out.append(clock() - start)
        return out


@app.actor("consumer")
class Consumer(ak.Actor):
    @ak.queue.consumer
    async def handle(self, msg: ak.queue.Lease) -> None:
        acked[0] += 1
        if acked[0] >= expected[0]:
            all_acked.set()


class FsyncCounter:
    """Counts the fdatasyncs of a ``FileStorage``: those its sync threads call and those its
    io_uring completed (every durable point goes through one or the other)."""

    def __init__(self, files: ak.FileStorage) -> None:
        self._threads = 0
        self._lock = threading.Lock()
        self._real: Callable[[int], None] = storage._datasync
        self._files = files

    @property
    def count(self) -> int:
        syncer = self._files.syncer
        ring = None if syncer is None else syncer.ring
        return self._threads + (0 if ring is None else ring.completed)

    def install(self) -> None:
        def counting(fd: int) -> None:
            with self._lock:
                self._threads += 1
            self._real(fd)

        storage._datasync = counting


# -- the sides -------------------------------------------------------------------------------


async def one_queue(host: ak.Host, fsyncs: FsyncCounter, seconds: float, r: int) -> list[float]:
    """32 producers to one queue: [sends/s, sends per fsync]."""
    counts = [0] * PRODUCERS
    until = host.clock.now() + seconds
    before = fsyncs.count

    async def one(i: int) -> None:
        counts[i] = await call(
            host, f"producer/q{r}-{i}", "sends", queue=f"queue/one{r}", n=10**9, until=until
        )

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(PRODUCERS):
            nursery.start_soon(one, i)
    elapsed = time.perf_counter() - start
    sent = sum(counts)
    return [sent / elapsed, sent / max(1, fsyncs.count - before)]


def append_fdatasync(tmp: Path, seconds: float) -> float:
    """A plain loop: append 100 bytes, fdatasync, in this thread; per second."""
    path = tmp / "append-floor"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        n = 0
        start = time.perf_counter()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            os.write(fd, BODY)
            os.fdatasync(fd)
            n += 1
        return n / (time.perf_counter() - start)
    finally:
        os.close(fd)
        path.unlink()


async def shard_puts(host: ak.Host, seconds: float, local: bool, r: int) -> float:
    """32 callers putting to one shard: puts per second."""
    counts = [0] * PRODUCERS
    until = host.clock.now() + seconds

    async def one(i: int) -> None:
        counts[i] = await call(host, f"caller/c{i}", "puts", until=until, local=local)

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(PRODUCERS):
            nursery.start_soon(one, i)
    return sum(counts) / (time.perf_counter() - start)


async def single_puts(host: ak.Host, seconds: float) -> float:
    start = time.perf_counter()
    n = await call(host, "caller/single", "puts", until=host.clock.now() + seconds, local=False)
    return float(n) / (time.perf_counter() - start)


def raw_autocommit(path: Path, seconds: float) -> float:
    """Raw sqlite3 autocommit inserts, WAL, synchronous=FULL, in this thread; per second."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS kv (key BLOB PRIMARY KEY, value BLOB, version INTEGER)"
        )
        n = 0
        start = time.perf_counter()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            conn.execute(
                "INSERT OR REPLACE INTO kv VALUES (?, ?, ?)", (b"single/%d" % (n % 1000), BODY, n)
            )
            n += 1
        return n / (time.perf_counter() - start)
    finally:
        conn.close()


async def push(host: ak.Host, n: int, r: int) -> float:
    """32 producers' single durable sends to one push queue, to the last ack: msgs/s."""
    global all_acked
    queue = f"queue/push{r}"
    await call(host, "producer/setup", "configure", queue=queue)
    acked[0] = 0
    expected[0] = n
    all_acked = trio.Event()
    each = n // PRODUCERS
    start = time.perf_counter()
    with trio.fail_after(300):
        async with trio.open_nursery() as nursery:
            for i in range(PRODUCERS):
                send = partial(call, host, f"producer/p{r}-{i}", "sends", queue=queue, n=each)
                nursery.start_soon(send)
        await all_acked.wait()
    return n / (time.perf_counter() - start)


def huey_push(tmp: Path, n: int, r: int) -> float:
    """huey fed by 32 threads enqueuing one task at a time, one worker thread: tasks/s."""
    import logging

    from huey import SqliteHuey

    logging.getLogger("huey").setLevel(logging.ERROR)
    huey = SqliteHuey(f"gates{r}", filename=str(tmp / f"huey{r}.db"), fsync=True)
    done = [0]
    lock = threading.Lock()
    finished = threading.Event()

    @huey.task()  # type: ignore[untyped-decorator]
    def work(body: bytes) -> None:
        with lock:
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
    each = n // PRODUCERS

    def produce() -> None:
        for _ in range(each):
            work(BODY)

    try:
        start = time.perf_counter()
        threads = [threading.Thread(target=produce) for _ in range(PRODUCERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if not finished.wait(timeout=300):
            raise RuntimeError(f"huey ran only {done[0]} of {n} tasks")
        return float(n / (time.perf_counter() - start))
    finally:
        consumer.stop(graceful=True)
        huey.storage.close()


async def tail(host: ak.Host, n: int) -> list[float]:
    """[p50, p99, p99.9] of ``n`` local puts, in microseconds."""
    return percentiles(await call(host, "caller/latency", "latencies", n=n))


def percentiles(lat: list[float]) -> list[float]:
    """[p50, p99, p99.9] of latencies in seconds, in microseconds."""
    lat = sorted(lat)
    return [lat[min(len(lat) - 1, int(p * len(lat)))] * 1e6 for p in (0.5, 0.99, 0.999)]


def raw_tail(path: Path, n: int) -> list[float]:
    """[p50, p99, p99.9] of ``n`` raw sqlite3 inserts of the same rows with the shard's
    settings (WAL, ``synchronous=OFF``, no automatic checkpoint), in this thread: the tail
    SQLite and the disk give with no runtime around them."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=OFF")
        conn.execute("PRAGMA wal_autocheckpoint=0")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS kv (key BLOB PRIMARY KEY, value BLOB NOT NULL, "
            "version INTEGER NOT NULL, expires_at INTEGER, sum INTEGER) WITHOUT ROWID"
        )
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # every round starts from an empty log
        clock, out = time.perf_counter, []
        for i in range(n):
            start = clock()
            conn.execute(
                "INSERT OR REPLACE INTO kv VALUES (?, ?, ?, NULL, 0)",
                (b"lat/%d" % (i % 5000), BODY, i),
            )
            out.append(clock() - start)
        return percentiles(out)
    finally:
        conn.close()


def cpu_tail(n: int, micros: float) -> list[float]:
    """[p50, p99, p99.9] of ``n`` runs of a pure-Python loop that takes about ``micros``
    microseconds: the machine's own noise (scheduling, interrupts, the hypervisor)."""
    clock = time.perf_counter

    def spin(k: int) -> float:
        start = clock()
        x = 0
        for j in range(k):
            x += j
        return clock() - start

    k = 100
    for _ in range(20):  # size the loop to the put's p50
        k = max(1, int(k * micros / (statistics.median(spin(k) for _ in range(200)) * 1e6)))
    return percentiles([spin(k) for _ in range(n)])


async def handoff(syncer: Any, tmp: Path, n: int) -> list[float]:
    """[Syncer noop, to_thread noop, Syncer fdatasync, to_thread fdatasync, ring fdatasync],
    us per call (the ring's: nan where there is none). The fdatasync follows a write of 100
    bytes in place (the file keeps its size), as a log that has reached its size is
    rewritten."""
    path = tmp / "handoff"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    os.pwrite(fd, bytes(4096), 0)
    os.fsync(fd)

    def write_in_place() -> None:
        os.pwrite(fd, BODY, 0)
        os.fdatasync(fd)

    def noop() -> None:
        pass

    out = []
    try:
        for fn, count in ((noop, n), (write_in_place, n // 4)):
            for run in (syncer.run, trio.to_thread.run_sync):
                start = time.perf_counter()
                for _ in range(count):
                    await run(fn)
                out.append((time.perf_counter() - start) / count * 1e6)
        ring = syncer.ring
        if ring is None:
            out.append(float("nan"))
        else:
            start = time.perf_counter()
            for _ in range(n // 4):
                os.pwrite(fd, BODY, 0)
                await ring.datasync(fd)
            out.append((time.perf_counter() - start) / (n // 4) * 1e6)
    finally:
        os.close(fd)
        path.unlink()
    return out


# -- the run ---------------------------------------------------------------------------------

Results = dict[str, list[float]]


async def measure(tmp: Path, rounds: int, quick: bool, threads: bool, results: Results) -> None:
    seconds = 0.3 if quick else 3.0
    n_push = 320 if quick else 6400
    n_tail = 1000 if quick else 20_000
    files = ak.FileStorage(tmp / "data")
    if threads:
        files.syncer = Syncer(ring=False)
    fsyncs = FsyncCounter(files)
    fsyncs.install()
    host = ak.Host(app, files)
    async with host.open():
        # Warm-up: every actor and file exists, registrations are done.
        await one_queue(host, fsyncs, 0.2, -1)
        await shard_puts(host, 0.2, True, -1)
        await single_puts(host, 0.1)
        await call(host, "caller/latency", "latencies", n=100)
        await trio.sleep(0.5)
        for r in range(rounds):
            rate, per = await one_queue(host, fsyncs, seconds, r)
            results["queue_sends"].append(rate)
            results["sends_per_fsync"].append(per)
            results["append_fdatasync"].append(append_fdatasync(tmp, seconds))
            results["shard_durable"].append(await shard_puts(host, seconds, False, r))
            results["shard_local"].append(await shard_puts(host, seconds, True, r))
            results["single_durable"].append(await single_puts(host, seconds))
            results["raw_full"].append(raw_autocommit(tmp / "raw.sqlite", seconds))
            results["push"].append(await push(host, n_push, r))
            p50, p99, p999 = await tail(host, n_tail)
            results["p50_us"].append(p50)
            results["p99_us"].append(p99)
            results["p99.9_us"].append(p999)
            raw50, _, raw999 = raw_tail(tmp / "raw-tail.sqlite", n_tail)
            results["raw_p99.9/p50"].append(raw999 / raw50)
            cpu50, _, cpu999 = cpu_tail(n_tail, p50)
            results["cpu_p99.9/p50"].append(cpu999 / cpu50)
            syncer = Syncer()
            try:
                sync_noop, thread_noop, sync_fd, thread_fd, ring_fd = await handoff(
                    syncer, tmp, 200 if quick else 2000
                )
            finally:
                syncer.close()
            results["syncer_noop_us"].append(sync_noop)
            results["to_thread_noop_us"].append(thread_noop)
            results["syncer_fdatasync_us"].append(sync_fd)
            results["to_thread_fdatasync_us"].append(thread_fd)
            results["ring_fdatasync_us"].append(ring_fd)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a tiny run (smoke test)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 3)")
    parser.add_argument(
        "--threads", action="store_true", help="fdatasyncs in sync threads, not the io_uring"
    )
    args = parser.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 3)
    keys = (
        "queue_sends", "sends_per_fsync", "append_fdatasync", "shard_durable", "shard_local",
        "single_durable", "raw_full", "push", "huey", "p50_us", "p99_us", "p99.9_us",
        "raw_p99.9/p50", "cpu_p99.9/p50",
        "syncer_noop_us", "to_thread_noop_us", "syncer_fdatasync_us", "to_thread_fdatasync_us",
        "ring_fdatasync_us",
    )  # fmt: skip
    results: Results = {k: [] for k in keys}
    load_before = os.getloadavg()[0]
    BENCH_TMP.mkdir(exist_ok=True)
    try:
        with tempfile.TemporaryDirectory(dir=BENCH_TMP, prefix="gates-") as tmp:
            trio.run(measure, Path(tmp), rounds, args.quick, args.threads, results)
            n_push = 320 if args.quick else 6400
            for r in range(rounds):  # huey's consumer wants the main thread, outside trio
                results["huey"].append(huey_push(Path(tmp), n_push, r))
    finally:
        with contextlib.suppress(OSError):
            BENCH_TMP.rmdir()
    print(f"gates: {rounds} rounds (load average {load_before:.2f} before, {os.cpu_count()} cores)")
    for k, v in results.items():
        print(f"  {k:22} {spread(v)}")

    def ratio(name: str, a: str, b: str, target: float) -> None:
        pairs = [x / y for x, y in zip(results[a], results[b], strict=True)]
        med = statistics.median(pairs)
        verdict = "met" if med >= target else "MISSED"
        print(f"{name}: {a}/{b} {spread(pairs, 2)}x (target >= {target:g}x, {verdict})")

    per = statistics.median(results["sends_per_fsync"])
    print(
        f"one queue, {PRODUCERS} producers: {per:.2f} sends per fsync "
        f"(target > {TARGETS['per_fsync']:g}, {'met' if per > TARGETS['per_fsync'] else 'MISSED'})"
    )
    ratio("one queue vs the disk", "queue_sends", "append_fdatasync", 1.0)
    ratio(f"one shard, {PRODUCERS} callers", "shard_durable", "shard_local", TARGETS["shard"])
    ratio("one caller, durable put", "single_durable", "raw_full", TARGETS["single"])
    # What no design with the fsync off the event loop can beat here: the put itself (a local
    # put's p50) plus one hand-off of an fdatasync to a sync thread and back.
    # The host's own way to an fdatasync: its io_uring where it has one, else a sync thread.
    hops = [
        thread if args.threads or math.isnan(ring) else ring
        for thread, ring in zip(
            results["syncer_fdatasync_us"], results["ring_fdatasync_us"], strict=True
        )
    ]
    ceiling = [
        (1e6 / raw) / (p50 + hop)
        for raw, p50, hop in zip(results["raw_full"], results["p50_us"], hops, strict=True)
    ]
    print(
        "  ceiling here (local put p50 + the host's fdatasync of a write in place, vs raw): "
        f"{spread(ceiling, 2)}x"
    )
    ratio(f"push fed by {PRODUCERS} producers", "push", "huey", TARGETS["push"])
    tails = [b / a for a, b in zip(results["p50_us"], results["p99.9_us"], strict=True)]
    worst = max(tails)
    print(
        f"KV local put, one caller: p99.9/p50 {spread(tails, 1)}x "
        f"(target <= {TARGETS['tail']:g}x, {'met' if worst <= TARGETS['tail'] else 'MISSED'})"
    )
    print(
        f"  floors here: raw sqlite3 inserts {spread(results['raw_p99.9/p50'])}x, "
        f"a pure-Python loop of the same p50 {spread(results['cpu_p99.9/p50'])}x"
    )


if __name__ == "__main__":
    main()
