"""Actor->actor ``@rpc`` round trip in-process vs a raw trio memory-channel round trip.

actorkeep: inside one event of ``caller/a``, a loop of
``await self.actors.ref("callee/a").echo(x=i)`` (default call timeout) on a real ``Host`` over
``FileStorage`` in a temporary directory, under the real trio clock.

Baseline: a client task sends ``(request, reply_channel)`` over an unbuffered
``trio.open_memory_channel(0)`` to a server task, which answers on the client's (reused,
unbuffered) reply channel; the client waits for each reply before sending the next request.

Both run in the same ``trio.run``, alternating, and the median of several repetitions is
reported for each. Target (docs/reference.md §12): actorkeep >= 1.5x the baseline's rate.

    python bench/rpc.py [--quick]
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
import gc
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

import actorkeep as ak
from actorkeep import codec

TARGET = 1.5
DRIVER = "bench/driver"  # the calling identity of the benchmark itself (needs no class)
BENCH_TMP = Path(__file__).resolve().parent.parent / ".bench-tmp"

app = ak.App()


@app.actor("callee")
class Callee(ak.Actor):
    """Answers ``echo`` with its argument."""

    @ak.rpc
    async def echo(self, x: int) -> int:
        return x


@app.actor("caller")
class Caller(ak.Actor):
    """Calls ``callee/a`` ``n`` times in one event and returns the seconds that took."""

    @ak.rpc
    async def run(self, n: int) -> float:
        ref = self.actors.ref("callee/a")
        start = time.perf_counter()
        for i in range(n):
            if await ref.echo(x=i) != i:
                raise AssertionError("echo returned a different value")
        return time.perf_counter() - start


async def actorkeep_rate(host: ak.Host, n: int) -> float:
    """One repetition: ``n`` actor->actor round trips inside one event; calls per second."""
    resp = await host.call(
        DRIVER,
        (DRIVER,),
        "caller/a",
        "POST",
        "/_rpc/run",
        codec.pack({"n": n}),
        {"content-type": codec.MSGPACK},
        None,
    )
    if resp.status != 200:
        raise RuntimeError(f"caller/a failed: {resp.status} {resp.body[:300]!r}")
    elapsed = codec.decode_result(resp.body, "msgpack")
    return n / float(elapsed)


Request = tuple[int, trio.MemorySendChannel[int]]


async def echo_server(requests: trio.MemoryReceiveChannel[Request]) -> None:
    """The baseline's server task: answer each request on the channel it came with."""
    async for x, reply in requests:
        await reply.send(x)


async def channel_rate(requests: trio.MemorySendChannel[Request], n: int) -> float:
    """One repetition: ``n`` memory-channel round trips; round trips per second."""
    reply_send, reply_recv = trio.open_memory_channel[int](0)
    start = time.perf_counter()
    for i in range(n):
        await requests.send((i, reply_send))
        if await reply_recv.receive() != i:
            raise AssertionError("echo returned a different value")
    return n / (time.perf_counter() - start)


async def measure(n: int, reps: int, tmp: Path) -> tuple[list[float], list[float]]:
    """Alternate the two sides ``reps`` times after one warm-up run of each."""
    ak_rates: list[float] = []
    base_rates: list[float] = []
    host = ak.Host(app, ak.FileStorage(tmp))
    async with host.open(), trio.open_nursery() as nursery:
        req_send, req_recv = trio.open_memory_channel[Request](0)
        nursery.start_soon(echo_server, req_recv)
        sides: list[tuple[Callable[[], Awaitable[float]], list[float]]] = [
            (lambda: actorkeep_rate(host, n), ak_rates),
            (lambda: channel_rate(req_send, n), base_rates),
        ]
        for fn, _ in sides:  # warm-up: opens the actors' files, fills caches
            await fn()
        for _ in range(reps):
            for fn, out in sides:
                gc.collect()
                out.append(await fn())
        nursery.cancel_scope.cancel()
    return ak_rates, base_rates


def profile(n: int, tmp: Path) -> None:
    """Print where one actorkeep repetition spends its time (cProfile, by own time)."""
    import cProfile
    import pstats

    async def one() -> None:
        host = ak.Host(app, ak.FileStorage(tmp))
        async with host.open():
            await actorkeep_rate(host, 100)  # opens the actors' files
            with cProfile.Profile() as prof:
                await actorkeep_rate(host, n)
        pstats.Stats(prof).strip_dirs().sort_stats("tottime").print_stats(25)

    trio.run(one)


def report(ak_rates: list[float], base_rates: list[float]) -> str:
    """The result line: both medians and their ratio against the target."""
    a, b = statistics.median(ak_rates), statistics.median(base_rates)
    ratio = a / b
    verdict = "met" if ratio >= TARGET else "MISSED"
    return (
        f"rpc: actorkeep {a:,.0f} calls/s, baseline {b:,.0f} round trips/s, "
        f"ratio {ratio:.2f}x (target >= {TARGET}x, {verdict})"
    )


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, run both sides, print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a tiny run (smoke test)")
    parser.add_argument("--calls", type=int, default=None, help="round trips per repetition")
    parser.add_argument("--reps", type=int, default=None, help="repetitions of each side")
    parser.add_argument(
        "--profile", action="store_true", help="also print a cProfile of one actorkeep repetition"
    )
    args = parser.parse_args(argv)
    n = args.calls or (300 if args.quick else 20_000)
    reps = args.reps or (2 if args.quick else 7)

    load_before = os.getloadavg()[0]
    BENCH_TMP.mkdir(exist_ok=True)
    try:
        with tempfile.TemporaryDirectory(dir=BENCH_TMP, prefix="rpc-") as tmp:
            ak_rates, base_rates = trio.run(measure, n, reps, Path(tmp))
            print(
                f"rpc: {n:,} round trips x {reps} repetitions each, median reported "
                f"(load average {load_before:.2f} before, {os.cpu_count()} cores)"
            )
            print(f"  actorkeep calls/s:      {_spread(ak_rates)}")
            print(f"  baseline round trips/s: {_spread(base_rates)}")
            print(report(ak_rates, base_rates), flush=True)
            if args.profile:
                profile(n, Path(tmp) / "profile")
    finally:
        with contextlib.suppress(OSError):
            BENCH_TMP.rmdir()  # only if empty: another benchmark may be using it


def _spread(rates: list[float]) -> str:
    return " ".join(f"{r:,.0f}" for r in rates)


if __name__ == "__main__":
    main()
