"""Durable writes: 32 actors at once vs one actor alone vs raw sqlite3 with synchronous=FULL.

actorkeep: an ``@rpc`` method inserts a 100-byte row with ``await self.sql.exec_durable(...)``
in a loop until a deadline, on a real ``Host`` over ``FileStorage`` (the fsync runs in a
worker thread). Measured with 32 actors writing concurrently (total writes/s) and with one
actor alone. Baseline: raw ``sqlite3`` in one thread, WAL, ``PRAGMA synchronous=FULL``,
autocommit, inserting the same rows one by one. Everything lives in a temporary directory under
``.bench-tmp/`` in the repository (the same disk as the project), removed afterwards.

The three configurations alternate over several rounds (their order reversed every other
round); printed are the ratios of each round's pairs, min / median / max. Target: 32 actors >
1x one actor alone (fsyncs of different actors overlap in worker threads). One actor alone
against one raw writer is printed beside it, like for like, without a target
(docs/reference.md §12 asks >= 0.5x of it for the related KV durable put, bench/kv.py).

    python bench/durable.py [--quick]
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
import os
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

import trio

import actorkeep as ak
from actorkeep import codec
from bench.driver import spread

ACTORS = 32
TARGET_OVERLAP = 1.0  # 32 actors together must beat one actor alone
REFERENCE_RAW = 0.5  # docs/reference.md §12, KV durable put vs raw sqlite3 synchronous=FULL
DRIVER = "bench/driver"
BENCH_TMP = Path(__file__).resolve().parent.parent / ".bench-tmp"
ROW = bytes(range(100))
INSERT = "INSERT INTO rows (v) VALUES (?)"
CREATE = "CREATE TABLE IF NOT EXISTS rows (id INTEGER PRIMARY KEY, v BLOB NOT NULL)"

app = ak.App()


@app.actor("writer")
class Writer(ak.Actor):
    """Inserts rows durably, one ``exec_durable`` per row."""

    async def setup(self) -> None:
        self.sql.exec(CREATE)

    @ak.rpc
    async def write(self, until: float, limit: int) -> int:
        """Insert rows until the host clock reaches ``until`` or ``limit`` rows; their count."""
        n = 0
        while n < limit and (n == 0 or self.now() < until):
            await self.sql.exec_durable(INSERT, (ROW,))
            n += 1
        return n


async def call_write(host: ak.Host, address: str, until: float, limit: int) -> int:
    """Ask one writer actor to write; the number of rows it made durable."""
    resp = await host.call(
        DRIVER,
        (DRIVER,),
        address,
        "POST",
        "/_rpc/write",
        codec.pack({"until": until, "limit": limit}),
        {"content-type": codec.MSGPACK},
        None,
    )
    if resp.status != 200:
        raise RuntimeError(f"{address} failed: {resp.status} {resp.body[:300]!r}")
    return int(codec.decode_result(resp.body, "msgpack"))


async def actors_rate(host: ak.Host, actors: int, seconds: float, limit: int) -> float:
    """``actors`` writers at once for about ``seconds``; total durable writes per second."""
    counts = [0] * actors
    until = host.clock.now() + seconds

    async def one(i: int) -> None:
        counts[i] = await call_write(host, f"writer/w{i}", until, limit)

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(actors):
            nursery.start_soon(one, i)
    return sum(counts) / (time.perf_counter() - start)


def open_raw(path: Path) -> sqlite3.Connection:
    """The baseline's connection: WAL, synchronous=FULL, autocommit."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute(CREATE)
    return conn


def raw_rate(conn: sqlite3.Connection, seconds: float, limit: int) -> float:
    """Insert rows one by one in this thread for about ``seconds``; writes per second."""
    start = time.perf_counter()
    until = start + seconds
    n = 0
    while n < limit and (n == 0 or time.perf_counter() < until):
        conn.execute(INSERT, (ROW,))
        n += 1
    return n / (time.perf_counter() - start)


async def measure(
    tmp: Path, rounds: int, seconds: float, limit: int
) -> tuple[list[float], list[float], list[float]]:
    """Alternate 32 actors, one actor and raw sqlite3 for ``rounds`` rounds."""
    many: list[float] = []
    one: list[float] = []
    raw: list[float] = []
    conn = open_raw(tmp / "raw.sqlite")
    host = ak.Host(app, ak.FileStorage(tmp / "data"))
    try:
        async with host.open():
            # Warm-up: create every actor's file (and fsync its new directories) up front.
            await actors_rate(host, ACTORS, 0.0, 1)
            raw_rate(conn, 0.0, 1)
            for r in range(rounds):
                sides = ["many", "one", "raw"]
                for side in sides if r % 2 == 0 else sides[::-1]:
                    if side == "many":
                        many.append(await actors_rate(host, ACTORS, seconds, limit))
                    elif side == "one":
                        one.append(await actors_rate(host, 1, seconds, limit))
                    else:
                        raw.append(raw_rate(conn, seconds, limit))
    finally:
        conn.close()
    return many, one, raw


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, run the three configurations, print both ratios."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a tiny run (smoke test)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of each configuration")
    parser.add_argument("--seconds", type=float, default=None, help="length of one measurement")
    args = parser.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 5)
    seconds = args.seconds or (0.1 if args.quick else 1.5)
    limit = 200 if args.quick else 1_000_000  # rows per writer per measurement, at most

    load_before = os.getloadavg()[0]
    BENCH_TMP.mkdir(exist_ok=True)
    try:
        with tempfile.TemporaryDirectory(dir=BENCH_TMP, prefix="durable-") as tmp:
            many, one, raw = trio.run(measure, Path(tmp), rounds, seconds, limit)
    finally:
        with contextlib.suppress(OSError):
            BENCH_TMP.rmdir()  # only if empty: another benchmark may be using it

    overlap = [a / b for a, b in zip(many, one, strict=True)]
    vs_raw = [a / b for a, b in zip(one, raw, strict=True)]
    print(
        f"durable: {rounds} x {seconds} s per configuration, alternating; writes/s and the "
        f"ratios of each round's pair, min / median / max (load average {load_before:.2f} "
        f"before, {os.cpu_count()} cores)"
    )
    print(f"  {ACTORS} actors:      {spread(many, 0)}")
    print(f"  one actor:      {spread(one, 0)}")
    print(f"  raw sqlite3:    {spread(raw, 0)}")
    ratio = statistics.median(overlap)
    print(
        f"durable: {ACTORS} actors vs one actor alone, ratio {spread(overlap, 2)}x "
        f"(target > {TARGET_OVERLAP:g}x, {'met' if ratio > TARGET_OVERLAP else 'MISSED'})"
    )
    print(
        f"durable: one actor alone vs one raw sqlite3 synchronous=FULL writer, ratio "
        f"{spread(vs_raw, 2)}x (no target here; docs/reference.md §12 asks >= "
        f"{REFERENCE_RAW}x for the KV durable put, bench/kv.py)"
    )


if __name__ == "__main__":
    main()
