"""The cluster's durable point, at the store (decision 0016): fenced commits to a real PostgreSQL
started for the run, side by side.

1. ``raw``: PostgreSQL's own single-row insert with the epoch check (``INSERT ... SELECT ...
   WHERE`` the lease row has the epoch), autocommit, one writer: writes/s and p50 latency.
2. ``store``: ``ClusterStore.commit`` of one write at a time (the check under a share lock,
   then the row), one writer. Target (of the cluster issue, here at the store only): p50 within
   2x of ``raw``'s.
3. ``group``: 32 writers, each awaiting one write at a time, through ``Committer`` (one
   transaction a batch, from a sync thread). Target: at least 5x ``raw``'s writes/s.
4. ``beside``: ``store`` again while another thread of the same store compacts an 8 MiB actor
   over and over (an image shipped whole, as ``compact`` does every 64 batches of an actor):
   writes/s and p99 against ``store``'s. Commits have a connection of their own (decision
   0016), so they should not wait for the image; no target.

Each write carries 4 KiB (one page of frames), sent in binary by every side. The server runs
with ``fsync=on`` and ``synchronous_commit=on`` (its defaults) on this machine's disk, under
``.bench-tmp/``. Every side runs once per round, rounds interleave, min/median/max are printed.

    python bench/cluster_commit.py [--quick] [--rounds N]
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _HERE:
    sys.path[0] = os.path.dirname(_HERE)  # bench/queue.py would shadow the stdlib's queue

import argparse
import contextlib
import shutil
import statistics
import tempfile
import threading
import time
from itertools import count
from pathlib import Path

import psycopg
import trio

from actorkeep.cluster import ClusterStore, Write, create
from actorkeep.cluster.committer import Committer
from actorkeep.cluster.nonblocking import NonblockingCommits
from bench.driver import spread
from tests.pg import running_server

WRITERS = 32
PAGE = bytes(range(256)) * 16
IMAGE = bytes(range(256)) * (32 << 10)  # 8 MiB
BENCH_TMP = Path(__file__).resolve().parent.parent / ".bench-tmp"


def raw(conninfo: str, epoch: int, seconds: float, seqs: count[int]) -> tuple[float, float]:
    """[writes/s, p50 ms] of single-row inserts with the epoch check, autocommit."""
    lat = []
    with psycopg.connect(conninfo, autocommit=True) as conn:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            start = time.perf_counter()
            cur = conn.execute(
                "INSERT INTO actorkeep_frames (address, seq, partition, epoch, data) "
                "SELECT %s, %s, 0, %s, %b WHERE EXISTS (SELECT 1 FROM actorkeep_leases "
                "WHERE partition = 0 AND epoch = %s)",
                ("raw/r", next(seqs), epoch, PAGE, epoch),
            )
            assert cur.rowcount == 1
            lat.append(time.perf_counter() - start)
    return len(lat) / sum(lat), statistics.median(lat) * 1e3


def one_by_one(
    store: ClusterStore, epoch: int, seconds: float, seqs: count[int]
) -> tuple[float, float, float]:
    """[writes/s, p50 ms, p99 ms] of ``ClusterStore.commit`` of one write at a time."""
    lat = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        store.commit([Write(0, epoch, "store/s", next(seqs), PAGE)])
        lat.append(time.perf_counter() - start)
    lat.sort()
    return len(lat) / sum(lat), statistics.median(lat) * 1e3, lat[int(0.99 * (len(lat) - 1))] * 1e3


def beside_compactions(
    store: ClusterStore, epochs: dict[int, int], seconds: float, seqs: count[int]
) -> tuple[float, float, int]:
    """[writes/s, p99 ms, compactions] of ``one_by_one`` while another thread compacts."""
    stop = threading.Event()
    compactions = [0]

    def compacting() -> None:
        while not stop.is_set():
            store.compact(1, epochs[1], "big/b", next(seqs), IMAGE)
            compactions[0] += 1

    thread = threading.Thread(target=compacting)
    thread.start()
    try:
        rate, _, p99 = one_by_one(store, epochs[0], seconds, seqs)
    finally:
        stop.set()
        thread.join()
    return rate, p99, compactions[0]


async def group(
    store: ClusterStore, epochs: dict[int, int], seconds: float, seqs: count[int]
) -> tuple[float, float]:
    """[writes/s, writes per transaction] of 32 writers through the Committer, committing as a
    host does (on the event loop: ``NonblockingCommits``)."""
    done = [0]
    commits = NonblockingCommits(store.commits, trio.to_thread.run_sync)
    async with trio.open_nursery() as nursery:
        committer = Committer(commits.commit, nursery.start_soon)
        end = trio.current_time() + seconds

        async def writer(i: int) -> None:
            part = i % len(epochs)
            while trio.current_time() < end:
                await committer.commit(Write(part, epochs[part], f"group/g{i}", next(seqs), PAGE))
                done[0] += 1

        start = time.perf_counter()
        async with trio.open_nursery() as writers:
            for i in range(WRITERS):
                writers.start_soon(writer, i)
        elapsed = time.perf_counter() - start
    return done[0] / elapsed, committer.writes / max(1, committer.transactions)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a tiny run (smoke test)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 3)")
    args = parser.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 3)
    seconds = 0.5 if args.quick else 3.0
    results: dict[str, list[float]] = {
        k: []
        for k in (
            "raw/s", "raw p50 ms", "store/s", "store p50 ms", "store p99 ms", "group/s",
            "per txn", "beside/s", "beside p99 ms", "compactions",
        )
    }  # fmt: skip
    BENCH_TMP.mkdir(exist_ok=True)
    root = Path(tempfile.mkdtemp(dir=BENCH_TMP, prefix="pg-"))
    try:
        with running_server(root) as server:
            create(server.conninfo, 16)
            store = ClusterStore(server.conninfo, "bench", clock=time.monotonic)
            epochs = {}
            for p in range(16):
                lease = store.acquire(p, 3600.0, 1.0)
                assert lease is not None
                epochs[p] = lease.epoch
            seqs = count(1)
            for _ in range(rounds):
                rate, p50 = raw(server.conninfo, epochs[0], seconds, seqs)
                results["raw/s"].append(rate)
                results["raw p50 ms"].append(p50)
                rate, p50, p99 = one_by_one(store, epochs[0], seconds, seqs)
                results["store/s"].append(rate)
                results["store p50 ms"].append(p50)
                results["store p99 ms"].append(p99)
                rate, per = trio.run(group, store, epochs, seconds, seqs)
                results["group/s"].append(rate)
                results["per txn"].append(per)
                rate, p99, compactions = beside_compactions(store, epochs, seconds, seqs)
                results["beside/s"].append(rate)
                results["beside p99 ms"].append(p99)
                results["compactions"].append(compactions)
            store.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
        with contextlib.suppress(OSError):
            BENCH_TMP.rmdir()
    print(f"cluster commits: {rounds} rounds of {seconds:g} s a side ({os.cpu_count()} cores)")
    for k, v in results.items():
        print(f"  {k:14} {spread(v, 2)}")
    latency = [s / r for s, r in zip(results["store p50 ms"], results["raw p50 ms"], strict=True)]
    speedup = [g / r for g, r in zip(results["group/s"], results["raw/s"], strict=True)]
    lat_ok = statistics.median(latency) <= 2.0
    up_ok = statistics.median(speedup) >= 5.0
    verdict = {True: "met", False: "MISSED"}
    print(f"one write: store p50 / raw p50 {spread(latency, 2)}x (target <= 2x, {verdict[lat_ok]})")
    print(
        f"group commit, {WRITERS} writers: group/raw {spread(speedup, 2)}x "
        f"(target >= 5x, {verdict[up_ok]})"
    )
    kept = [b / a for b, a in zip(results["beside/s"], results["store/s"], strict=True)]
    print(
        f"one write at a time beside compactions of an 8 MiB actor: beside/store "
        f"{spread(kept, 2)}x the writes/s, p99 {spread(results['beside p99 ms'], 1)} ms "
        f"against {spread(results['store p99 ms'], 1)} ms (no target)"
    )


if __name__ == "__main__":
    main()
