"""Instructions per actor->actor ``@rpc`` call, counted by valgrind (callgrind), for the two
paths of ``bench/rpc.py``: inline (``echo``) and through the callee's worker
(``echo_awaiting``).

Wall-clock ratios on a shared VM move by several percent from run to run; instruction counts
do not, so this is how a change to the call path is weighed (run it on both checkouts). Each
path runs twice in a fresh process, with ``--small`` and ``--large`` calls; the difference of
the two totals, divided by the difference of the calls, leaves out start-up and warm-up.
Needs valgrind (``apt-get install valgrind``); takes about a minute.

    python bench/instructions.py [--small 2000] [--large 22000] [--quick]
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _HERE:
    sys.path[0] = os.path.dirname(_HERE)

import argparse
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent


def calls(method: str, n: int) -> None:
    """In this process: ``n`` calls of ``callee/a.method`` from ``caller/a``."""
    from actorkeep.runtime.host import Host
    from actorkeep.runtime.storage import FileStorage
    from bench.rpc import actorkeep_rate, app

    async def main() -> None:
        with tempfile.TemporaryDirectory() as data:
            host = Host(app, FileStorage(data))
            async with host.open():
                await actorkeep_rate(host, n, method)

    trio.run(main)


def counted(method: str, n: int) -> int:
    """Instructions of a whole process that makes ``n`` calls."""
    done = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            __file__,
            "--run",
            method,
            str(n),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise RuntimeError(f"no count in valgrind's output:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=2000, help="calls of the first run")
    parser.add_argument("--large", type=int, default=22000, help="calls of the second run")
    parser.add_argument("--quick", action="store_true", help="100 and 300 calls (smoke test)")
    parser.add_argument("--run", nargs=2, metavar=("METHOD", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        calls(args.run[0], int(args.run[1]))
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("bench/instructions.py needs valgrind (apt-get install valgrind)")
    if args.quick:
        args.small, args.large = 100, 300
    if args.large <= args.small:
        raise SystemExit("--large must be more than --small")
    for path, method in (("inline", "echo"), ("worker", "echo_awaiting")):
        small, large = counted(method, args.small), counted(method, args.large)
        per_call = (large - small) / (args.large - args.small)
        print(f"rpc, {path} path: {per_call:,.0f} instructions per call")


if __name__ == "__main__":
    main()
