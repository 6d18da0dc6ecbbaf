"""Actor->actor ``@rpc`` round trip in-process vs a raw trio memory-channel round trip, on
both of the host's paths.

actorkeep: inside one event of ``caller/a``, a loop of
``await self.actors.ref("callee/a").echo(x=i)`` (default call timeout) on a real ``Host`` over
``FileStorage`` in a temporary directory, under the real trio clock. Two callees:

- inline: ``echo`` returns at once, so the host runs it in the caller's task (no task switch);
- worker: ``echo_awaiting`` first awaits ``trio.lowlevel.checkpoint()``, as a callee that does
  real work (a call, a sync) would, so the event runs in the callee's own task.

Baseline: a client task sends ``(request, reply_channel)`` over an unbuffered
``trio.open_memory_channel(0)`` to a server task, which answers on the client's (reused,
unbuffered) reply channel; the client waits for each reply before sending the next request.
Against the worker path the server also awaits ``trio.lowlevel.checkpoint()`` before it
answers (the same work as the callee's).

All sides run in the same ``trio.run``, alternating, several repetitions; printed are each
side's rates and the ratio of each repetition's pair, min / median / max. Targets (issue 15):
inline >= 2.5x, worker >= 1.0x the baseline's rate.

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
from bench.driver import spread

TARGETS = {"inline": 2.5, "worker": 1.0}
DRIVER = "bench/driver"  # the calling identity of the benchmark itself (needs no class)
BENCH_TMP = Path(__file__).resolve().parent.parent / ".bench-tmp"

app = ak.App()


@app.actor("callee")
class Callee(ak.Actor):
    """Answers ``echo`` with its argument."""

    @ak.rpc
    async def echo(self, x: int) -> int:
        return x

    @ak.rpc
    async def echo_awaiting(self, x: int) -> int:
        await trio.lowlevel.checkpoint()
        return x


@app.actor("caller")
class Caller(ak.Actor):
    """Calls ``callee/a`` ``n`` times in one event and returns the seconds that took."""

    @ak.rpc
    async def run(self, n: int, method: str = "echo") -> float:
        echo = getattr(self.actors.ref("callee/a"), method)
        start = time.perf_counter()
        for i in range(n):
            if await echo(x=i) != i:
                raise AssertionError("echo returned a different value")
        return time.perf_counter() - start


async def actorkeep_rate(host: ak.Host, n: int, method: str = "echo") -> float:
    """One repetition: ``n`` actor->actor round trips inside one event; calls per second."""
    resp = await host.call(
        DRIVER,
        (DRIVER,),
        "caller/a",
        "POST",
        "/_rpc/run",
        codec.pack({"n": n, "method": method}),
        {"content-type": codec.MSGPACK},
        None,
    )
    if resp.status != 200:
        raise RuntimeError(f"caller/a failed: {resp.status} {resp.body[:300]!r}")
    elapsed = codec.decode_result(resp.body, "msgpack")
    return n / float(elapsed)


Request = tuple[int, trio.MemorySendChannel[int]]


async def echo_server(requests: trio.MemoryReceiveChannel[Request], awaiting: bool) -> None:
    """The baseline's server task: answer each request on the channel it came with (after a
    ``trio.lowlevel.checkpoint()`` if ``awaiting``)."""
    async for x, reply in requests:
        if awaiting:
            await trio.lowlevel.checkpoint()
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


Rates = dict[str, list[float]]


async def measure(n: int, reps: int, tmp: Path) -> Rates:
    """Alternate the four sides ``reps`` times after one warm-up run of each."""
    rates: Rates = {"inline": [], "inline base": [], "worker": [], "worker base": []}
    host = ak.Host(app, ak.FileStorage(tmp))
    async with host.open(), trio.open_nursery() as nursery:
        plain_send, plain_recv = trio.open_memory_channel[Request](0)
        awaiting_send, awaiting_recv = trio.open_memory_channel[Request](0)
        nursery.start_soon(echo_server, plain_recv, False)
        nursery.start_soon(echo_server, awaiting_recv, True)
        sides: dict[str, Callable[[], Awaitable[float]]] = {
            "inline": lambda: actorkeep_rate(host, n, "echo"),
            "inline base": lambda: channel_rate(plain_send, n),
            "worker": lambda: actorkeep_rate(host, n, "echo_awaiting"),
            "worker base": lambda: channel_rate(awaiting_send, n),
        }
        for fn in sides.values():  # warm-up: opens the actors' files, fills caches
            await fn()
        for r in range(reps):
            order = list(sides.items())
            for name, fn in order if r % 2 == 0 else order[::-1]:
                gc.collect()
                rates[name].append(await fn())
        nursery.cancel_scope.cancel()
    return rates


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


def report(rates: Rates, path: str) -> str:
    """The result line of one path: the medians and the ratios of the pairs."""
    ours, base = rates[path], rates[f"{path} base"]
    ratios = [a / b for a, b in zip(ours, base, strict=True)]
    ratio = statistics.median(ratios)
    target = TARGETS[path]
    verdict = "met" if ratio >= target else "MISSED"
    return (
        f"rpc, {path} path: actorkeep {statistics.median(ours):,.0f} calls/s, baseline "
        f"{statistics.median(base):,.0f} round trips/s, ratio {spread(ratios, 2)}x "
        f"(target >= {target}x, {verdict})"
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
            rates = trio.run(measure, n, reps, Path(tmp))
            print(
                f"rpc: {n:,} round trips x {reps} repetitions each, min / median / max "
                f"(load average {load_before:.2f} before, {os.cpu_count()} cores)"
            )
            for name, side in rates.items():
                print(f"  {name + ':':<13} {spread(side, 0)} per second")
            for path in TARGETS:
                print(report(rates, path), flush=True)
            plain = [a / b for a, b in zip(rates["worker"], rates["inline base"], strict=True)]
            print(
                f"rpc, worker path against the plain round trip (its server does not await): "
                f"ratio {spread(plain, 2)}x (no target: the callee does one more pass of "
                f"the scheduler than that server)"
            )
            if args.profile:
                profile(n, Path(tmp) / "profile")
    finally:
        with contextlib.suppress(OSError):
            BENCH_TMP.rmdir()  # only if empty: another benchmark may be using it


if __name__ == "__main__":
    main()
