"""Outside HTTP requests to an ``@rpc`` method vs a bare hypercorn hello-world ASGI app.

Two server processes run side by side on 127.0.0.1, both on trio:

- actorkeep: ``actorkeep.front.serve_http`` with the limits of ``actorkeep serve``, over a
  ``Host`` on ``FileStorage``; the request reaches ``@rpc hello`` of the actor ``bench/hello``;
- baseline: a bare ASGI app that reads the body and answers ``200 hello``, on hypercorn's trio
  worker.

This process is the load generator for both: the identical request
(``POST /bench/hello/_rpc/hello`` with the JSON body ``{}``) over several keep-alive HTTP/1.1
connections on raw non-blocking sockets, each with one request in flight. Phases alternate
between the two servers (a warm-up, then a timed window, bounded in count too); the median of
the rounds is reported, with the CPU share of the generator and of the server to show which one
is the bottleneck. Target (docs/reference.md §12): actorkeep >= 0.7x the bare app's req/s.

    python bench/http.py [--quick]
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
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import trio

import actorkeep as ak
from bench.procs import LOOPBACK, free_port

TARGET = 0.7
BENCH_TMP = Path(__file__).resolve().parent.parent / ".bench-tmp"
PATH = "/bench/hello/_rpc/hello"
BODY = b"{}"
REQUEST = (
    f"POST {PATH} HTTP/1.1\r\n"
    f"Host: {LOOPBACK}\r\n"
    "Content-Type: application/json\r\n"
    f"Content-Length: {len(BODY)}\r\n"
    "\r\n"
).encode() + BODY

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
    """The baseline: a hello-world ASGI 3 app (it reads the request body, as actorkeep does)."""
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


# -- server processes ------------------------------------------------------------------------


async def serve(kind: str, port: int, data: Path) -> None:
    """Serve one side until SIGTERM/SIGINT: actorkeep as ``actorkeep serve`` does, the bare
    app on hypercorn's trio worker."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:

        async def until_signal() -> None:
            async for _ in signals:
                return

        if kind == "bare":
            from hypercorn.config import Config
            from hypercorn.trio import serve as hypercorn_serve

            config = Config()
            config.bind = [f"{LOOPBACK}:{port}"]
            config.accesslog = None
            config.errorlog = None
            await hypercorn_serve(cast(Any, bare_app), config, shutdown_trigger=until_signal)
            return
        from actorkeep.front import ServerLimits, serve_http

        host = ak.Host(app, ak.FileStorage(data))
        listeners = await trio.open_tcp_listeners(port, host=LOOPBACK)
        await serve_http(host, listeners, ServerLimits(), until=until_signal)


@dataclass
class Server:
    """A server process and the port it listens on."""

    kind: str
    port: int
    proc: subprocess.Popen[bytes]

    def cpu_seconds(self) -> float | None:
        """User + system CPU time of the server process so far (Linux), else ``None``."""
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server(kind: str, data: Path) -> Server:
    """Start ``python bench/http.py --serve KIND`` and wait until it answers."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", kind, "--port", str(port), "--data", str(data)],
        stdin=subprocess.DEVNULL,
    )
    server = Server(kind, port, proc)
    deadline = time.monotonic() + 30.0
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{kind} server exited with {proc.returncode}")
        try:
            run_load(port, conns=1, warmup=0.0, duration=0.0, max_requests=1)
            return server
        except OSError:
            if time.monotonic() > deadline:
                stop_server(server)
                raise RuntimeError(f"{kind} server did not answer on port {port}") from None
            time.sleep(0.05)


def stop_server(server: Server) -> None:
    """Ask the server to stop; kill it if it does not."""
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()


# -- load generator --------------------------------------------------------------------------


@dataclass
class Load:
    """What one timed window measured."""

    requests: int
    seconds: float
    client_cpu: float  # seconds of this process's CPU during the window

    @property
    def rate(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0


class _Conn:
    """One keep-alive connection with at most one request in flight.

    Both servers close a connection after 1,000 requests, saying ``connection: close``; the
    connection then reconnects, as an HTTP client would.
    """

    __slots__ = ("buf", "busy", "closing", "port", "sock")

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock = self._connect()
        self.buf = b""
        self.busy = False
        self.closing = False

    def _connect(self) -> socket.socket:
        sock = socket.create_connection((LOOPBACK, self.port), timeout=5.0)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        return sock

    def reconnect(self, sel: selectors.BaseSelector) -> None:
        """Replace a connection the server is closing with a new one."""
        sel.unregister(self.sock)
        self.sock.close()
        self.sock = self._connect()
        sel.register(self.sock, selectors.EVENT_READ, self)
        self.buf = b""
        self.closing = False

    def send(self) -> None:
        self.sock.sendall(REQUEST)  # small: fits in the socket buffer at once
        self.busy = True

    def take_response(self) -> bool:
        """Consume one complete response from the buffer; ``False`` if it is not all here."""
        buf = self.buf
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            return False
        head = buf[:end].lower()
        if not head.startswith(b"http/1.1 200 "):
            raise RuntimeError(f"unexpected response: {buf[:300]!r}")
        at = head.find(b"\r\ncontent-length:")
        if at < 0:
            raise RuntimeError(f"response without content-length: {buf[:300]!r}")
        line_end = head.find(b"\r\n", at + 2)
        length = int(head[at + 17 : line_end if line_end >= 0 else len(head)])
        total = end + 4 + length
        if len(buf) < total:
            return False
        self.buf = buf[total:]
        self.busy = False
        self.closing = b"\r\nconnection: close" in head
        return True


def run_load(port: int, conns: int, warmup: float, duration: float, max_requests: int) -> Load:
    """Keep ``conns`` connections busy: ``warmup`` seconds, then a window of ``duration``
    seconds or ``max_requests`` responses, whichever ends first; then drain and close."""
    sel = selectors.DefaultSelector()
    clients = [_Conn(port) for _ in range(conns)]
    try:
        for c in clients:
            sel.register(c.sock, selectors.EVENT_READ, c)
            c.send()
        start = time.perf_counter()
        measure_from = start + warmup
        stop_at = measure_from + duration
        measuring = warmup <= 0
        cpu0 = time.process_time()
        t0 = t1 = start
        cpu1 = cpu0
        done = 0
        sending = True
        while sending or any(c.busy for c in clients):
            events = sel.select(timeout=10.0)
            if not events:
                raise RuntimeError("no response within 10 s")
            now = time.perf_counter()
            if not measuring and now >= measure_from:
                measuring, t0, cpu0 = True, now, time.process_time()
            for key, _ in events:
                c = cast(_Conn, key.data)
                data = c.sock.recv(65536)
                if not data:
                    raise RuntimeError("the server closed a connection")
                c.buf += data
                if c.take_response():
                    if measuring and sending:
                        done += 1
                        if done >= max_requests or now >= stop_at:
                            sending = False
                            t1, cpu1 = now, time.process_time()
                    if c.closing:
                        c.reconnect(sel)
                    if sending:
                        c.send()
        return Load(done, t1 - t0, cpu1 - cpu0)
    finally:
        sel.close()
        for c in clients:
            c.sock.close()


# -- the comparison --------------------------------------------------------------------------


@dataclass
class Round:
    """One timed window against one server."""

    load: Load
    server_cpu: float | None


def measure(server: Server, conns: int, warmup: float, duration: float, cap: int) -> Round:
    """One phase against ``server``, with the server's CPU share over the phase."""
    cpu_before = server.cpu_seconds()
    wall_before = time.perf_counter()
    load = run_load(server.port, conns, warmup, duration, cap)
    wall = time.perf_counter() - wall_before
    cpu_after = server.cpu_seconds()
    share = None
    if cpu_before is not None and cpu_after is not None and wall > 0:
        share = (cpu_after - cpu_before) / wall
    return Round(load, share)


def summary(rounds: list[Round]) -> str:
    """Rates of every round and the CPU shares (generator / server) of the median round."""
    rates = [r.load.rate for r in rounds]
    mid = sorted(rounds, key=lambda r: r.load.rate)[len(rounds) // 2]
    client = mid.load.client_cpu / mid.load.seconds if mid.load.seconds > 0 else 0.0
    server = f"{mid.server_cpu:.0%}" if mid.server_cpu is not None else "n/a"
    return (
        " ".join(f"{r:,.0f}" for r in rates) + f"  (cpu: generator {client:.0%}, server {server})"
    )


def main(argv: list[str] | None = None) -> None:
    """Parse arguments; serve one side (``--serve``) or run the whole comparison."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a tiny run (smoke test)")
    parser.add_argument("--conns", type=int, default=8, help="keep-alive connections")
    parser.add_argument("--rounds", type=int, default=None, help="timed windows per side")
    parser.add_argument("--seconds", type=float, default=None, help="length of a timed window")
    parser.add_argument("--serve", choices=["actorkeep", "bare"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--data", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.serve:
        trio.run(serve, args.serve, args.port, Path(args.data))
        return

    rounds = args.rounds or (1 if args.quick else 5)
    seconds = args.seconds or (0.3 if args.quick else 1.5)
    warmup = 0.1 if args.quick else 0.3
    load_before = os.getloadavg()[0]
    cap = 2_000 if args.quick else 1_000_000

    BENCH_TMP.mkdir(exist_ok=True)
    results: dict[str, list[Round]] = {"actorkeep": [], "bare": []}
    try:
        with tempfile.TemporaryDirectory(dir=BENCH_TMP, prefix="http-") as tmp:
            servers: list[Server] = []
            try:
                for kind in ("actorkeep", "bare"):
                    servers.append(start_server(kind, Path(tmp)))
                for i in range(rounds):
                    order = servers if i % 2 == 0 else servers[::-1]
                    for server in order:
                        round_ = measure(server, args.conns, warmup, seconds, cap)
                        results[server.kind].append(round_)
            finally:
                for server in servers:
                    stop_server(server)
    finally:
        with contextlib.suppress(OSError):
            BENCH_TMP.rmdir()  # only if empty: another benchmark may be using it

    a = statistics.median(r.load.rate for r in results["actorkeep"])
    b = statistics.median(r.load.rate for r in results["bare"])
    ratio = a / b
    verdict = "met" if ratio >= TARGET else "MISSED"
    print(
        f"http: {args.conns} keep-alive connections, {rounds} x {seconds} s windows per side, "
        f"median reported (load average {load_before:.2f} before, {os.cpu_count()} cores)"
    )
    print(f"  actorkeep req/s: {summary(results['actorkeep'])}")
    print(f"  bare app req/s:  {summary(results['bare'])}")
    print(
        f"http: actorkeep {a:,.0f} req/s, bare hypercorn app {b:,.0f} req/s, "
        f"ratio {ratio:.2f}x (target >= {TARGET}x, {verdict})"
    )


if __name__ == "__main__":
    main()
