"""WebSockets owned by actors, against a bare WebSocket echo app on hypercorn (issue 17).

Each side is a server process of its own on 127.0.0.1; this process is the client, with a
small WebSocket client of its own (masked frames, a parser of the server's frames) so that
the client costs little beside the servers:

- actorkeep: ``actorkeep serve bench.websockets:app``; sockets of ``/room/<name>/ws`` belong
  to the actor ``room/<name>``, whose ``websocket_message`` sends a message back to its sender,
  or, for ``broadcast``, to every socket of the room;
- hypercorn: a bare ASGI WebSocket app that sends each message back, on hypercorn's trio
  worker (the same concurrency library, no actor, no storage).

Measured:

1. Idle sockets: the server's resident memory (``VmRSS``) before and with N sockets open
   (10,000 by default, 100 to a room), per socket, on both sides; for actorkeep also once the
   rooms are evicted (hibernation: the sockets stay open, the actors leave memory).
2. A broadcast to 1,000 sockets of one room: from the send of ``broadcast`` until the last
   of the 1,000 has the message (min / median / max over the repeats), and the server's CPU
   time per broadcast (``/proc/<pid>/stat``).
3. Messages per second through one room: 16 clients in one room, each sending a message and
   waiting for its echo, for a few seconds per round; the same 16 clients against hypercorn's
   echo. Rounds alternate the order of the sides; printed min / median / max, and the ratio
   actorkeep / hypercorn of each round's pair. Target: a median ratio of at least 0.5.

    python bench/websockets.py [--quick] [--sockets N] [--rounds N] [--seconds S]
"""

from __future__ import annotations

# Run as a script, this file's directory comes first on sys.path (see bench/http.py).
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _HERE:
    sys.path[0] = os.path.dirname(_HERE)

import argparse
import base64
import resource
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any, cast

import trio

import actorkeep as ak
from bench.procs import LOOPBACK, free_port, read_rss_kib, stop_process

TARGET = 0.5
REPO = Path(__file__).resolve().parent.parent
ROOM_SIZE = 100
BROADCAST_TO = 1000
CLIENTS = 16

app = ak.App()


@app.actor("room")
class Room(ak.Actor):
    """The actorkeep side: a room whose members' messages come back to them."""

    @ak.websocket("/ws")
    async def join(self, req: ak.Request) -> ak.WebSocket:
        return req.accept_websocket()

    async def websocket_message(self, ws: ak.WebSocket, message: str | bytes) -> None:
        if message == "broadcast":
            for member in self.websockets():
                member.send("news")
        else:
            ws.send(message)


Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


async def echo_app(scope: Scope, receive: Receive, send: Send) -> None:
    """The hypercorn side: accept every socket, send each message back."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "websocket":
        return
    while True:
        message = await receive()
        if message["type"] == "websocket.connect":
            await send({"type": "websocket.accept"})
        elif message["type"] == "websocket.receive":
            if message.get("text") is not None:
                await send({"type": "websocket.send", "text": message["text"]})
            else:
                await send({"type": "websocket.send", "bytes": message["bytes"]})
        else:
            return


async def _serve_hypercorn(port: int) -> None:
    from hypercorn.config import Config
    from hypercorn.trio import serve as hypercorn_serve

    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:

        async def until_signal() -> None:
            async for _ in signals:
                return

        config = Config()
        config.bind = [f"{LOOPBACK}:{port}"]
        config.accesslog = None
        config.errorlog = None
        config.websocket_ping_interval = None
        await hypercorn_serve(cast(Any, echo_app), config, shutdown_trigger=until_signal)


# -- the client ------------------------------------------------------------------------------


def _frame(payload: bytes) -> bytes:
    """A masked text frame (the all-zero mask: what is sent is the payload itself)."""
    n = len(payload)
    head = bytes([0x81, 0x80 | n]) if n < 126 else bytes([0x81, 0xFE]) + n.to_bytes(2, "big")
    return head + b"\x00\x00\x00\x00" + payload


class Client:
    """One WebSocket of the client side: whole text messages in, frames out."""

    def __init__(self, stream: trio.SocketStream, rest: bytes) -> None:
        self.stream = stream
        self.buffer = bytearray(rest)

    @classmethod
    async def connect(cls, port: int, path: str) -> Client:
        stream = await trio.open_tcp_stream(LOOPBACK, port)
        key = base64.b64encode(os.urandom(16))
        await stream.send_all(
            b"GET " + path.encode() + b" HTTP/1.1\r\nhost: bench\r\nupgrade: websocket\r\n"
            b"connection: Upgrade\r\nsec-websocket-version: 13\r\nsec-websocket-key: "
            + key
            + b"\r\n\r\n"
        )
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = await stream.receive_some(65536)
            if not chunk:
                raise ConnectionError(f"{path}: closed during the handshake")
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 101"):
            raise ConnectionError(f"{path}: {head.splitlines()[0]!r}")
        return cls(stream, rest)

    async def send(self, text: bytes) -> None:
        await self.stream.send_all(_frame(text))

    async def receive(self) -> bytes:
        while True:
            buf = self.buffer
            if len(buf) >= 2:
                n = buf[1] & 0x7F
                start = 2 if n < 126 else 4 if n == 126 else 10
                if len(buf) >= start:
                    if n == 126:
                        n = int.from_bytes(buf[2:4], "big")
                    elif n == 127:
                        n = int.from_bytes(buf[2:10], "big")
                    if len(buf) >= start + n:
                        opcode, payload = buf[0] & 0x0F, bytes(buf[start : start + n])
                        del buf[: start + n]
                        if opcode == 0x8:
                            raise ConnectionError("closed by the server")
                        if opcode in (0x1, 0x2):
                            return payload
                        continue  # a ping or pong
            chunk = await self.stream.receive_some(65536)
            if not chunk:
                raise ConnectionError("the server closed the connection")
            buf += chunk


async def _open_many(port: int, paths: list[str], at_once: int = 200) -> list[Client]:
    clients: list[Client] = []
    for i in range(0, len(paths), at_once):
        async with trio.open_nursery() as nursery:
            batch: list[Client | None] = [None] * len(paths[i : i + at_once])

            async def one(j: int, path: str, batch: list[Client | None] = batch) -> None:
                batch[j] = await Client.connect(port, path)

            for j, path in enumerate(paths[i : i + at_once]):
                nursery.start_soon(one, j, path)
        clients.extend(c for c in batch if c is not None)
    return clients


async def _close_all(clients: list[Client]) -> None:
    for client in clients:
        await trio.aclose_forcefully(client.stream)


# -- the servers -----------------------------------------------------------------------------


def _raise_files() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def start(
    side: str, data: Path, sockets: int, idle_timeout: float
) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    if side == "actorkeep":
        command = [sys.executable, "-m", "actorkeep", "serve", "bench.websockets:app"]
        command += ["--data", str(data), "--host", LOOPBACK, "--port", str(port)]
        command += ["--max-connections", str(sockets + 200), "--max-websockets", str(sockets + 100)]
        command += ["--idle-timeout", str(idle_timeout), "--log-level", "warning"]
        # Few actors in memory: the open-file limit goes to the sockets' connections.
        command += ["--max-active", "200"]
    else:
        command = [sys.executable, __file__, "--serve-hypercorn", str(port)]
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, preexec_fn=_raise_files)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            trio.run(Client.connect, port, "/room/probe/ws")
            return proc, port
        except OSError:
            time.sleep(0.05)
    stop_process(proc)
    raise RuntimeError(f"{side} did not start")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- the measures ----------------------------------------------------------------------------


def idle_memory(side: str, data: Path, sockets: int) -> dict[str, float]:
    proc, port = start(side, data, sockets, idle_timeout=2.0)
    try:
        time.sleep(0.5)
        before = read_rss_kib(proc.pid)
        paths = [f"/room/idle{i // ROOM_SIZE}/ws" for i in range(sockets)]
        result: dict[str, float] = {}

        async def run() -> None:
            clients = await _open_many(port, paths)
            assert len(clients) == sockets
            await trio.sleep(0.5)
            result["open"] = (read_rss_kib(proc.pid) - before) * 1024 / sockets
            if side == "actorkeep":
                await trio.sleep(4.0)  # past --idle-timeout: the rooms leave memory
                result["hibernating"] = (read_rss_kib(proc.pid) - before) * 1024 / sockets
                # Every socket still works: one message to a room wakes it.
                await clients[0].send(b"hello")
                assert await clients[0].receive() == b"hello"
            await _close_all(clients)

        trio.run(run)
        return result
    finally:
        stop_process(proc)


def broadcasts(data: Path, repeats: int) -> tuple[list[float], float]:
    proc, port = start("actorkeep", data, BROADCAST_TO + 10, idle_timeout=30.0)
    try:
        latencies: list[float] = []
        cpu: list[float] = []

        async def run() -> None:
            members = await _open_many(port, ["/room/big/ws"] * BROADCAST_TO)
            sender = members[0]

            async def drain(client: Client) -> None:
                assert await client.receive() == b"news"

            for _ in range(repeats + 1):
                used = cpu_seconds(proc.pid)
                started = time.perf_counter()
                await sender.send(b"broadcast")
                async with trio.open_nursery() as nursery:
                    for client in members:
                        nursery.start_soon(drain, client)
                latencies.append(time.perf_counter() - started)
                cpu.append(cpu_seconds(proc.pid) - used)
            del latencies[0], cpu[0]  # the first wakes the room
            await _close_all(members)

        trio.run(run)
        return latencies, sum(cpu) / len(cpu)
    finally:
        stop_process(proc)


def throughput(port: int, seconds: float) -> float:
    async def run() -> int:
        clients = await _open_many(port, ["/room/echo/ws"] * CLIENTS)
        counts = [0] * CLIENTS
        end = trio.current_time() + seconds

        async def loop(i: int) -> None:
            client = clients[i]
            while trio.current_time() < end:
                await client.send(b"message number %d" % counts[i])
                await client.receive()
                counts[i] += 1

        async with trio.open_nursery() as nursery:
            for i in range(CLIENTS):
                nursery.start_soon(loop, i)
        await _close_all(clients)
        return sum(counts)

    return trio.run(run) / seconds


def _spread(values: list[float], unit: str, scale: float = 1.0) -> str:
    v = [x * scale for x in values]
    return f"{min(v):,.1f} / {statistics.median(v):,.1f} / {max(v):,.1f} {unit}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small and short (CI)")
    parser.add_argument("--sockets", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--serve-hypercorn", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_hypercorn:
        trio.run(_serve_hypercorn, args.serve_hypercorn)
        return
    if args.quick:
        args.sockets, args.rounds, args.seconds = 1_000, 2, 1.0
    _raise_files()
    with tempfile.TemporaryDirectory(prefix="actorkeep-bench-ws-", dir=REPO) as tmp:
        root = Path(tmp)
        print(f"1. {args.sockets:,} idle sockets, {ROOM_SIZE} to a room: resident bytes per socket")
        for side in ("actorkeep", "hypercorn"):
            memory = idle_memory(side, root / f"idle-{side}", args.sockets)
            shown = ", ".join(f"{k} {v:,.0f} B" for k, v in memory.items())
            print(f"   {side:<10} {shown}")
        repeats = 5 if args.quick else 20
        latencies, cpu = broadcasts(root / "broadcast", repeats)
        print(f"2. a broadcast to {BROADCAST_TO:,} sockets of one room, {repeats} times")
        print(f"   until the last has it: {_spread(latencies, 'ms', 1000)} (min / median / max)")
        print(f"   server CPU per broadcast: {cpu * 1000:,.1f} ms")
        print(f"3. messages/s through one room, {CLIENTS} clients, {args.rounds} rounds")
        servers = {
            side: start(side, root / f"echo-{side}", 100, idle_timeout=30.0)
            for side in ("actorkeep", "hypercorn")
        }
        try:
            rates: dict[str, list[float]] = {"actorkeep": [], "hypercorn": []}
            ratios: list[float] = []
            for r in range(args.rounds):
                order = ["actorkeep", "hypercorn"] if r % 2 == 0 else ["hypercorn", "actorkeep"]
                got = {side: throughput(servers[side][1], args.seconds) for side in order}
                for side, rate in got.items():
                    rates[side].append(rate)
                ratios.append(got["actorkeep"] / got["hypercorn"])
        finally:
            for proc, _ in servers.values():
                stop_process(proc)
        for side, values in rates.items():
            print(f"   {side:<10} {_spread(values, 'msg/s')}")
        ratio = statistics.median(ratios)
        verdict = "met" if ratio >= TARGET else "MISSED"
        print(
            f"   actorkeep / hypercorn: {_spread(ratios, 'x')}; "
            f"median {ratio:.2f}x, target >= {TARGET}x: {verdict}"
        )


if __name__ == "__main__":
    main()
