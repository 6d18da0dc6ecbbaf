"""Scale: 100,000 actors (``--actors 1000000`` for the million), each with a pending alarm on
disk, served by a real host process.

1. **Creation.** Every actor is created through the runtime: a ``Host`` in this process
   (``ak.testing.open_host``) calls ``@rpc arm`` on each actor, batch by batch, which runs
   ``set_alarm`` — so the files, the ``actorkeep_alarm`` rows and the host's alarm-index rows
   are exactly what the runtime writes. With the production ``FileStorage`` that costs several
   fsyncs per new actor (SQLite's own syncs when a new file switches to WAL and when an evicted
   actor's connection checkpoints on close, plus the runtime's durable alarm write); a sample
   of ``--sample`` actors is created that way and its rate reported. The bulk of the actors is
   created on ``BulkStorage`` below: the same file layout and pragmas through the public
   storage seam, with ``synchronous=OFF`` and one ``sync(2)`` at the end instead of per-write
   fsyncs. The alarms are 30 days ahead, so none fires during the run.
2. **Restart.** ``actorkeep serve bench.scale:app`` (a subprocess on 127.0.0.1) is started on
   that directory several times: ready time = process start to the first 200 answer; also the
   time to the host's "actorkeep serving" log line, and the same figures on a 1,000-actor and
   an empty directory (the interpreter and imports alone). Before each start the host database
   is dropped from the page cache (``posix_fadvise DONTNEED``; the actor files are not read at
   startup). A host with the default options then touches ``--touch`` random actors (3,000; they
   all stay in memory under the default ``--max-active`` 10,000); its RSS (``VmRSS``) and open
   files are read after the start and along the touches. (Each actor in memory holds five
   descriptors: SQLite's for its database, ``-wal`` and ``-shm``, and the host's own for the
   database and ``-shm``. 10,000 would need ~50,000; the hard limit of open files may be lower,
   as it is on the machine this was written on: 20,000, which holds the 3,000 touched.)
3. **Per-op latency.** Two hosts at once, on the 100,000-actor and the 1,000-actor directory,
   both ``--max-active 256`` (64 with ``--quick``): rounds alternate between them, each one
   sequential ``POST /sleeper/<n>/_rpc/peek`` calls on one keep-alive connection to distinct
   actors that are not in memory (each call opens the actor's SQLite file), and the same call
   again at once (in memory). Every answer must be the alarm stored at creation.
4. **Alarms.** A handful of actors get alarms due just after creation (overdue at the first
   restart) and a handful due ``FUTURE_DELAY`` seconds later (while the host runs); all must
   fire, never early.

Targets (docs/reference.md §12, issue 6): restart ready < 2 s (median of the starts on the
big directory),
resident memory < 500 MB while serving the big directory (after each restart, and after the
latency calls under ``--max-active``; each actor held in memory adds ~150 KiB of SQLite
connection state, so the cap, not the number of actors on disk, bounds memory: the touch run
reports how many fit), per-op latency at 100,000 actors within 1.5x of that at 1,000
(median of the cold calls). Exit 1 if one is missed or a check fails. ``--quick`` runs a
scaled-down version (2,000 actors) whose timings are printed but not judged.

    python bench/scale.py [--quick] [--actors 100000]
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
import http.client
import json
import random
import resource
import shutil
import sqlite3
import statistics
import subprocess
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import trio

import actorkeep as ak
from actorkeep import codec
from actorkeep.address import actor_path
from actorkeep.runtime.storage import configure_connection
from bench.procs import LOOPBACK, free_port, pct, read_rss_kib, stop_process

ROOT = Path(__file__).resolve().parent.parent
TARGET_READY = 2.0  # seconds, process start -> first answer
TARGET_RSS_MB = 500.0
TARGET_LATENCY = 1.5  # cold per-op latency at --actors / at --small
FAR = 30 * 86400.0  # the bulk alarms are this far ahead
SOON = 5  # actors with an alarm due before the restart, and as many due while the host runs
FUTURE_DELAY = 20.0  # seconds after creation for the second handful
DRIVER = "bench/driver"  # the calling identity of the creation runs (needs no class)
START_DEADLINE = 60.0
CLIENT_TIMEOUT = 30.0

# -- the app ---------------------------------------------------------------------------------

app = ak.App()


@app.actor("sleeper")
class Sleeper(ak.Actor):
    """An actor whose only state is its alarm; ``alarm()`` records that it fired."""

    @ak.rpc
    async def arm(self, at: float) -> None:
        await self.set_alarm(at)

    @ak.rpc
    async def peek(self) -> float | None:
        return self.get_alarm()

    @ak.route("GET", "/fired")
    async def fired(self, req: ak.Request) -> ak.Response:
        has_table = self.sql.exec(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'fired'"
        ).fetchone()
        rows = self.sql.exec("SELECT at, scheduled_at FROM fired").fetchall() if has_table else []
        return ak.Response.json([{"at": at, "scheduled_at": s} for at, s in rows])

    async def alarm(self, info: ak.AlarmInfo) -> None:
        self.sql.exec("CREATE TABLE IF NOT EXISTS fired (at REAL, scheduled_at REAL)")
        self.sql.exec("INSERT INTO fired VALUES (?, ?)", (self.now(), info.scheduled_at))


def actor_name(i: int) -> str:
    return f"s{i:07d}"


# -- creation --------------------------------------------------------------------------------


class _BulkDatabase:
    """A database in ``FileStorage``'s place, with the runtime's pragmas but no syncs."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.where = str(path)
        self.conn = sqlite3.connect(path, isolation_level=None)
        try:
            # WAL (recorded in the file), cache, foreign keys; no sync, the switch to WAL too
            configure_connection(self.conn, "OFF")
        except BaseException:
            self.conn.close()
            raise

    def start_sync(self, done: Callable[[BaseException | None], None]) -> bool:
        return False

    async def sync(self) -> None:
        """Nothing: the bulk load ends with one ``sync(2)``."""

    look_at = 1 << 62  # never worth asking

    def checkpoint_due(self) -> bool:
        return False  # each file is written once

    async def prepare_checkpoint(self) -> None:
        """Nothing to do (never due)."""

    async def checkpoint(self) -> None:
        """Nothing (never due)."""

    def close(self) -> None:
        self.conn.close()


class BulkStorage:
    """``FileStorage``'s layout (``<root>/actors/<class>/<aa>/<bb>/<name>.sqlite`` and
    ``<root>/host/host.sqlite``) for a bulk load: no fsync per write, no lock file."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def open_actor(self, class_name: str, name: str, existing: bool = False) -> _BulkDatabase:
        return _BulkDatabase(actor_path(self.root / "actors", class_name, name))

    def exists(self, class_name: str, name: str) -> bool:
        return actor_path(self.root / "actors", class_name, name).exists()

    def actors(self) -> Iterator[tuple[str, str]]:
        return ak.FileStorage(self.root).actors()

    def has_actors(self) -> bool:
        return ak.FileStorage(self.root).has_actors()

    async def remove_actor(self, class_name: str, name: str) -> int:
        raise NotImplementedError("a bulk load deletes nothing")

    def open_host_db(self) -> _BulkDatabase:
        return _BulkDatabase(self.root / "host" / "host.sqlite")

    closing = 0  # databases close at once

    async def ready(self, class_name: str, name: str) -> None:
        """Nothing to wait for: databases close at once."""

    async def sync_all(self) -> None:
        """Nothing: the bulk load ends with one ``sync(2)``."""

    def set_aside_host_db(self) -> str:
        raise RuntimeError("the bulk loader never finds a damaged host database")

    def close(self) -> None:
        pass


async def arm(host: ak.testing.TestHost, name: str, at: float) -> None:
    resp = await host.call_as(
        DRIVER,
        f"sleeper/{name}",
        "POST",
        "/_rpc/arm",
        codec.pack({"at": at}),
        {"content-type": codec.MSGPACK},
        timeout=None,
    )
    if resp.status != 200:
        raise RuntimeError(f"arm {name}: {resp.status} {resp.body[:300]!r}")


@dataclass
class Created:
    """What a creation run made."""

    count: int
    seconds: float
    base_at: float  # actor i's alarm is at base_at + i / 1000
    synced: float = 0.0  # seconds of the final sync(2)
    soon: dict[str, float] = field(default_factory=dict)  # name -> alarm time


async def create(
    storage: ak.FileStorage | BulkStorage,
    count: int,
    batch: int,
    final_sync: bool = False,
    soon: int = 0,
    progress: Callable[[int, float], None] | None = None,
) -> Created:
    """Create ``count`` actors with far alarms through the runtime, ``batch`` at a time; then,
    if ``final_sync``, ``sync(2)``; then ``soon`` actors due 1 s later (overdue at the next
    start) and ``soon`` due ``FUTURE_DELAY`` s later."""
    started = time.perf_counter()
    async with ak.testing.open_host(app, storage=storage, max_active=1_024) as host:
        base_at = host.host.clock.now() + FAR
        for lo in range(0, count, batch):
            async with trio.open_nursery() as nursery:
                for i in range(lo, min(count, lo + batch)):
                    nursery.start_soon(arm, host, actor_name(i), base_at + i / 1000)
            if progress is not None:
                progress(min(count, lo + batch), time.perf_counter() - started)
        created = Created(count, time.perf_counter() - started, base_at)
        if final_sync:
            t0 = time.perf_counter()
            os.sync()
            created.synced = time.perf_counter() - t0
        if soon:  # set just before the host closes, so that none fires in this process
            now = host.host.clock.now()
            for i in range(soon):
                created.soon[f"due-{i}"] = now + 1.0
                created.soon[f"future-{i}"] = now + FUTURE_DELAY
            for name, at in created.soon.items():
                await arm(host, name, at)
    return created


def count_files(root: Path) -> int:
    return sum(
        1 for _, _, files in os.walk(root / "actors") for f in files if f.endswith(".sqlite")
    )


def disk_use(root: Path) -> tuple[int, int]:
    """Bytes allocated on disk (``st_blocks``) and inodes (files and folders) under ``root``."""
    used, inodes = 0, 0
    for folder, dirs, files in os.walk(root):
        for entry in (*dirs, *files):
            st = os.lstat(os.path.join(folder, entry))
            used += st.st_blocks * 512
            inodes += 1
    return used, inodes


def count_index(root: Path) -> int:
    with contextlib.closing(sqlite3.connect(root / "host" / "host.sqlite")) as conn:
        return int(conn.execute("SELECT count(*) FROM alarms").fetchone()[0])


def drop_host_db_cache(root: Path) -> None:
    """Evict the host database from the page cache, so that a start reads it from disk."""
    for suffix in ("", "-wal"):
        path = root / "host" / f"host.sqlite{suffix}"
        if not path.exists():
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


# -- the host process ------------------------------------------------------------------------


def read_rss_mb(pid: int) -> float:
    return read_rss_kib(pid) / 1024


@dataclass
class Start:
    """How one start of the host went."""

    ready: float  # seconds from spawning the process to the first 200 answer (health check)
    first_call: float | None  # ... to the answer of a first call to an existing actor
    serving: float | None  # ... to the "actorkeep serving" log line
    rss_mb: float  # right after the first answer


class Server:
    """``python -m actorkeep serve bench.scale:app`` on a free loopback port."""

    def __init__(self, data: Path, log: Path, args: list[str]) -> None:
        self.data = data
        self.log = log
        self.args = args
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.conn: http.client.HTTPConnection | None = None
        self.killed = False

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, probe: str | None) -> Start:
        """Start the host; then call ``sleeper/<probe>`` once, if given."""
        for _ in range(3):  # another process may take the free port before the host binds it
            self.port = free_port()
            self.log.write_bytes(b"")
            cmd = [sys.executable, "-m", "actorkeep", "serve", "bench.scale:app"]
            cmd += ["--data", str(self.data), "--host", LOOPBACK, "--port", str(self.port)]
            cmd += ["--log-format", "json", *self.args]
            with self.log.open("ab") as err:
                spawned_wall = time.time()
                spawned = time.perf_counter()
                self.proc = subprocess.Popen(
                    cmd, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=err, stderr=err
                )
            ready = self._wait_ready(spawned)
            if ready is not None:
                first_call = None
                if probe is not None:
                    self.peek(probe)
                    first_call = time.perf_counter() - spawned
                rss = read_rss_mb(self.pid)
                return Start(ready, first_call, self._serving_after(spawned_wall), rss)
            self.stop()
            if "Address already in use" not in self.stderr():
                break
        raise RuntimeError(f"the host did not start:\n{self.stderr()[-3000:]}")

    def _wait_ready(self, spawned: float) -> float | None:
        deadline = spawned + START_DEADLINE
        while time.perf_counter() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                return None
            with contextlib.suppress(OSError, http.client.HTTPException):
                conn = http.client.HTTPConnection(LOOPBACK, self.port, timeout=CLIENT_TIMEOUT)
                conn.request("GET", "/_actorkeep/health")
                resp = conn.getresponse()
                resp.read()
                if resp.status == 200:
                    ready = time.perf_counter() - spawned
                    self.conn = conn
                    return ready
                conn.close()
            time.sleep(0.005)
        return None

    def _serving_after(self, spawned_wall: float) -> float | None:
        """Seconds from the spawn to the host's "actorkeep serving" log line."""
        for _ in range(100):
            for line in self.stderr().splitlines():
                with contextlib.suppress(ValueError, KeyError):
                    record = json.loads(line)
                    if record["event"] == "actorkeep serving":
                        at = datetime.fromisoformat(record["timestamp"]).timestamp()
                        return at - spawned_wall
            time.sleep(0.01)
        return None

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        if self.conn is None:
            self.conn = http.client.HTTPConnection(LOOPBACK, self.port, timeout=CLIENT_TIMEOUT)
        headers = {"content-type": "application/json"} if body is not None else {}
        try:
            self.conn.request(method, path, body=body, headers=headers)
            resp = self.conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException):
            self.conn.close()
            self.conn = None
            raise
        if resp.getheader("connection", "").lower() == "close":
            self.conn.close()
            self.conn = None
        return resp.status, data

    def peek(self, name: str) -> tuple[float, Any]:
        """``@rpc peek`` of ``sleeper/<name>``: (seconds it took, the alarm it reported)."""
        t0 = time.perf_counter()
        status, body = self.request("POST", f"/sleeper/{name}/_rpc/peek", b"{}")
        elapsed = time.perf_counter() - t0
        if status != 200:
            raise RuntimeError(f"peek {name}: {status} {body[:300]!r}")
        return elapsed, json.loads(body)

    def stderr(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def kill(self) -> None:
        """kill -9, like a crash."""
        assert self.proc is not None
        self.killed = True
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after 15 s; the exit code."""
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        return None if self.proc is None else stop_process(self.proc)


@contextlib.contextmanager
def serving(
    data: Path, log: Path, args: list[str], starts: list[Start], probe: str | None
) -> Iterator[Server]:
    """A started host (its ``Start`` appended to ``starts``); stopped (SIGTERM, which must
    exit 0 unless the body killed it), or killed, on exit."""
    drop_host_db_cache(data)
    server = Server(data, log, args)
    try:
        starts.append(server.start(probe))
        yield server
    except BaseException:
        server.stop()
        raise
    code = server.stop()
    if code != 0 and not server.killed:
        raise RuntimeError(f"the host exited with {code}:\n{server.stderr()[-3000:]}")


# -- measurements ----------------------------------------------------------------------------


def wait_fired(server: Server, names: list[str], timeout: float) -> dict[str, list[Any]]:
    """Poll ``GET /sleeper/<n>/fired`` until every actor's alarm has fired or ``timeout``."""
    fired: dict[str, list[Any]] = {}
    deadline = time.perf_counter() + timeout
    while True:
        for name in names:
            if name not in fired:
                status, body = server.request("GET", f"/sleeper/{name}/fired")
                rows = json.loads(body) if status == 200 else []
                if rows:
                    fired[name] = rows
        if len(fired) == len(names) or time.perf_counter() > deadline:
            return fired
        time.sleep(0.1)


@dataclass
class Latency:
    """Per-op latencies against one host."""

    cold: list[float] = field(default_factory=list)
    warm: list[float] = field(default_factory=list)


def latency_round(
    server: Server,
    count: int,
    population: int,
    recent: deque[int],
    rng: random.Random,
    created: Created,
    out: Latency,
) -> list[str]:
    """``count`` cold calls (each followed by a warm one) to distinct actors that are not among
    the last ``recent.maxlen`` touched, so not in memory; returns the wrong answers."""
    problems: list[str] = []
    avoid = set(recent)
    for _ in range(count):
        i = rng.randrange(population)
        while i in avoid:
            i = rng.randrange(population)
        avoid.add(i)
        recent.append(i)
        name = actor_name(i)
        cold, got = server.peek(name)
        warm, _ = server.peek(name)
        out.cold.append(cold)
        out.warm.append(warm)
        want = created.base_at + i / 1000
        if got != want:
            problems.append(f"peek {name}: alarm {got}, created with {want}")
    return problems


def host_open_time(root: Path) -> tuple[float, float]:
    """In this process: seconds to open a ``Host`` on ``root`` and from there to the answer of
    a first call to an existing actor."""

    async def run() -> tuple[float, float]:
        t0 = time.perf_counter()
        host = ak.Host(app, ak.FileStorage(root))
        async with host.open():
            opened = time.perf_counter() - t0
            resp = await host.call(
                DRIVER,
                (DRIVER,),
                f"sleeper/{actor_name(0)}",
                "POST",
                "/_rpc/peek",
                b"{}",
                {"content-type": "application/json"},
                None,
            )
            first = time.perf_counter() - t0
            if resp.status != 200:
                raise RuntimeError(f"peek answered {resp.status}")
        return opened, first

    drop_host_db_cache(root)
    return trio.run(run)


# -- the run ---------------------------------------------------------------------------------


def ms(x: float) -> str:
    return f"{x * 1e3:.2f}"


def verdict(ok: bool, quick: bool) -> str:
    if quick:
        return "not judged in --quick"
    return "met" if ok else "MISSED"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="2,000 actors (smoke test)")
    parser.add_argument("--actors", type=int, default=None, help="actors (100,000)")
    parser.add_argument("--small", type=int, default=None, help="comparison size (1,000)")
    parser.add_argument("--sample", type=int, default=None, help="created with fsyncs (1,000)")
    parser.add_argument("--touch", type=int, default=None, help="actors touched (3,000)")
    parser.add_argument("--restarts", type=int, default=None, help="starts per directory (3)")
    parser.add_argument("--rounds", type=int, default=None, help="latency rounds (6)")
    parser.add_argument("--calls", type=int, default=None, help="cold calls per round (200)")
    parser.add_argument("--batch", type=int, default=512, help="actors armed at once")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    quick = args.quick
    n = args.actors or (2_000 if quick else 100_000)
    small = args.small or (500 if quick else 1_000)
    sample = args.sample if args.sample is not None else (100 if quick else 1_000)
    touch = args.touch if args.touch is not None else (500 if quick else 3_000)
    restarts = args.restarts or (1 if quick else 3)
    rounds = args.rounds or (2 if quick else 6)
    calls = args.calls or (50 if quick else 200)
    lat_cap = 64 if quick else 256  # --max-active of the latency hosts
    if not (0 < small <= n) or not (0 < touch <= n) or 2 * lat_cap + calls >= small:
        parser.error(
            "want 0 < --small <= --actors, 0 < --touch <= --actors, and --small above "
            f"{2 * lat_cap} + --calls (the cold calls need actors out of memory)"
        )
    rng = random.Random(args.seed)
    load_before = os.getloadavg()[0]
    failures: list[str] = []

    tmp = Path(tempfile.mkdtemp(prefix="actorkeep-scale-"))
    big, little, empty, fsynced = tmp / "big", tmp / "small", tmp / "empty", tmp / "fsynced"
    try:
        # -- 1. creation
        print(
            f"scale: {n:,} actors vs {small:,}; {os.cpu_count()} cores, load average "
            f"{load_before:.2f} before; data under {tmp}"
        )
        made_fsynced = trio.run(create, ak.FileStorage(fsynced), sample, args.batch)
        shutil.rmtree(fsynced)
        fsync_rate = sample / made_fsynced.seconds if made_fsynced.seconds else 0.0

        def progress(done: int, seconds: float) -> None:
            if not quick and done % 20_000 < args.batch:
                print(f"    {done:,} actors in {seconds:.0f} s", flush=True)

        made_small = trio.run(create, BulkStorage(little), small, args.batch, True)
        made = trio.run(create, BulkStorage(big), n, args.batch, True, SOON, progress)
        os.sync()  # the handful of soon alarms
        files, index_rows = count_files(big), count_index(big)
        empty.mkdir()
        print(
            f"  creation through the runtime: {sample:,} actors with FileStorage (fsyncs) at "
            f"{fsync_rate:,.0f}/s (so {n / max(fsync_rate, 1e-9) / 60:.1f} min for {n:,}); "
            f"{n:,} with BulkStorage in {made.seconds:.1f} s ({n / made.seconds:,.0f}/s) + "
            f"sync(2) {made.synced:.1f} s; {small:,} in {made_small.seconds:.1f} s"
        )
        used, inodes = disk_use(big)
        print(
            f"    on disk: {files:,} actor files, {index_rows:,} alarm-index rows; "
            f"{used / 2**20:,.0f} MiB and {inodes:,} inodes in all, "
            f"{used / files:,.0f} bytes and {inodes / files:.2f} inodes per actor"
        )
        if files != n + 2 * SOON or index_rows != n + 2 * SOON:
            failures.append(f"{files} files and {index_rows} index rows, want {n + 2 * SOON}")
        overdue = [k for k in made.soon if k.startswith("due-")]
        future = [k for k in made.soon if k.startswith("future-")]
        while time.time() < max(made.soon[k] for k in overdue) + 0.1:
            time.sleep(0.05)

        # -- 2. first restart on the big directory: alarms, memory
        starts: dict[str, list[Start]] = {"big": [], "small": [], "empty": [], "killed": []}
        rss: dict[str, float] = {}
        probe = actor_name(rng.randrange(n))
        with serving(big, tmp / "big.log", [], starts["big"], probe) as server:
            first = starts["big"][0]
            rss["after start"] = first.rss_mb
            fds_start = len(os.listdir(f"/proc/{server.pid}/fd"))
            ready_at = time.time()
            future_pending = ready_at < min(made.soon[k] for k in future)
            fired_overdue = wait_fired(server, overdue, 30.0)
            order = rng.sample(range(n), touch)
            marks = {min(m, touch) for m in (1_000, touch // 2, touch)}
            for k, i in enumerate(order, 1):
                server.peek(actor_name(i))
                if k in marks:
                    rss[f"after touching {k:,}"] = read_rss_mb(server.pid)
            fds = len(os.listdir(f"/proc/{server.pid}/fd"))
            fired_future = wait_fired(server, future, FUTURE_DELAY + 30.0)
            status, body = server.request("GET", "/_actorkeep/health")
            active = json.loads(body)["active"] if status == 200 else None
            server.kill()  # with --touch actors open: the next start is after a crash
        with serving(big, tmp / "big.log", [], starts["killed"], probe):
            pass
        # -- restarts: big, small and empty directories in turn
        for _ in range(restarts):
            for kind, root, size in (
                ("big", big, n),
                ("small", little, small),
                ("empty", empty, 0),
            ):
                probe_name = actor_name(rng.randrange(size)) if size else None
                with serving(root, tmp / f"{kind}.log", [], starts[kind], probe_name):
                    pass

        # -- 3. per-op latency, the two sizes side by side
        lat = {"big": Latency(), "small": Latency()}
        cap = ["--max-active", str(lat_cap)]
        with (
            serving(big, tmp / "lat-big.log", cap, [], None) as s_big,
            serving(little, tmp / "lat-small.log", cap, [], None) as s_small,
        ):
            pairs = [("big", s_big, n, made), ("small", s_small, small, made_small)]
            recents = {k: deque[int](maxlen=2 * lat_cap) for k in lat}
            for kind, server, population, which in pairs:  # warm-up: a few calls each
                latency_round(server, 20, population, recents[kind], rng, which, Latency())
            for r in range(rounds):
                for kind, server, population, which in pairs if r % 2 == 0 else pairs[::-1]:
                    failures += latency_round(
                        server, calls, population, recents[kind], rng, which, lat[kind]
                    )
            rss_serving = read_rss_mb(s_big.pid)

        # -- the host's own open time, in this process
        opened, first_answer = host_open_time(big)
    finally:
        t0 = time.perf_counter()
        shutil.rmtree(tmp, ignore_errors=True)
        removed = time.perf_counter() - t0

    # -- report
    big_ready = [s.ready for s in starts["big"] + starts["killed"]]
    ready_median = statistics.median(big_ready)

    def seconds(values: list[float | None]) -> str:
        return ", ".join("n/a" if v is None else f"{v:.2f}" for v in values)

    def starts_line(kind: str) -> str:
        runs = starts[kind]
        line = f"ready {seconds([x.ready for x in runs])} s"
        if any(x.first_call is not None for x in runs):
            line += f"; first actor call answered {seconds([x.first_call for x in runs])} s"
        line += f"; log line {seconds([x.serving for x in runs])} s"
        return line + f"; RSS {', '.join(f'{x.rss_mb:.0f}' for x in runs)} MB"

    print(
        "  restart, seconds from process start to the first answer (host database evicted "
        "from the page cache before each start):"
    )
    print(f"    {n:,} actors: {starts_line('big')}")
    print(f"    {n:,} actors after kill -9 ({touch:,} were open): {starts_line('killed')}")
    print(f"    {small:,} actors: {starts_line('small')}")
    print(f"    empty directory: {starts_line('empty')}")
    print(
        f"    in-process Host.open() on {n:,} actors: {opened * 1e3:.1f} ms, first call answered "
        f"at {first_answer * 1e3:.1f} ms"
    )
    # The target: a host serving all these actors (their alarms pending) after restarts and
    # after the cold calls, with --max-active bounding what it holds. What each actor held in
    # memory costs is reported below it (the touch run under the default cap of 10,000).
    rss_max = max([rss_serving] + [x.rss_mb for x in starts["big"] + starts["killed"]])
    print(
        f"  memory serving {n:,} actors: RSS after each restart "
        f"{', '.join(f'{x.rss_mb:.0f}' for x in starts['big'] + starts['killed'])} MB; after "
        f"{len(lat['big'].cold) + len(lat['big'].warm):,} calls under "
        f"--max-active {lat_cap}: {rss_serving:.0f} MB"
    )
    memory = ", ".join(f"{k} {v:.0f} MB" for k, v in rss.items())
    per_actor = (rss[f"after touching {touch:,}"] - rss["after start"]) / touch * 1024
    fds_per_actor = (fds - fds_start) / touch
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    print(
        f"  memory (default --max-active 10,000): {memory}; then {active} actors in memory, "
        f"{fds:,} open files"
    )
    print(
        f"    per actor in memory: {per_actor:.0f} KiB and {fds_per_actor:.2f} open files, so "
        f"{(TARGET_RSS_MB - rss['after start']) * 1024 / per_actor:,.0f} actors fit under "
        f"{TARGET_RSS_MB:.0f} MB and {(nofile - fds_start) / fds_per_actor:,.0f} under the "
        f"open-file limit ({nofile:,}) that `actorkeep serve` raises itself to"
    )
    for kind, label in (("big", f"{n:,}"), ("small", f"{small:,}")):
        lt = lat[kind]
        print(
            f"  per-op latency at {label} actors ({len(lt.cold)} calls): cold (opens the file) "
            f"p50 {ms(pct(lt.cold, 50))} ms p90 {ms(pct(lt.cold, 90))} ms p99 "
            f"{ms(pct(lt.cold, 99))} ms; in memory p50 {ms(pct(lt.warm, 50))} ms"
        )
    ratio = pct(lat["big"].cold, 50) / pct(lat["small"].cold, 50)
    ratio90 = pct(lat["big"].cold, 90) / pct(lat["small"].cold, 90)
    late = {k: v[0]["at"] - made.soon[k] for k, v in {**fired_overdue, **fired_future}.items()}
    print(
        f"  alarms: {len(fired_overdue)}/{len(overdue)} overdue at the restart fired (at most "
        f"{max((late[k] for k in fired_overdue), default=float('nan')):.2f} s after their time, "
        f"the host was ready {ready_at - max(made.soon[k] for k in overdue):.2f} s after it); "
        f"{len(fired_future)}/{len(future)} due while running fired, "
        f"{min((late[k] for k in fired_future), default=float('nan')):.3f} to "
        f"{max((late[k] for k in fired_future), default=float('nan')):.3f} s late"
    )
    print(f"  cleanup: {removed:.1f} s to remove the data")

    ready_ok = ready_median < TARGET_READY
    rss_ok = rss_max < TARGET_RSS_MB  # serving the directory; per-actor cost reported above
    latency_ok = ratio <= TARGET_LATENCY
    print(
        f"scale: restart ready {ready_median:.2f} s median, {max(big_ready):.2f} s max (target "
        f"< {TARGET_READY} s, {verdict(ready_ok, quick)}); memory {rss_max:.0f} MB max (target "
        f"< {TARGET_RSS_MB:.0f} MB, {verdict(rss_ok, quick)}); cold per-op latency ratio "
        f"{ratio:.2f}x at p50, {ratio90:.2f}x at p90 ({n:,} vs {small:,} actors, target <= "
        f"{TARGET_LATENCY}x, {verdict(latency_ok, quick)})"
    )
    if len(fired_overdue) != len(overdue) or len(fired_future) != len(future):
        failures.append("an alarm set to fire soon did not fire")
    if not future_pending:
        failures.append("the alarms due while running were already due at the start")
    if any(v < 0 for v in late.values()):
        failures.append("an alarm fired early")
    if any(len(v) != 1 for v in {**fired_overdue, **fired_future}.values()):
        failures.append("an alarm fired more than once")
    if not quick:
        failures += [
            f"{what} target missed"
            for what, ok in (("ready", ready_ok), ("memory", rss_ok), ("latency", latency_ok))
            if not ok
        ]
    if failures:
        print("scale: FAILED: " + "; ".join(failures[:20]))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
