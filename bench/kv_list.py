"""KV listing: does the cost grow linearly with the keys listed?

One ``Host`` over ``FileStorage`` with 16 KV shards holds 10,000 keys under ``small/`` and
100,000 under ``big/`` (local puts). An actor lists each prefix whole through
``ak.kv.Client``, in pages of 100 (the default) and of 1,000; each round times the small and
the big listing back to back, alternating which goes first; the small listing runs 10 times in
a row and counts as their mean, so that both sides of a pair last about as long (a small
listing alone took 0.05 s, and a pause of the machine decided its round). Printed: the
seconds of each and the ratio big / small of each round, min / median / max. Target (issue
15): at most 12x for 10x the keys (a page fetched a full page from every shard before:
20-31x).

    python bench/kv_list.py [--quick]
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
import statistics
import tempfile
import time
from pathlib import Path

import trio

import actorkeep as ak
import shards
from bench.driver import call, spread

TARGET = 12.0
SHARDS = 16
BENCH_TMP = Path(__file__).resolve().parent.parent / ".bench-tmp"

app = ak.App()
app.mount(shards.KVShard, "kv", access="internal")
kv = ak.kv.Client("kv", shards=SHARDS)


@app.actor("lister")
class Lister(ak.Actor):
    """Fills a prefix and lists it whole."""

    @ak.rpc
    async def fill(self, prefix: str, n: int) -> None:
        for i in range(n):
            await kv.put(f"{prefix}{i:07d}", b"v" * 32, local=True)

    @ak.rpc
    async def list_all(self, prefix: str, limit: int) -> int:
        count, after = 0, None
        while True:
            page = await kv.list(prefix, after=after, limit=limit)
            count += len(page.entries)
            if page.cursor is None:
                return count
            after = page.cursor


async def timed_listing(host: ak.Host, prefix: str, keys: int, limit: int, times: int = 1) -> float:
    """Seconds one whole listing of ``prefix`` takes, the mean of ``times`` in a row."""
    t0 = time.perf_counter()
    for _ in range(times):
        listed = await call(host, "lister/a", "list_all", prefix=prefix, limit=limit)
        assert listed == keys, (prefix, listed)
    return (time.perf_counter() - t0) / times


async def run(quick: bool, tmp: Path) -> None:
    small, big = (500, 5_000) if quick else (10_000, 100_000)
    rounds = 1 if quick else 7
    async with ak.testing.open_host(app, tmp, storage=ak.FileStorage(tmp)) as test_host:
        host = test_host.host
        await call(host, "lister/a", "fill", prefix="small/", n=small)
        await call(host, "lister/a", "fill", prefix="big/", n=big)
        print(
            f"kv list: {small:,} and {big:,} keys over {SHARDS} shards, {rounds} rounds, "
            "min / median / max"
        )
        for limit in (100, 1000):
            times: dict[str, list[float]] = {"small": [], "big": []}
            ratios = []
            for r in range(rounds):
                order = [("small", small), ("big", big)]
                if r % 2:
                    order.reverse()
                took = {}
                for name, keys in order:
                    # The small listing 10 times in a row: each side of a pair then lasts
                    # about as long, so a pause of the machine weighs on both alike.
                    times_ = big // small if name == "small" else 1
                    took[name] = await timed_listing(host, f"{name}/", keys, limit, times_)
                    times[name].append(took[name])
                ratios.append(took["big"] / took["small"])
            ratio = statistics.median(ratios)
            verdict = "met" if ratio <= TARGET else "MISSED"
            print(
                f"  pages of {limit}: {small:,} keys {spread(times['small'], 3)} s, "
                f"{big:,} keys {spread(times['big'], 3)} s"
            )
            print(
                f"kv list, pages of {limit}: {big // small}x the keys, ratio "
                f"{spread(ratios, 2)}x the time (target <= {TARGET:g}x, {verdict})"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny run (smoke test)")
    args = parser.parse_args()
    BENCH_TMP.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=BENCH_TMP, prefix="kv-list-") as tmp:
        trio.run(run, args.quick, Path(tmp))


if __name__ == "__main__":
    main()
