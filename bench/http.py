"""Outside HTTP requests to an ``@rpc`` method against the JSON handler a Python user would
otherwise write: Starlette on uvicorn, under wrk.

The sides, each a server process of its own on 127.0.0.1, all answering
``POST /bench/hello/_rpc/hello`` with the JSON body ``{}``:

- actorkeep: ``actorkeep serve bench.http:app`` as a user runs it (its defaults: a connection
  is closed after 1,000 requests and wrk reconnects); the request reaches ``@rpc hello`` of
  the actor ``bench/hello``, which answers the JSON string ``"hello"``;
- starlette: a Starlette route that reads the body, parses it as JSON and answers
  ``JSONResponse("hello")``, on uvicorn with h11 and asyncio (the target's baseline);
- hypercorn: a bare hello-world ASGI app (reads the body, answers ``hello``) on hypercorn's
  trio worker;
- uvicorn-fast: the Starlette route on uvicorn with httptools and uvloop, when uvloop is
  installed (shown, no target).

wrk (one thread) drives each side in turn at 1, 16 and 64 keep-alive connections; each round
visits the sides in a rotated order, so every pair is measured close in time. Printed per
connection count: each side's requests/s and p99 latency (min / median / max over the
rounds) and the ratio actorkeep / starlette of each round's pair. Targets (issue 15): the
median ratio at least 1.0 at every connection count, and actorkeep's median p99 no worse than
starlette's.

    python bench/http.py [--quick] [--rounds N] [--seconds S]
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
import importlib.util
import json
import re
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import trio

import actorkeep as ak
from bench.driver import spread
from bench.procs import LOOPBACK, free_port, stop_process

TARGET = 1.0
CONNS = (1, 16, 64)
REPO = Path(__file__).resolve().parent.parent
BENCH_TMP = REPO / ".bench-tmp"
PATH = "/bench/hello/_rpc/hello"
BODY = "{}"
WRK_SCRIPT = f"""
wrk.method = "POST"
wrk.body = '{BODY}'
wrk.headers["Content-Type"] = "application/json"
"""

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

app = ak.App()


@app.actor("bench")
class Hello(ak.Actor):
    """The actorkeep side: a trivial ``@rpc`` method."""

    @ak.rpc
    async def hello(self) -> str:
        return "hello"


async def bare_app(scope: Scope, receive: Receive, send: Send) -> None:
    """The hypercorn side: a hello-world ASGI 3 app (it reads the request body, as the others
    do)."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    while True:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            break
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/plain"), (b"content-length", b"5")],
        }
    )
    await send({"type": "http.response.body", "body": b"hello"})


def starlette_app() -> Any:
    """The starlette side: the same JSON handler, written as a Starlette user would."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def hello(request: Request) -> JSONResponse:
        json.loads(await request.body())
        return JSONResponse("hello")

    return Starlette(routes=[Route(PATH, hello, methods=["POST"])])


# -- server processes ------------------------------------------------------------------------


SIDES = ("actorkeep", "starlette", "hypercorn", "uvicorn-fast")


def available_sides() -> list[str]:
    """The sides this machine can run: uvicorn-fast only with uvloop and httptools."""
    fast = all(importlib.util.find_spec(m) for m in ("uvloop", "httptools"))
    return [s for s in SIDES if s != "uvicorn-fast" or fast]


def serve(kind: str, port: int) -> None:
    """Serve a baseline until SIGTERM/SIGINT."""
    if kind in ("starlette", "uvicorn-fast"):
        import uvicorn

        fast = kind == "uvicorn-fast"
        config = uvicorn.Config(
            starlette_app(),
            host=LOOPBACK,
            port=port,
            http="httptools" if fast else "h11",
            loop="uvloop" if fast else "asyncio",
            access_log=False,
            log_level="warning",
        )
        uvicorn.Server(config).run()
        return
    trio.run(_serve_hypercorn, port)


async def _serve_hypercorn(port: int) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:

        async def until_signal() -> None:
            async for _ in signals:
                return

        from hypercorn.config import Config
        from hypercorn.trio import serve as hypercorn_serve

        config = Config()
        config.bind = [f"{LOOPBACK}:{port}"]
        config.accesslog = None
        config.errorlog = None
        await hypercorn_serve(cast(Any, bare_app), config, shutdown_trigger=until_signal)


@dataclass
class Server:
    """A server process and the port it listens on."""

    kind: str
    port: int
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}{PATH}"


def start_server(kind: str, data: Path) -> Server:
    """Start ``actorkeep serve`` or ``python bench/http.py --serve KIND``; wait until it
    answers."""
    port = free_port()
    if kind == "actorkeep":
        command = [sys.executable, "-m", "actorkeep", "serve", "bench.http:app"]
        command += ["--data", str(data), "--host", LOOPBACK, "--port", str(port)]
    else:
        command = [sys.executable, __file__, "--serve", kind, "--port", str(port)]
    proc = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL if kind == "actorkeep" else None,  # its start-up log
        cwd=REPO,
    )
    server = Server(kind, port, proc)
    deadline = time.monotonic() + 30.0
    request = urllib.request.Request(server.url, data=BODY.encode(), method="POST")
    request.add_header("content-type", "application/json")
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{kind} server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(request, timeout=5) as resp:
                if resp.status == 200:
                    return server
        except OSError:
            pass
        if time.monotonic() > deadline:
            stop_process(proc)
            raise RuntimeError(f"{kind} server did not answer on port {port}")
        time.sleep(0.05)


# -- wrk ---------------------------------------------------------------------------------------


@dataclass
class Run:
    """What one wrk run measured."""

    rate: float  # requests per second
    p99_ms: float


_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def wrk(url: str, script: Path, conns: int, seconds: int) -> Run:
    """One wrk run (whole seconds: wrk takes no fraction); fails on any socket error or
    non-2xx answer."""
    out = subprocess.run(
        ["wrk", "-t1", f"-c{conns}", f"-d{seconds}s", "--latency", "-s", str(script), url],
        capture_output=True,
        text=True,
        check=True,
        timeout=seconds + 60,
    ).stdout
    if "Non-2xx" in out or "Socket errors" in out:
        raise RuntimeError(f"wrk saw errors:\n{out}")
    rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
    p99 = re.search(r"^\s+99%\s+([\d.]+)(us|ms|s)\s*$", out, re.MULTILINE)
    if rate is None or p99 is None:
        raise RuntimeError(f"unexpected wrk output:\n{out}")
    return Run(float(rate.group(1)), float(p99.group(1)) * _UNITS[p99.group(2)])


def main(argv: list[str] | None = None) -> None:
    """Parse arguments; serve one side (``--serve``) or run the whole comparison."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a tiny run (smoke test)")
    parser.add_argument("--rounds", type=int, default=None, help="runs per side and count")
    parser.add_argument("--seconds", type=int, default=None, help="length of one wrk run")
    parser.add_argument(
        "--conns", type=int, nargs="+", default=None, help=f"connection counts (default {CONNS})"
    )
    parser.add_argument("--serve", choices=SIDES[1:], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.serve:
        serve(args.serve, args.port)
        return
    if shutil.which("wrk") is None:
        sys.exit("bench/http.py needs wrk (Debian: apt-get install wrk; `make bench` does it)")

    rounds = args.rounds or (1 if args.quick else 5)
    seconds = args.seconds or (1 if args.quick else 3)
    conn_counts = tuple(args.conns or ((16,) if args.quick else CONNS))
    sides = available_sides()
    load_before = os.getloadavg()[0]

    BENCH_TMP.mkdir(exist_ok=True)
    runs: dict[tuple[str, int], list[Run]] = {(s, c): [] for s in sides for c in conn_counts}
    try:
        with tempfile.TemporaryDirectory(dir=BENCH_TMP, prefix="http-") as tmp:
            script = Path(tmp) / "post.lua"
            script.write_text(WRK_SCRIPT)
            servers: list[Server] = []
            try:
                for kind in sides:
                    servers.append(start_server(kind, Path(tmp) / "data"))
                for server in servers:  # warm up: imports, the actor's first event
                    wrk(server.url, script, 16, 1 if args.quick else 2)
                for i in range(rounds):
                    for conns in conn_counts:
                        shift = i % len(servers)
                        for server in servers[shift:] + servers[:shift]:
                            runs[(server.kind, conns)].append(
                                wrk(server.url, script, conns, seconds)
                            )
            finally:
                for server in servers:
                    stop_process(server.proc)
    finally:
        with contextlib.suppress(OSError):
            BENCH_TMP.rmdir()  # only if empty: another benchmark may be using it

    print(
        f"http: wrk -t1, {rounds} x {seconds} s per side and connection count, sides "
        f"rotated each round; min / median / max (load average {load_before:.2f} before, "
        f"{os.cpu_count()} cores)"
    )
    for conns in conn_counts:
        print(f"  {conns} connection{'s' if conns > 1 else ''}:")
        for side in sides:
            side_runs = runs[(side, conns)]
            print(
                f"    {side:<13} req/s {spread([r.rate for r in side_runs], 0):<34} "
                f"p99 ms {spread([r.p99_ms for r in side_runs], 2)}"
            )
    for conns in conn_counts:
        ours, base = runs[("actorkeep", conns)], runs[("starlette", conns)]
        ratios = [a.rate / b.rate for a, b in zip(ours, base, strict=True)]
        ratio = statistics.median(ratios)
        p99_ours = statistics.median(r.p99_ms for r in ours)
        p99_base = statistics.median(r.p99_ms for r in base)
        verdict = "met" if ratio >= TARGET and p99_ours <= p99_base else "MISSED"
        print(
            f"http: {conns:>2} conns, actorkeep / starlette on uvicorn (h11) ratio "
            f"{spread(ratios, 2)}x, p99 {p99_ours:.2f} vs {p99_base:.2f} ms "
            f"(target >= {TARGET}x and p99 no worse: {verdict})"
        )


if __name__ == "__main__":
    main()
