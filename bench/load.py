"""Load test: hundreds of concurrent HTTP clients against a real ``actorkeep serve`` process.

The host is ``actorkeep serve bench.load:app`` (a subprocess on 127.0.0.1, with its own
temporary data directory) run with a small ``--max-active`` and ``--idle-timeout``, so that the
LRU cap and idle eviction work all the time. The app (below) is a small bench app rather than
examples/jobs: jobs has a fixed handful of actors (``api/main``, one deliverer, one worker), so
it would never evict anything, and every event of it funnels into one queue. Here every request
goes to one of many ``acct/<name>`` actors (half of them to a small hot set, half spread over
the whole pool), with a mix of:

- reads (``GET /acct/<n>/``),
- plain writes (``@rpc incr``: survive a process crash),
- durable writes (``@rpc deposit``: ``exec_durable``, fsynced before the answer),
- KV compare-and-set counters through 4 ``shards.KVShard`` actors (409 when the version the
  client holds is stale: a documented answer),
- durable queue sends to ``queue/events``, pushed to the consumer ``sink/main``.

The load generator is this process: ``--clients`` trio tasks, each with one keep-alive HTTP/1.1
connection (raw trio sockets) and one request in flight, for ``--seconds``. It records every
latency and status; any status other than the documented ones (200/202, 409 for a stale CAS,
503 for overload) and any connection error or timeout is printed and makes the script exit 1.
A monitor samples the host's resident memory (``VmRSS`` in ``/proc/<pid>/status``), open file
descriptors, CPU and its count of actors in memory (``/_actorkeep/health``) once a second.

Checks (exit 1 if any fails):

- no error: only the documented statuses, no connection error, no timeout;
- memory bounded: the largest RSS sample of the second half of the run is at most
  ``RSS_GROWTH`` (1.2x) the largest of the first half. The active set fills up within the first
  seconds (it is capped), so a host that frees what it evicts is flat after that; a leak per
  request or per actor ever touched grows with time and shows as a second half above the first;
- LRU cap: the actors in memory never exceed ``--max-active`` plus what can be busy at once
  (one per client, plus the 6 shard/queue/sink actors), and more distinct actors were touched
  than fit under the cap (so eviction really ran);
- idle eviction: after the load, the host empties itself within ``--idle-timeout`` + 10 s;
- nothing lost: every acknowledged ``incr``/``deposit`` is in a sample of actors, every CAS
  version acknowledged is unique and not above the key's final version, and every
  acknowledged send reaches the consumer.

``--quick`` (5 s, 2,000 actors, ``--max-active 100``) is mostly warm-up: it prints the memory
figures and the number of actors touched but does not judge them; every other check applies.

The generator reports its own CPU share and event-loop lag so that one can tell whether it,
rather than the host, limited the throughput.

    python bench/load.py [--quick] [--seconds 180] [--clients 200] [--actors 20000]
                         [--hot 100] [--max-active 500] [--idle-timeout 3] [--mix send=0,...]
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
import json
import random
import shutil
import socket
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import trio

import actorkeep as ak
import queues
import shards
from bench.procs import LOOPBACK, free_port, pct, read_rss_kib, stop_process

ROOT = Path(__file__).resolve().parent.parent
RSS_GROWTH = 1.2  # max RSS of the second half <= this x max RSS of the first half
REQUEST_TIMEOUT = 30.0  # seconds for one request; a request without an answer is an error
START_DEADLINE = 30.0
SYSTEM_ACTORS = 6  # kv/shard-0..3, queue/events, sink/main
KV_KEYS = 16
DRAIN_TIMEOUT = 120.0  # seconds for the consumer to receive every acknowledged send
VERIFY_SAMPLE = 500  # actors whose counters are checked after the load
EXPECTED = {  # op -> statuses that are a correct answer (503: overload, documented)
    "read": {200, 503},
    "incr": {200, 503},
    "deposit": {200, 503},
    "cas": {200, 409, 503},
    "send": {202, 503},
}
MIX = [("read", 40), ("incr", 25), ("deposit", 10), ("cas", 15), ("send", 10)]

# -- the app the host serves ------------------------------------------------------------------

app = ak.App()
app.mount(shards.KVShard, "kv", access="internal", allow=["acct"])
app.mount(queues.Queue, "queue", access="internal", allow=["acct"])

kv = ak.kv.Client("kv", shards=4)
events = ak.queue.Client("queue/events")
EVENTS_CONFIG = ak.queue.Config(consumer="sink/main", batch_size=50)


def _overloaded(exc: ak.Overloaded) -> ak.Response:
    """A shard or the queue refused the call: pass the documented 503 on."""
    body = json.dumps({"error": "Overloaded", "message": str(exc)}).encode()
    return ak.Response(503, {"content-type": "application/json", "retry-after": "1"}, body)


@app.actor("acct")
class Account(ak.Actor):
    """One of many actors: a row with a plain and a durable counter; KV CAS and queue sends."""

    async def setup(self) -> None:
        self.sql.exec(
            "CREATE TABLE IF NOT EXISTS acct (id INTEGER PRIMARY KEY CHECK (id = 0), "
            "plain INTEGER NOT NULL, durable INTEGER NOT NULL)"
        )

    @ak.route("GET", "/")
    async def show(self, req: ak.Request) -> ak.Response:
        row = self.sql.exec("SELECT plain, durable FROM acct").fetchone()
        plain, durable = row if row is not None else (0, 0)
        return ak.Response.json({"plain": plain, "durable": durable})

    @ak.rpc
    async def incr(self, by: int) -> int:
        self.sql.exec(
            "INSERT INTO acct VALUES (0, ?, 0) ON CONFLICT(id) DO UPDATE SET plain = plain + ?",
            (by, by),
        )
        return int(self.sql.exec("SELECT plain FROM acct").fetchone()[0])

    @ak.rpc
    async def deposit(self, by: int) -> int:
        await self.sql.exec_durable(
            "INSERT INTO acct VALUES (0, 0, ?) ON CONFLICT(id) DO UPDATE SET durable = durable + ?",
            (by, by),
        )
        return int(self.sql.exec("SELECT durable FROM acct").fetchone()[0])

    @ak.route("POST", "/cas")
    async def cas(self, req: ak.Request) -> ak.Response:
        args = req.json()
        expect = ak.kv.ABSENT if args["expect"] is None else int(args["expect"])
        try:
            version = await kv.compare_and_set(args["key"], expect, req.body)
        except ak.kv.Conflict as exc:
            return ak.Response.json({"current": exc.current_version}, status=409)
        except ak.Overloaded as exc:
            return _overloaded(exc)
        return ak.Response.json({"version": version})

    @ak.route("GET", "/kv/{key}")
    async def kv_version(self, req: ak.Request, key: str) -> ak.Response:
        entry = await kv.get_fresh(key)
        return ak.Response.json({"version": None if entry is None else entry.version})

    @ak.route("POST", "/send")
    async def send(self, req: ak.Request) -> ak.Response:
        try:
            job = await events.send(req.body)
        except ak.Overloaded as exc:
            return _overloaded(exc)
        return ak.Response.json({"job": job}, status=202)

    @ak.route("POST", "/configure")
    async def configure(self, req: ak.Request) -> ak.Response:
        await events.configure(EVENTS_CONFIG)
        return ak.Response(204)

    @ak.route("GET", "/queue")
    async def queue_stats(self, req: ak.Request) -> ak.Response:
        st = await events.stats()
        return ak.Response.json(
            {"ready": st.ready, "delayed": st.delayed, "leased": st.leased, "dead": st.dead}
        )


@app.actor("sink")
class Sink(ak.Actor):
    """The push consumer of ``queue/events``: records each message id once."""

    async def setup(self) -> None:
        self.sql.exec("CREATE TABLE IF NOT EXISTS got (id INTEGER PRIMARY KEY)")
        self.sql.exec(
            "CREATE TABLE IF NOT EXISTS deliveries (k INTEGER PRIMARY KEY CHECK (k = 0), n INTEGER)"
        )

    @ak.queue.consumer(queues=["queue/events"])
    async def take(self, message: ak.queue.Lease) -> None:
        self.sql.exec("INSERT OR IGNORE INTO got VALUES (?)", (message.id,))
        self.sql.exec("INSERT INTO deliveries VALUES (0, 1) ON CONFLICT(k) DO UPDATE SET n = n + 1")

    @ak.route("GET", "/")
    async def show(self, req: ak.Request) -> ak.Response:
        count, total = self.sql.exec("SELECT count(*), coalesce(sum(id), 0) FROM got").fetchone()
        row = self.sql.exec("SELECT n FROM deliveries").fetchone()
        return ak.Response.json(
            {"count": count, "sum": total, "deliveries": 0 if row is None else row[0]}
        )


# -- the host process -------------------------------------------------------------------------


class Server:
    """``python -m actorkeep serve bench.load:app`` on a free loopback port."""

    def __init__(self, data: Path, log: Path, args: list[str]) -> None:
        self.data = data
        self.log = log
        self.args = args
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> None:
        for _ in range(3):  # another process may take the free port before the host binds it
            self.port = free_port()
            cmd = [sys.executable, "-m", "actorkeep", "serve", "bench.load:app"]
            cmd += ["--data", str(self.data), "--host", LOOPBACK, "--port", str(self.port)]
            cmd += self.args
            with self.log.open("ab") as err:
                self.proc = subprocess.Popen(
                    cmd, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=err, stderr=err
                )
            if self._wait_healthy():
                return
            self.stop()
            if "Address already in use" not in self.stderr():
                break
        raise RuntimeError(f"the host did not start:\n{self.stderr()[-3000:]}")

    def _wait_healthy(self) -> bool:
        deadline = time.monotonic() + START_DEADLINE
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                return False
            with (
                contextlib.suppress(OSError),
                socket.create_connection((LOOPBACK, self.port), timeout=1.0) as s,
            ):
                s.sendall(b"GET /_actorkeep/health HTTP/1.1\r\nHost: x\r\n\r\n")
                if s.recv(64).startswith(b"HTTP/1.1 200"):
                    return True
            time.sleep(0.05)
        return False

    def stderr(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after 15 s; the exit code."""
        return None if self.proc is None else stop_process(self.proc)


def read_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def count_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


# -- HTTP/1.1 over trio sockets ---------------------------------------------------------------


class HttpError(Exception):
    """A connection that failed or a response that is not HTTP/1.1."""


class Connection:
    """One keep-alive HTTP/1.1 connection with at most one request in flight.

    hypercorn closes a connection after 1,000 requests with ``connection: close``; the next
    request then opens a new one, as a browser or an HTTP library would.
    """

    def __init__(self, port: int) -> None:
        self.port = port
        self.stream: trio.SocketStream | None = None
        self.buf = bytearray()
        self.connects = 0

    async def request(
        self, method: str, path: str, body: bytes = b"", ctype: str = "application/json"
    ) -> tuple[int, bytes]:
        if self.stream is None:
            self.stream = await trio.open_tcp_stream(LOOPBACK, self.port)
            self.connects += 1
            self.buf.clear()
        head = f"{method} {path} HTTP/1.1\r\nHost: {LOOPBACK}\r\n"
        if body or method != "GET":
            head += f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
        try:
            await self.stream.send_all(head.encode() + b"\r\n" + body)
            while (end := self.buf.find(b"\r\n\r\n")) < 0:
                await self._fill()
            lines = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
            status_line = lines[0].split(" ", 2)
            if len(status_line) < 2 or status_line[0] != "HTTP/1.1":
                raise HttpError(f"bad status line {lines[0]!r}")
            status = int(status_line[1])
            length, close = 0, False
            for line in lines[1:]:
                name, _, value = line.partition(":")
                name = name.strip().lower()
                if name == "content-length":
                    length = int(value)
                elif name == "connection" and value.strip().lower() == "close":
                    close = True
            total = end + 4 + length
            while len(self.buf) < total:
                await self._fill()
            reply = bytes(self.buf[end + 4 : total])
            del self.buf[:total]
        except BaseException:
            await self.close()
            raise
        if close:
            await self.close()
        return status, reply

    async def _fill(self) -> None:
        assert self.stream is not None
        data = await self.stream.receive_some(65536)
        if not data:
            raise HttpError("the server closed the connection")
        self.buf += data

    async def close(self) -> None:
        stream, self.stream = self.stream, None
        if stream is not None:
            with trio.CancelScope(shield=True):
                await stream.aclose()


# -- the load ---------------------------------------------------------------------------------


@dataclass
class Sample:
    """One monitor sample of the host process."""

    t: float  # seconds since the load started
    rss_kib: int
    fds: int
    active: int
    cpu: float  # host CPU seconds so far
    done: int  # requests answered so far


@dataclass
class Stats:
    """What the clients saw."""

    latencies: list[float] = field(default_factory=list)
    by_op: dict[str, list[float]] = field(default_factory=dict)
    statuses: Counter[tuple[str, int]] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    error_count: int = 0
    plain: dict[str, int] = field(default_factory=dict)  # name -> acknowledged incr total
    durable: dict[str, int] = field(default_factory=dict)  # name -> acknowledged deposits
    ambiguous: set[str] = field(default_factory=set)  # names with an unanswered write
    touched: set[str] = field(default_factory=set)
    kv_known: dict[str, int | None] = field(default_factory=dict)
    kv_acked: dict[str, list[int]] = field(default_factory=dict)
    sent: list[int] = field(default_factory=list)  # acknowledged queue message ids
    connects: int = 0
    done: int = 0

    def error(self, text: str) -> None:
        self.error_count += 1
        if len(self.errors) < 20:
            self.errors.append(text)


@dataclass
class Plan:
    """Who the clients talk to, and what they ask."""

    actors: int
    hot: int
    seed: int
    mix: list[tuple[str, int]]

    def name(self, rng: random.Random) -> str:
        if rng.random() < 0.5:
            return f"a{rng.randrange(self.hot)}"
        return f"a{rng.randrange(self.actors)}"

    def op(self, rng: random.Random) -> str:
        x = rng.randrange(sum(w for _, w in self.mix))
        for op, w in self.mix:
            if x < w:
                return op
            x -= w
        raise AssertionError("unreachable")


def parse_mix(text: str) -> list[tuple[str, int]]:
    """``read=40,incr=25,...`` -> ``[("read", 40), ...]`` (ops from ``MIX``, weights >= 0)."""
    weights = dict(MIX)
    for part in text.split(","):
        op, sep, weight = part.partition("=")
        if not sep or op not in weights or not weight.isdigit():
            raise ValueError(f"want OP=WEIGHT with OP one of {', '.join(weights)}: {part!r}")
        weights[op] = int(weight)
    if not any(weights.values()):
        raise ValueError("every weight is 0")
    return list(weights.items())


async def one_request(
    conn: Connection, op: str, name: str, rng: random.Random, stats: Stats
) -> tuple[int, bytes]:
    if op == "read":
        return await conn.request("GET", f"/acct/{name}/")
    if op in ("incr", "deposit"):
        by = rng.randrange(1, 10)
        status, body = await conn.request(
            "POST", f"/acct/{name}/_rpc/{op}", json.dumps({"by": by}).encode()
        )
        if status == 200:
            totals = stats.plain if op == "incr" else stats.durable
            totals[name] = totals.get(name, 0) + by
        return status, body
    if op == "cas":
        key = f"ctr-{rng.randrange(KV_KEYS)}"
        expect = stats.kv_known.get(key)
        status, body = await conn.request(
            "POST", f"/acct/{name}/cas", json.dumps({"key": key, "expect": expect}).encode()
        )
        if status == 200:
            version = int(json.loads(body)["version"])
            stats.kv_acked.setdefault(key, []).append(version)
            if (stats.kv_known.get(key) or 0) < version:
                stats.kv_known[key] = version
        elif status == 409:
            current = json.loads(body)["current"]
            if current is not None and (stats.kv_known.get(key) or 0) < current:
                stats.kv_known[key] = current
        return status, body
    if op == "send":
        status, body = await conn.request(
            "POST", f"/acct/{name}/send", rng.randbytes(100), "application/octet-stream"
        )
        if status == 202:
            stats.sent.append(int(json.loads(body)["job"]))
        return status, body
    raise AssertionError(op)


async def client(port: int, plan: Plan, index: int, stop_at: float, stats: Stats) -> None:
    rng = random.Random(plan.seed * 1_000_003 + index)
    conn = Connection(port)
    try:
        while time.perf_counter() < stop_at:
            op, name = plan.op(rng), plan.name(rng)
            stats.touched.add(name)
            t0 = time.perf_counter()
            status, body = 0, b""
            with trio.move_on_after(REQUEST_TIMEOUT) as scope:
                try:
                    status, body = await one_request(conn, op, name, rng, stats)
                except (OSError, HttpError, ValueError, KeyError) as exc:
                    stats.error(f"{op} {name}: {type(exc).__name__}: {exc}")
                    if op in ("incr", "deposit"):
                        stats.ambiguous.add(name)
                    await trio.sleep(0.1)
                    continue
            if scope.cancelled_caught:
                stats.error(f"{op} {name}: no answer within {REQUEST_TIMEOUT} s")
                if op in ("incr", "deposit"):
                    stats.ambiguous.add(name)
                continue
            latency = time.perf_counter() - t0
            stats.latencies.append(latency)
            stats.by_op.setdefault(op, []).append(latency)
            stats.statuses[op, status] += 1
            stats.done += 1
            if status not in EXPECTED[op]:
                stats.error(f"{op} {name}: status {status}: {body[:300]!r}")
                if op in ("incr", "deposit"):
                    stats.ambiguous.add(name)
    finally:
        stats.connects += conn.connects
        await conn.close()


async def health_active(conn: Connection) -> int:
    status, body = await conn.request("GET", "/_actorkeep/health")
    if status != 200:
        raise HttpError(f"health answered {status}")
    return int(json.loads(body)["active"])


class Monitor:
    """Samples the host every ``interval`` seconds (RSS, fds, CPU, requests done) and its count
    of actors in memory (a separate poller: the samples never wait for the host to answer)."""

    def __init__(self, port: int, pid: int, interval: float, stats: Stats) -> None:
        self.port = port
        self.pid = pid
        self.interval = interval
        self.stats = stats
        self.samples: list[Sample] = []
        self.lags: list[float] = []  # this process's event-loop lag at each sample
        self.active = 0
        self.max_active = 0

    async def run(self, started: float) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._poll_active)
            while True:
                t0 = time.perf_counter()
                await trio.sleep(self.interval)
                self.lags.append(time.perf_counter() - t0 - self.interval)
                self.samples.append(
                    Sample(
                        time.perf_counter() - started,
                        read_rss_kib(self.pid),
                        count_fds(self.pid),
                        self.active,
                        read_cpu_seconds(self.pid),
                        self.stats.done,
                    )
                )

    async def _poll_active(self) -> None:
        conn = Connection(self.port)
        try:
            while True:
                with trio.fail_after(REQUEST_TIMEOUT):
                    self.active = await health_active(conn)
                self.max_active = max(self.max_active, self.active)
                await trio.sleep(self.interval / 2)
        finally:
            await conn.close()


@dataclass
class Window:
    """The timed load window."""

    seconds: float
    client_cpu: float


async def run_load(
    server: Server, plan: Plan, clients: int, seconds: float, monitor: Monitor, stats: Stats
) -> Window:
    """``clients`` connections busy for ``seconds``, then wait for the last answers."""
    started = time.perf_counter()
    cpu0 = time.process_time()
    stop_at = started + seconds
    with trio.fail_after(seconds + REQUEST_TIMEOUT + 30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(monitor.run, started)
            async with trio.open_nursery() as load:
                for i in range(clients):
                    load.start_soon(client, server.port, plan, i, stop_at, stats)
            nursery.cancel_scope.cancel()
    return Window(time.perf_counter() - started, time.process_time() - cpu0)


# -- after the load ---------------------------------------------------------------------------


async def configure_queue(port: int) -> None:
    """Make ``queue/events`` push to ``sink/main`` (before the load starts)."""
    conn = Connection(port)
    try:
        status, body = await conn.request("POST", "/acct/setup/configure")
        if status != 204:
            raise RuntimeError(f"configure answered {status}: {body[:300]!r}")
    finally:
        await conn.close()


async def wait_idle(port: int, idle_timeout: float) -> tuple[int, float]:
    """Wait for idle eviction to empty the host; (active count at the end, seconds waited)."""
    conn = Connection(port)
    t0 = time.perf_counter()
    try:
        active = await health_active(conn)
        while active > 0 and time.perf_counter() - t0 < idle_timeout + 10:
            await trio.sleep(0.25)
            active = await health_active(conn)
        return active, time.perf_counter() - t0
    finally:
        await conn.close()


async def verify(port: int, stats: Stats, sample: int, rng: random.Random) -> tuple[list[str], int]:
    """Check that nothing acknowledged is missing: (the problems found, queue deliveries)."""
    problems: list[str] = []
    conn = Connection(port)
    try:
        # Counters: every acknowledged incr and deposit of a sample of actors.
        names = sorted((set(stats.plain) | set(stats.durable)) - stats.ambiguous)
        for name in rng.sample(names, min(sample, len(names))):
            status, body = await conn.request("GET", f"/acct/{name}/")
            got = json.loads(body) if status == 200 else None
            want = {"plain": stats.plain.get(name, 0), "durable": stats.durable.get(name, 0)}
            if got != want:
                problems.append(f"acct/{name}: {status} {got}, acknowledged {want}")
        # KV: versions never reused; the final version at least the last acknowledged one.
        for key, versions in sorted(stats.kv_acked.items()):
            if len(set(versions)) != len(versions):
                problems.append(f"kv {key}: a version was acknowledged twice")
            status, body = await conn.request("GET", f"/acct/check/kv/{key}")
            final = json.loads(body)["version"] if status == 200 else None
            if final is None or final < max(versions):
                problems.append(f"kv {key}: final version {final} < acknowledged {max(versions)}")
        # Queue: every acknowledged send reaches the consumer (once, by id).
        want_count, want_sum = len(stats.sent), sum(stats.sent)
        deadline = time.perf_counter() + DRAIN_TIMEOUT
        while True:
            status, body = await conn.request("GET", "/sink/main/")
            got_sink = json.loads(body)
            if got_sink["count"] >= want_count or time.perf_counter() > deadline:
                break
            await trio.sleep(0.5)
        if (got_sink["count"], got_sink["sum"]) != (want_count, want_sum):
            status, body = await conn.request("GET", "/acct/check/queue")
            problems.append(
                f"queue: consumer has {got_sink['count']} messages (id sum {got_sink['sum']}), "
                f"{want_count} acknowledged (id sum {want_sum}); queue stats {status} "
                f"{body.decode(errors='replace')}"
            )
        deliveries = int(got_sink["deliveries"])
    finally:
        await conn.close()
    return problems, deliveries


# -- report -----------------------------------------------------------------------------------


def ms(x: float) -> str:
    return f"{x * 1e3:.1f}"


def rss_timeline(samples: list[Sample], buckets: int) -> list[str]:
    """One line per time bucket: throughput, max RSS, max fds, max active actors."""
    if not samples:
        return []
    end = samples[-1].t
    width = end / buckets if buckets else end
    lines = []
    prev_t, prev_done, prev_cpu = 0.0, 0, samples[0].cpu
    start = 0
    for b in range(buckets):
        hi = (b + 1) * width
        group = [s for s in samples[start:] if s.t <= hi + 1e-9]
        if not group:
            continue
        start += len(group)
        last = group[-1]
        dt = last.t - prev_t
        rate = (last.done - prev_done) / dt if dt > 0 else 0.0
        cpu = (last.cpu - prev_cpu) / dt if dt > 0 else 0.0
        lines.append(
            f"  {prev_t:6.0f}-{last.t:<6.0f} {rate:8,.0f} {cpu:6.0%} "
            f"{max(s.rss_kib for s in group) / 1024:8.1f} {max(s.fds for s in group):6d} "
            f"{max(s.active for s in group):7d}"
        )
        prev_t, prev_done, prev_cpu = last.t, last.done, last.cpu
    return lines


def slope_mb_per_min(samples: list[Sample]) -> float:
    """Least-squares slope of RSS over time, in MB per minute."""
    if len(samples) < 2:
        return float("nan")
    ts = [x.t for x in samples]
    ys = [x.rss_kib / 1024 for x in samples]
    mt, my = sum(ts) / len(ts), sum(ys) / len(ys)
    var = sum((t - mt) ** 2 for t in ts)
    if var == 0:
        return float("nan")
    return 60 * sum((t - mt) * (y - my) for t, y in zip(ts, ys, strict=True)) / var


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a 5 s run (smoke test)")
    parser.add_argument("--seconds", type=float, default=None, help="load duration (180)")
    parser.add_argument("--clients", type=int, default=200, help="concurrent connections (200)")
    parser.add_argument("--actors", type=int, default=None, help="actor pool (20,000)")
    parser.add_argument("--hot", type=int, default=100, help="hot actors, half the traffic")
    parser.add_argument("--max-active", type=int, default=None, help="host --max-active (500)")
    parser.add_argument("--idle-timeout", type=float, default=3.0, help="host --idle-timeout")
    parser.add_argument(
        "--mix",
        default="",
        help="request weights, e.g. send=0 (default "
        + ",".join(f"{op}={w}" for op, w in MIX)
        + ")",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the data directory")
    args = parser.parse_args(argv)
    seconds = args.seconds or (5.0 if args.quick else 180.0)
    actors = args.actors or (2_000 if args.quick else 20_000)
    max_active = args.max_active or (100 if args.quick else 500)
    if args.clients < 1 or args.hot < 1 or actors < args.hot or seconds <= 0:
        parser.error("want --clients >= 1, --seconds > 0 and 1 <= --hot <= --actors")
    try:
        mix = parse_mix(args.mix) if args.mix else MIX
    except ValueError as exc:
        parser.error(str(exc))
    plan = Plan(actors, args.hot, args.seed, mix)

    tmp = Path(tempfile.mkdtemp(prefix="actorkeep-load-"))
    server = Server(
        tmp / "data",
        tmp / "host.log",
        ["--max-active", str(max_active), "--idle-timeout", str(args.idle_timeout)],
    )
    stats = Stats()
    load_before = os.getloadavg()[0]
    try:
        server.start()
        rss_start = read_rss_kib(server.pid)
        trio.run(configure_queue, server.port)
        monitor = Monitor(server.port, server.pid, 0.25 if args.quick else 1.0, stats)
        window = trio.run(run_load, server, plan, args.clients, seconds, monitor, stats)
        problems, deliveries = trio.run(
            verify, server.port, stats, VERIFY_SAMPLE, random.Random(args.seed)
        )
        active_after, idle_wait = trio.run(wait_idle, server.port, args.idle_timeout)
        rss_idle = read_rss_kib(server.pid)
        exit_code = server.stop()
    finally:
        server.stop()
        log_text = server.stderr()
        if args.keep:
            print(f"data kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    # -- figures
    samples = monitor.samples
    lat = sorted(stats.latencies)
    rate = stats.done / window.seconds
    host_cpu = (
        (samples[-1].cpu - samples[0].cpu) / (samples[-1].t - samples[0].t)
        if len(samples) > 1
        else float("nan")
    )
    lags = sorted(monitor.lags)
    half = window.seconds / 2
    first = [x.rss_kib for x in samples if x.t <= half]
    second = [x for x in samples if x.t > half]
    cap = max_active + args.clients + SYSTEM_ACTORS
    failed_lines = sum(1 for line in log_text.splitlines() if "event failed" in line)

    print(
        f"load: {args.clients} clients, {window.seconds:.1f} s, {actors:,} actors "
        f"({args.hot} hot get half the requests), host --max-active {max_active} "
        f"--idle-timeout {args.idle_timeout:g}; {os.cpu_count()} cores, load average "
        f"{load_before:.2f} before"
    )
    print(
        f"  requests: {stats.done:,} answered, {rate:,.0f} req/s; latency p50 {ms(pct(lat, 50))} "
        f"ms, p99 {ms(pct(lat, 99))} ms, max {ms(lat[-1] if lat else float('nan'))} ms"
    )
    for op, _ in mix:
        values = sorted(stats.by_op.get(op, []))
        counts = ", ".join(
            f"{status}: {n:,}" for (o, status), n in sorted(stats.statuses.items()) if o == op
        )
        print(
            f"    {op:8s} {len(values):8,}  p50 {ms(pct(values, 50)):>6} ms  "
            f"p99 {ms(pct(values, 99)):>7} ms  max {ms(values[-1] if values else 0):>7} ms  "
            f"[{counts}]"
        )
    print(
        f"  errors: {stats.error_count} (statuses other than documented, connection errors, "
        f"timeouts); host log: {failed_lines} failed events; connections opened: "
        f"{stats.connects}"
    )
    for text in stats.errors:
        print(f"    {text}")
    print(
        f"  generator: {window.client_cpu / window.seconds:.0%} of a core, event-loop lag p50 "
        f"{ms(pct(lags, 50))} ms p99 {ms(pct(lags, 99))} ms; host: {host_cpu:.0%} of a core"
    )
    print(
        f"  distinct actors touched: {len(stats.touched):,}; in memory at most "
        f"{monitor.max_active} (cap {max_active}, bound {cap}); after the load: {active_after} "
        f"after {idle_wait:.1f} s idle"
    )
    print("  time (s)        req/s   host-cpu  RSS (MB)    fds  active")
    for line in rss_timeline(samples, 5 if args.quick else 10):
        print(line)
    first_max = max(first, default=0) / 1024
    second_max = max((x.rss_kib for x in second), default=0) / 1024
    growth = second_max / first_max if first_max else float("inf")
    print(
        f"  RSS: {rss_start / 1024:.1f} MB at start, max {first_max:.1f} MB in the first half, "
        f"{second_max:.1f} MB in the second ({growth:.2f}x, bound {RSS_GROWTH}x"
        f"{'; not checked in --quick' if args.quick else ''}), slope over the second half "
        f"{slope_mb_per_min(second):+.1f} MB/min, {rss_idle / 1024:.1f} MB once idle"
    )
    checked = min(VERIFY_SAMPLE, len(set(stats.plain) | set(stats.durable)))
    print(
        f"  verified: {checked:,} actors' counters, "
        f"{len(stats.kv_acked)} KV keys ({sum(len(v) for v in stats.kv_acked.values()):,} CAS "
        f"versions), {len(stats.sent):,} queue sends ({deliveries} deliveries); host exit code "
        f"{exit_code}"
    )

    failures: list[str] = []
    if stats.error_count:
        failures.append(f"{stats.error_count} errors")
    # A 5 s run is mostly warm-up: its memory and eviction figures are printed, not judged.
    if not args.quick and (not first or not second or growth > RSS_GROWTH):
        failures.append(f"RSS grew {growth:.2f}x from the first half to the second")
    if not args.quick and len(stats.touched) <= max_active:
        failures.append(f"only {len(stats.touched)} actors touched: the LRU cap never evicted")
    if monitor.max_active > cap:
        failures.append(f"{monitor.max_active} actors in memory, over the bound {cap}")
    if active_after > 0:
        failures.append(f"{active_after} actors still in memory after the idle timeout")
    failures += problems
    if exit_code != 0:
        failures.append(f"the host exited with {exit_code} on SIGTERM")
    if failures:
        print("load: FAILED: " + "; ".join(failures))
        if failed_lines or stats.error_count:
            print("--- host log (tail) ---\n" + log_text[-4000:])
        return 1
    print(
        f"load: {rate:,.0f} req/s, p50 {ms(pct(lat, 50))} ms, p99 {ms(pct(lat, 99))} ms, "
        f"0 errors, RSS ratio {growth:.2f}x (bound {RSS_GROWTH}x): all checks passed"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
