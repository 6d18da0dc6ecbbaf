"""Hostile and broken input against real ``actorkeep serve`` processes, at full size.

The probes of issue 10's adversarial review, each against a fresh host on a free port of
127.0.0.1 (``tests/test_hostile.py`` and ``tests/test_damage.py`` run small forms of them in
``make test``). Each prints its figures and fails (exit 1) if the host misbehaves:

- ``h2``: raw HTTP/2 frames that ended the process (CONNECT without :path, non-ASCII :path
  and :method), 100 of each: every one answered 505, the host still up.
- ``connections``: under a 2,048-descriptor limit, 2,100 hostile connections held open (idle
  uploads of a declared 1 MiB, half request heads, bodies trickling at 1 KiB/s; each one the
  host closes is opened again at once) while a normal client makes 200 requests: their
  latency, and how many hostile connections the host had to close.
- ``creation``: one client creating actors as fast as it can through a class any name may
  create, then through a ``create="actors"`` class: actors/s, bytes on disk each, 404s/s.
- ``memory``: 32 concurrent 1 MiB bodies of empty maps, then three rounds of 32 concurrent
  bodies just under the value limit, held by their actor for a second: statuses, resident
  memory (it must plateau, not grow round after round).
- ``descriptors``: under 256 descriptors, 1,000 new actors from 16 clients: statuses.
- ``shutdown``: SIGTERM while four requests run and four wait: what each client got.
- ``damage``: the jobs example with a KV shard emptied, a ``-wal`` deleted after kill -9, a
  worker's header destroyed, ``host.sqlite`` damaged, then deleted: what clients and the log see.

    python bench/hostile.py [--quick] [--only NAME ...]
"""

from __future__ import annotations

# Run as a script, this file's directory comes first on sys.path, where bench/http.py and
# bench/queue.py would shadow the standard library modules of those names. Put the repository
# root there instead, before anything else is imported.
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _HERE:
    sys.path[0] = os.path.dirname(_HERE)

import argparse
import contextlib
import http.client
import json
import resource
import selectors
import shutil
import signal
import socket
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

from actorkeep import codec
from actorkeep.address import actor_path
from actorkeep.kv import shard_for
from bench.procs import LOOPBACK, pct, read_rss_kib
from tests.test_process import Server
from tests.test_server import H2_PROBES, PREFACE, SETTINGS

HOSTILE_APP = "tests.apps.hostile_app:app"
ROUNDS = int(os.environ.get("HOSTILE_MEMORY_ROUNDS", "3"))
JOBS_APP = "examples.jobs.app:app"


class ProbeFailed(AssertionError):
    """The host did something a probe does not allow."""


def check(ok: bool, what: str) -> None:
    if not ok:
        raise ProbeFailed(what)


@contextlib.contextmanager
def serving(app: str, data: Path, *args: str, open_files: int | None = None) -> Iterator[Server]:
    server = Server(app, data, args, open_files)
    try:
        yield server
    finally:
        server.close()


def request(
    port: int, method: str, path: str, body: bytes = b"", ctype: str = "application/json"
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=30)
    try:
        conn.request(method, path, body, {"content-type": ctype})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def raw(port: int, data: bytes) -> bytes:
    with socket.create_connection((LOOPBACK, port), timeout=10) as sock:
        sock.sendall(data)
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
        return got


# -- the probes ------------------------------------------------------------------------------


def probe_h2(tmp: Path, quick: bool) -> None:
    n = 10 if quick else 100
    with serving(HOSTILE_APP, tmp / "data", "--max-active", "100") as server:
        answers: Counter[str] = Counter()
        for name, frames in H2_PROBES.items():
            for _ in range(n):
                status_line = raw(server.port, PREFACE + SETTINGS + frames)[:12].decode()
                answers[f"{name} {status_line}"] += 1
        time.sleep(0.5)
        alive = server.proc.poll() is None
        status, _, _ = request(server.port, "POST", "/open/a/_rpc/hi", b"{}")
    print(f"h2: {dict(answers)}; host up after them: {alive}, next request {status}")
    check(alive and status == 200, "the host did not survive HTTP/2 frames")
    check(all(k.endswith("HTTP/1.1 505") for k in answers), f"not all 505: {answers}")


class Pressure:
    """Hostile connections kept open: each one the host closes is opened again."""

    OPENERS = (
        b"POST /open/h/_rpc/hi HTTP/1.1\r\nhost: t\r\ncontent-length: 1048576\r\n\r\n",
        b"GET /open/h/ HTTP/1.1\r\nhost:",
        b"POST /open/h/_rpc/hi HTTP/1.1\r\nhost: t\r\ncontent-length: 1048576\r\n\r\n",
    )  # the third kind trickles 1 KiB/s of its body

    def __init__(self, port: int, count: int) -> None:
        self.port = port
        self.count = count
        self.selector = selectors.DefaultSelector()
        self.opened = 0
        self.refused = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _open(self, kind: int) -> None:
        try:
            sock = socket.create_connection((LOOPBACK, self.port), timeout=5)
            sock.sendall(self.OPENERS[kind])
        except OSError:
            self.refused += 1
            return
        sock.setblocking(False)
        self.selector.register(sock, selectors.EVENT_READ, kind)
        self.opened += 1

    def _run(self) -> None:
        for i in range(self.count):
            self._open(i % 3)
        last_trickle = time.monotonic()
        while not self.stop.is_set():
            for key, _ in self.selector.select(timeout=0.1):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                with contextlib.suppress(OSError):
                    if sock.recv(65536):
                        pass  # an answer (408, 503): the host is closing it
                self.selector.unregister(sock)
                sock.close()
                self._open(key.data)
            if time.monotonic() - last_trickle >= 1.0:
                last_trickle = time.monotonic()
                for key in list(self.selector.get_map().values()):
                    if key.data == 2:
                        with contextlib.suppress(OSError):
                            key.fileobj.send(b"x" * 1024)  # type: ignore[union-attr]
        for key in list(self.selector.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]

    @property
    def held(self) -> int:
        return len(self.selector.get_map())


def probe_connections(tmp: Path, quick: bool) -> None:
    limit, hostile = (512, 600) if quick else (2048, 2100)
    requests = 50 if quick else 200
    with serving(HOSTILE_APP, tmp / "data", open_files=limit) as server:
        line = server.wait_for_line("actorkeep serving")
        cap = line.split("max_connections=")[1].split()[0]

        def normal_client() -> tuple[Counter[int | str], list[float]]:
            statuses: Counter[int | str] = Counter()
            ms: list[float] = []
            for i in range(requests):
                started = time.monotonic()
                status: int | str
                try:
                    status, _, _ = request(server.port, "POST", f"/open/n{i % 20}/_rpc/hi", b"{}")
                except (OSError, http.client.HTTPException) as exc:
                    status = type(exc).__name__
                ms.append((time.monotonic() - started) * 1000)
                statuses[status] += 1
            return statuses, ms

        _, calm = normal_client()  # the same requests without pressure, for comparison
        pressure = Pressure(server.port, hostile)
        started = time.monotonic()
        pressure.thread.start()
        time.sleep(2.0)
        statuses, ms = normal_client()
        held = pressure.held
        pressure.stop.set()
        pressure.thread.join()
        seconds = time.monotonic() - started
        emfile = server.stderr().count("accept failed")
    print(
        f"connections: limit {limit} fds, host cap {cap}; {hostile} hostile held for "
        f"{seconds:.0f} s ({pressure.opened:,} opened in all: each one closed by the host was "
        f"reopened; {held} open at the end); normal client {dict(statuses)}, latency p50 "
        f"{pct(ms, 50):.1f} ms, p99 {pct(ms, 99):.1f} ms, max {max(ms):.1f} ms (without the "
        f"pressure: p50 {pct(calm, 50):.1f} ms, p99 {pct(calm, 99):.1f} ms); 'accept failed' "
        f"warnings {emfile}"
    )
    check(statuses == Counter({200: requests}), f"the normal client was not served: {statuses}")
    check(max(ms) < 2000, "a normal request took over 2 s")


def probe_creation(tmp: Path, quick: bool) -> None:
    seconds = 2.0 if quick else 10.0
    data = tmp / "data"
    with serving(HOSTILE_APP, data, "--max-active", "1000") as server:
        conn = http.client.HTTPConnection(LOOPBACK, server.port, timeout=30)
        made = 0
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            conn.request("POST", f"/open/n{made}/_rpc/hi", b"{}")
            resp = conn.getresponse()
            resp.read()
            check(resp.status == 200, f"creating an actor: {resp.status}")
            made += 1
        rate = made / (time.monotonic() - started)
        refused = 0
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            conn.request("POST", f"/closed/n{refused}/_rpc/hi", b"{}")
            resp = conn.getresponse()
            resp.read()
            check(resp.status == 404, f"a closed class answered {resp.status}")
            refused += 1
        refused_rate = refused / (time.monotonic() - started)
        conn.close()
        server.stop(signal.SIGTERM, timeout=30)
    files = list((data / "actors" / "open").rglob("*.sqlite"))
    sizes = [f.stat().st_size for f in files]
    closed = list((data / "actors").glob("closed"))
    print(
        f"creation: create='anyone': {made:,} new actors in {seconds:g} s = {rate:,.0f}/s, "
        f"{statistics.mean(sizes) / 1024:.1f} KiB each on disk (min {min(sizes) / 1024:.1f}, "
        f"max {max(sizes) / 1024:.1f}); create='actors': {refused_rate:,.0f} refusals/s (404), "
        f"files made {len(closed)}"
    )
    check(len(files) == made and not closed, "files do not match what was created")


def probe_memory(tmp: Path, quick: bool) -> None:
    n = 8 if quick else 32
    bomb = b"\x81\xa4data\xdd" + (1_000_000).to_bytes(4, "big") + b"\x80" * 1_000_000
    heavy = codec.pack({"data": [[{}] * 100] * 1280, "seconds": 1.0})
    with serving(HOSTILE_APP, tmp / "data", "--max-active", "100") as server:
        before = read_rss_kib(server.proc.pid)
        rounds = (("1 MiB of empty maps", bomb), *[("129,285 values", heavy)] * ROUNDS)
        for label, body in rounds:
            statuses: list[int] = []
            peaks = [read_rss_kib(server.proc.pid)]
            done = threading.Event()

            def watch(done: threading.Event = done, peaks: list[int] = peaks) -> None:
                while not done.is_set():
                    peaks.append(read_rss_kib(server.proc.pid))
                    time.sleep(0.005)

            def send(i: int, body: bytes = body, statuses: list[int] = statuses) -> None:
                try:
                    status, _, _ = request(
                        server.port, "POST", f"/sink/s{i}/_rpc/hold", body, codec.MSGPACK
                    )
                except (OSError, http.client.HTTPException):
                    status = -1  # no answer
                statuses.append(status)

            watcher = threading.Thread(target=watch)
            watcher.start()
            started = time.monotonic()
            senders = [threading.Thread(target=send, args=(i,)) for i in range(n)]
            for t in senders:
                t.start()
            for t in senders:
                t.join()
            took = time.monotonic() - started
            done.set()
            watcher.join()
            peak = max(peaks)
            time.sleep(2.0)
            after = read_rss_kib(server.proc.pid)
            print(
                f"memory: {n} concurrent bodies of {label} ({len(body) / 1024:.0f} KiB each): "
                f"{dict(Counter(statuses))} in {took:.2f} s; RSS {before / 1024:.0f} MiB before, "
                f"peak {peak / 1024:.0f} MiB, {after / 1024:.0f} MiB 2 s after"
            )
            check((peak - before) / 1024 < 250, f"memory grew by {(peak - before) / 1024:.0f} MiB")
            check(set(statuses) <= {200, 400, 503}, f"statuses {Counter(statuses)}")
        check(server.get("/_actorkeep/health").status == 200, "host not healthy")


def probe_descriptors(tmp: Path, quick: bool) -> None:
    actors = 200 if quick else 1000
    with serving(HOSTILE_APP, tmp / "data", open_files=256) as server:
        line = server.wait_for_line("actorkeep serving")
        statuses: Counter[int] = Counter()
        lock = threading.Lock()

        def client(k: int) -> None:
            conn = http.client.HTTPConnection(LOOPBACK, server.port, timeout=30)
            for i in range(k, actors, 16):
                try:
                    conn.request("POST", f"/open/n{i}/_rpc/hi", b"{}")
                    resp = conn.getresponse()
                    resp.read()
                    status = resp.status
                except (OSError, http.client.HTTPException):
                    conn.close()
                    conn = http.client.HTTPConnection(LOOPBACK, server.port, timeout=30)
                    status = -1
                with lock:
                    statuses[status] += 1
            conn.close()

        threads = [threading.Thread(target=client, args=(k,)) for k in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        warnings = server.stderr().count("out of file descriptors")
    limits = " ".join(w for w in line.split() if w.startswith(("max_active=", "max_connections=")))
    print(
        f"descriptors: ulimit -n 256 ({limits}); {actors} new actors from 16 clients: "
        f"{dict(statuses)}; 'out of file descriptors' warnings {warnings}"
    )
    check(set(statuses) <= {200, 503}, f"statuses other than 200/503: {statuses}")


def probe_shutdown(tmp: Path, quick: bool) -> None:
    with serving(HOSTILE_APP, tmp / "data", "--graceful-timeout", "1") as server:
        got: list[tuple[str, int, str]] = []

        def call(label: str, address: str, seconds: float) -> None:
            body = json.dumps({"seconds": seconds}).encode()
            try:
                status, _, reply = request(server.port, "POST", f"/{address}/_rpc/hold", body)
                error = json.loads(reply).get("error", "") if status != 200 else ""
                got.append((label, status, error))
            except (OSError, http.client.HTTPException) as exc:
                got.append((label, -1, type(exc).__name__))

        threads = [
            threading.Thread(target=call, args=("quick", f"sink/q{i}", 0.3)) for i in range(2)
        ]
        threads += [
            threading.Thread(target=call, args=("running", f"sink/r{i}", 60)) for i in range(2)
        ]
        threads += [
            threading.Thread(target=call, args=("queued", f"sink/r{i % 2}", 1)) for i in range(4)
        ]
        for t in threads:
            t.start()
            time.sleep(0.02)
        time.sleep(0.2)
        started = time.monotonic()
        code = server.stop(signal.SIGTERM, timeout=10)
        took = time.monotonic() - started
        for t in threads:
            t.join()
    summary = Counter((label, status, error) for label, status, error in got)
    print(f"shutdown: exit {code} {took:.2f} s after SIGTERM; {dict(summary)}")
    check(code == 0, "unclean exit")
    check(all(s in (200, 503) for _, s, _ in got), f"a client got no answer: {got}")


def _files(path: Path) -> list[Path]:
    return [Path(f"{path}{suffix}") for suffix in ("", "-wal", "-shm")]


def probe_damage(tmp: Path, quick: bool) -> None:
    """Each damage alone: made, served over, reported; then repaired (the file restored from
    a copy) and released with ``actorkeep quarantine --release``."""
    data = tmp / "data"
    shard_address = f"kv/shard-{shard_for('settings/endpoint', 4)}"
    shard = actor_path(data / "actors", "kv", shard_address.partition("/")[2])
    worker = actor_path(data / "actors", "worker", "main")
    args = ("--max-active", "100")

    def put(server: Server, value: bytes) -> int:
        path = "/api/main/settings/endpoint"
        status, _, _ = request(server.port, "PUT", path, value, "text/plain")
        return status

    def run(what: Callable[[Server], object], wait: float = 0.0) -> tuple[object, str]:
        with serving(JOBS_APP, data, *args) as server:
            got = what(server)
            time.sleep(wait)
            log = server.stderr()
            server.stop(signal.SIGTERM, timeout=10)
        return got, log

    def errors(log: str, address: str) -> list[str]:
        return [ln for ln in log.splitlines() if address in ln and "[error" in ln]

    with serving(JOBS_APP, data, *args) as server:
        check(put(server, b"https://e.test/1") == 200, "first put")
        request(server.port, "POST", "/api/main/reports", b"a b c", "text/plain")
        time.sleep(1.5)  # registered
        server.stop(signal.SIGTERM, timeout=10)
    lines: list[str] = []
    # 1. An emptied shard file.
    saved = shard.read_bytes()
    shard.write_bytes(b"")
    status, log = run(lambda s: put(s, b"https://e.test/2"))
    said = errors(log, shard_address)
    lines.append(f"emptied KV shard file: PUT {status}; {len(said)} error line(s) naming it")
    check(status == 500 and len(said) == 1 and str(shard) in said[0], log)
    shard.write_bytes(saved)
    cli("quarantine", "--data", str(data), "--release", shard_address)
    # 2. kill -9 with a commit in the shard's -wal, then the -wal deleted.
    with serving(JOBS_APP, data, *args) as server:
        check(put(server, b"https://e.test/3") == 200, "put before the kill")
        server.kill()
    copies = {p: p.read_bytes() for p in _files(shard) if p.exists()}
    check(Path(f"{shard}-wal") in copies, "no -wal after kill -9")
    Path(f"{shard}-wal").unlink()
    status, log = run(lambda s: put(s, b"https://e.test/4"))
    lost = [ln for ln in log.splitlines() if "write-ahead log" in ln]
    lines.append(f"-wal deleted after kill -9: PUT {status}; quarantined for it: {bool(lost)}")
    check(status == 500 and bool(lost), log)
    for path, content in copies.items():
        path.write_bytes(content)
    cli("quarantine", "--data", str(data), "--release", shard_address)
    # 3. The polling worker's header destroyed: its alarm is not retried every 2 s.
    saved = worker.read_bytes()
    with worker.open("r+b") as f:
        f.write(b"\x00" * 100)
    watch = 5.0 if quick else 20.0
    _, log = run(lambda s: request(s.port, "GET", "/worker/main/results"), wait=watch)
    said = errors(log, "worker/main")
    lines.append(
        f"worker's header destroyed: {len(said)} error line(s) about it in {watch:g} s "
        f"(its alarm polls every second)"
    )
    check(len(said) == 1 and "quarantined" in said[0], log)
    worker.write_bytes(saved)
    cli("quarantine", "--data", str(data), "--release", "worker/main")
    # 4. host.sqlite damaged, then deleted: one clear line, rebuilt, the worker polls again.
    host_db = data / "host" / "host.sqlite"
    with host_db.open("r+b") as f:
        f.write(b"\x00" * 100)
    for label in ("host.sqlite damaged", "host.sqlite deleted"):
        status, log = run(lambda s: request(s.port, "GET", "/api/main/settings/endpoint")[0])
        said = [ln for ln in log.splitlines() if "host database" in ln and "[error" in ln]
        rebuilt = [ln for ln in log.splitlines() if "rebuilt the host database" in ln]
        figures = " ".join(w for w in (rebuilt or [""])[0].split() if "=" in w)
        lines.append(
            f"{label}: {len(said)} error line(s), then rebuilt ({figures}); a setting "
            f"read {status}; tracebacks {log.count('Traceback')}"
        )
        check(bool(rebuilt) and status == 200 and "Traceback" not in log, log)
        for path in _files(host_db):
            path.unlink(missing_ok=True)
    for line in lines:
        print(f"damage: {line}")


def cli(*args: str) -> None:
    import subprocess

    subprocess.run([sys.executable, "-m", "actorkeep", *args], check=True, capture_output=True)


PROBES: dict[str, Callable[[Path, bool], None]] = {
    "h2": probe_h2,
    "connections": probe_connections,
    "creation": probe_creation,
    "memory": probe_memory,
    "descriptors": probe_descriptors,
    "shutdown": probe_shutdown,
    "damage": probe_damage,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--only", nargs="+", choices=sorted(PROBES), help="run these probes")
    args = parser.parse_args()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # this process holds thousands
    failed = []
    for name in args.only or PROBES:
        with tempfile.TemporaryDirectory(prefix=f"hostile-{name}-") as tmp:
            try:
                PROBES[name](Path(tmp), args.quick)
            except ProbeFailed as exc:
                failed.append(name)
                print(f"{name}: FAILED: {str(exc)[-2000:]}")
                shutil.copytree(tmp, f"/tmp/hostile-failed-{name}", dirs_exist_ok=True)
    ran = len(args.only or PROBES)
    print(f"hostile: {ran - len(failed)} probes passed, {len(failed)} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
