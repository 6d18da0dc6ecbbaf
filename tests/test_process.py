"""Real host processes: ``python -m actorkeep serve`` under kill -9, signals and bad input.

Each test starts the CLI as a subprocess on a free port of 127.0.0.1 and talks to it over HTTP
with ``http.client`` (docs/reference.md §3 storage, §4 alarms, §6 HTTP front and access, §11
CLI). A host's
stderr goes to a file; it is printed (and shown by pytest) when a test fails.
"""

from __future__ import annotations

import contextlib
import http.client
import itertools
import json
import os
import resource
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from actorkeep import cli
from actorkeep.address import actor_path

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
COUNTER_APP = "examples.counter.app:app"
TEST_APP = "tests.apps.process_app:app"
MAX_BODY = 1 << 20
START_DEADLINE = 15.0  # seconds for a host to answer its health check
CLIENT_TIMEOUT = 10.0
_log_numbers = itertools.count(1)


# -- HTTP -----------------------------------------------------------------------------------


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def http_request(
    port: int,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = CLIENT_TIMEOUT,
    address: str = "127.0.0.1",
) -> Reply:
    conn = http.client.HTTPConnection(address, port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# -- the host process -----------------------------------------------------------------------


class Server:
    """One ``python -m actorkeep serve`` process; stderr goes to ``self.log``. ``address``: where
    it serves (127.0.0.1); ``prefix``: a command it runs under (``ip netns exec NS``)."""

    def __init__(
        self,
        app: str,
        data: Path,
        args: tuple[str, ...],
        open_files: int | None = None,
        address: str = "127.0.0.1",
        prefix: tuple[str, ...] = (),
    ) -> None:
        self.app = app
        self.address = address
        self.prefix = prefix
        self.data = data
        self.open_files = open_files  # RLIMIT_NOFILE of the process, soft and hard
        self.log = data.parent / f"host-{next(_log_numbers)}.stderr"
        for _ in range(3):  # another process may take the free port before the host binds it
            self.port = free_port()
            self.proc = self._spawn(args)
            if self._wait_healthy():
                return
            if "Address already in use" not in self.stderr():
                break
        self.close()
        raise AssertionError(f"host did not start (exit {self.proc.returncode}):\n{self.stderr()}")

    def _spawn(self, args: tuple[str, ...]) -> subprocess.Popen[bytes]:
        cmd = [*self.prefix, sys.executable, "-m", "actorkeep", "serve", self.app]
        cmd += ["--data", str(self.data), "--host", self.address, "--port", str(self.port), *args]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        limit = self.open_files

        def limit_files() -> None:
            if limit is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

        with self.log.open("ab") as err:
            return subprocess.Popen(
                cmd,
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=err,
                preexec_fn=limit_files,
            )

    def _wait_healthy(self) -> bool:
        deadline = time.monotonic() + START_DEADLINE
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            with contextlib.suppress(OSError, http.client.HTTPException):
                if self.get("/_actorkeep/health", timeout=1.0).status == 200:
                    return True
            time.sleep(0.02)
        return False

    # requests
    def get(self, path: str, headers: dict[str, str] | None = None, timeout: float = 10) -> Reply:
        return http_request(self.port, "GET", path, None, headers, timeout, self.address)

    def post(self, path: str, body: bytes, headers: dict[str, str] | None = None) -> Reply:
        return http_request(self.port, "POST", path, body, headers, address=self.address)

    def rpc(self, path: str, args: dict[str, Any]) -> Reply:
        return self.post(path, json.dumps(args).encode(), {"content-type": "application/json"})

    def count(self, address: str) -> int:
        reply = self.get(f"/{address}/")
        assert reply.status == 200, reply
        n: int = reply.json()["n"]
        return n

    # the process
    def stderr(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_for_line(self, text: str, deadline: float = 5.0) -> str:
        end = time.monotonic() + deadline
        while True:
            for line in self.stderr().splitlines():
                if text in line:
                    return line
            assert time.monotonic() < end, f"no line with {text!r} in stderr:\n{self.stderr()}"
            time.sleep(0.02)

    def kill(self) -> None:
        """kill -9, and wait until the process is gone."""
        self.proc.send_signal(signal.SIGKILL)
        assert self.proc.wait(timeout=10) == -signal.SIGKILL

    def stop(self, signum: signal.Signals, timeout: float = 5.0) -> int:
        """Send ``signum``; the exit code, or an assertion error if it outlives ``timeout``."""
        self.proc.send_signal(signum)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"host still running {timeout} s after {signum.name}") from None

    def start_again(self, args: tuple[str, ...]) -> None:
        """Start the host again on the same port and data (after ``stop`` or ``kill``)."""
        self.proc = self._spawn(args)
        if not self._wait_healthy():
            raise AssertionError(f"host did not start again:\n{self.stderr()}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@contextlib.contextmanager
def serve(app: str, data: Path, *args: str, open_files: int | None = None) -> Iterator[Server]:
    """A running host; always killed on exit. Its stderr is printed for pytest's report."""
    server = Server(app, data, args, open_files)
    try:
        yield server
    finally:
        server.close()
        print(f"--- stderr of {app} on port {server.port} ---\n{server.stderr()}", file=sys.stderr)


# -- helpers --------------------------------------------------------------------------------


@dataclass
class Burst:
    """Outcome of concurrent ``incr`` requests cut short by a signal to the host."""

    acked: list[int] = field(default_factory=list)  # counts returned by 200 answers
    refused: list[int] = field(default_factory=list)  # statuses of other answers
    unanswered: int = 0  # requests that got no answer: applied or not, nobody knows


def burst(
    server: Server, path: str, threads: int, acked_before: int, then: Callable[[], None]
) -> Burst:
    """Hammer ``path`` from ``threads`` keep-alive connections; once ``acked_before`` requests
    are answered, run ``then()`` (which stops the host) while requests are still in flight.
    Each thread stops at its first request without an answer, so at most one per thread is
    unanswered."""
    out = Burst()
    lock = threading.Lock()
    enough = threading.Event()
    body = json.dumps({"by": 1}).encode()

    def worker() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=CLIENT_TIMEOUT)
        try:
            while True:
                try:
                    conn.request("POST", path, body, {"content-type": "application/json"})
                    resp = conn.getresponse()
                    data = resp.read()
                except (OSError, http.client.HTTPException):
                    with lock:
                        out.unanswered += 1
                    return
                with lock:
                    if resp.status == 200:
                        out.acked.append(json.loads(data))
                        if len(out.acked) >= acked_before:
                            enough.set()
                    else:
                        out.refused.append(resp.status)
        finally:
            conn.close()

    workers = [threading.Thread(target=worker, daemon=True) for _ in range(threads)]
    for w in workers:
        w.start()
    assert enough.wait(timeout=30), f"only {len(out.acked)} answers: {out.refused}"
    then()
    for w in workers:
        w.join(timeout=CLIENT_TIMEOUT + 5)
        assert not w.is_alive(), "a client thread hangs after the host stopped"
    return out


def sqlite_files(data: Path) -> set[Path]:
    actors = data / "actors"
    return set(actors.rglob("*.sqlite")) if actors.exists() else set()


def read_only(path: Path) -> sqlite3.Connection:
    """Read a database a (live or killed) host has open, without writing to it."""
    assert path.exists(), path
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


# -- 1, 2: writes survive kill -9 -----------------------------------------------------------


@pytest.mark.parametrize("method", ["incr", "incr_durable"])
def test_acknowledged_writes_survive_kill_9(tmp_path: Path, method: str) -> None:
    """Every increment answered 200 is there after kill -9 and restart; of the requests in
    flight at the kill, at most those (one per client thread) may also have applied."""
    data = tmp_path / "data"
    path = f"/counter/a/_rpc/{method}"
    low = high = 0  # what the count may be at the next start
    threads = 8
    for cycle in ("quiet", "burst", "burst"):
        with serve(COUNTER_APP, data) as server:
            n = server.count("counter/a")
            assert low <= n <= high, (cycle, low, n, high)
            for i in range(1, 11):
                reply = server.rpc(path, {"by": 1})
                assert (reply.status, reply.json()) == (200, n + i)
            n += 10
            if cycle == "quiet":
                server.kill()
                low = high = n
                continue
            out = burst(server, path, threads, acked_before=60, then=server.kill)
            assert out.refused == []
            assert len(out.acked) >= 60
            assert out.unanswered <= threads
            # Each answer is the count just after its own increment: all distinct, all above n.
            assert len(set(out.acked)) == len(out.acked)
            assert min(out.acked) > n
            low = max(n + len(out.acked), max(out.acked))
            high = n + len(out.acked) + out.unanswered
    with serve(COUNTER_APP, data) as server:
        n = server.count("counter/a")
        assert low <= n <= high, (low, n, high)
        assert low >= 10 + 10 + 60 + 10 + 60  # the cycles did happen


# -- 3: the alarm ---------------------------------------------------------------------------


def test_alarm_survives_kill_9_and_fires_after_the_downtime(tmp_path: Path) -> None:
    data = tmp_path / "data"
    db = actor_path(data / "actors", "alarmer", "x")
    delay = 1.5
    with serve(TEST_APP, data) as server:
        reply = server.rpc("/alarmer/x/_rpc/arm", {"delay": delay})
        assert reply.status == 200, reply
        at = reply.json()["at"]
        assert abs(at - (time.time() + delay)) < 1.0
        shown = server.get("/alarmer/x/").json()
        assert (shown["alarm"], shown["fired"]) == (at, [])
        assert time.time() < at - 0.5, "too slow: the kill must come well before the alarm"
        server.kill()
    # Killed before it was due: it did not fire, and it is in the actor's file and the index.
    with contextlib.closing(read_only(db)) as conn:
        assert conn.execute("SELECT * FROM fired").fetchall() == []
        assert conn.execute("SELECT at, retry_count FROM actorkeep_alarm").fetchall() == [(at, 0)]
    with contextlib.closing(read_only(data / "host" / "host.sqlite")) as conn:
        assert conn.execute("SELECT address, at FROM alarms").fetchall() == [("alarmer/x", at)]

    time.sleep(max(0.0, at + 0.3 - time.time()))  # the host is down while the alarm falls due
    restarted_at = time.time()
    with serve(TEST_APP, data) as server:
        # Watch the actor's file, not the actor: no request may wake it, the host must.
        deadline = time.monotonic() + 5.0
        while True:
            with contextlib.closing(read_only(db)) as conn:
                fired = conn.execute("SELECT fired_at, scheduled_at, retry_count FROM fired")
                rows = fired.fetchall()
            if rows or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert len(rows) == 1, f"the overdue alarm did not fire once after the restart: {rows}"
        fired_at, scheduled_at, retry_count = rows[0]
        assert (scheduled_at, retry_count) == (at, 0)
        assert fired_at >= at  # never early
        assert fired_at >= restarted_at - 0.01  # by the new process
        assert fired_at < time.time() + 0.01
        shown = server.get("/alarmer/x/").json()
        assert shown["alarm"] is None
        assert [f["scheduled_at"] for f in shown["fired"]] == [at]
        # The index entry goes once the row's deletion is durable (a background fsync).
        deadline = time.monotonic() + 5.0
        while True:
            with contextlib.closing(read_only(data / "host" / "host.sqlite")) as conn:
                left = conn.execute("SELECT address FROM alarms").fetchall()
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert left == []


# -- 4: startup line and clean shutdown -----------------------------------------------------


def test_max_active_is_kept_within_the_open_file_limit(tmp_path: Path) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY:
        pytest.skip("no limit on open files here")
    with serve(COUNTER_APP, tmp_path / "data", "--max-active", str(hard)) as server:
        active, connections = cli.fit_open_files(hard, 1024, hard)
        warning = server.wait_for_line("the open-file limit holds fewer")
        assert f"max_active='{active} (asked {hard})'" in warning, warning
        assert f"max_connections='{connections} (asked 1024)'" in warning, warning
        assert f"open_file_limit={hard}" in warning, warning
        line = server.wait_for_line("actorkeep serving")
        assert f"max_active={active}" in line and f"max_connections={connections}" in line
        assert server.rpc("/counter/a/_rpc/incr", {"by": 1}).json() == 1


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_startup_line_and_clean_shutdown(tmp_path: Path, signum: signal.Signals) -> None:
    data = tmp_path / "data"
    # Within any open-file limit, so that no warning is due.
    with serve(COUNTER_APP, data, "--max-active", "100") as server:
        line = server.wait_for_line("actorkeep serving")
        assert f"urls=['http://127.0.0.1:{server.port}']" in line
        assert f"app={COUNTER_APP}" in line
        assert f"pid={server.proc.pid}" in line
        assert f"data={data.resolve()}" in line
        assert "classes=['counter']" in line
        assert "max_active=" in line
        for i in range(1, 6):
            assert server.rpc("/counter/a/_rpc/incr", {"by": 1}).json() == i
        # An idle keep-alive connection must not hold the shutdown up.
        idle = http.client.HTTPConnection("127.0.0.1", server.port, timeout=CLIENT_TIMEOUT)
        idle.request("GET", "/counter/a/")
        assert json.loads(idle.getresponse().read()) == {"name": "a", "n": 5}
        started = time.monotonic()
        assert server.stop(signum, timeout=5.0) == 0
        assert time.monotonic() - started < 5.0
        idle.close()
        err = server.stderr()
        lines = err.splitlines()
        shutting = [ln for ln in lines if "shutting down" in ln]
        assert len(shutting) == 1 and f"signal={signum.name}" in shutting[0], err
        assert "stopped" in lines[-1], err
        assert "Traceback" not in err
        assert "[error" not in err and "[warning" not in err, err
    with serve(COUNTER_APP, data) as server:
        assert server.count("counter/a") == 5


def test_sigterm_during_a_burst_keeps_every_answered_write(tmp_path: Path) -> None:
    data = tmp_path / "data"
    threads = 8
    with serve(COUNTER_APP, data) as server:
        codes: list[int] = []
        out = burst(
            server,
            "/counter/a/_rpc/incr",
            threads,
            acked_before=60,
            then=lambda: codes.append(server.stop(signal.SIGTERM, timeout=7.0)),
        )
        assert codes == [0], server.stderr()
        assert "stopped" in server.stderr().splitlines()[-1]
        assert "Traceback" not in server.stderr()
        # Refused requests (503 while closing) did not apply; they count as unanswered at most.
        assert set(out.refused) <= {503}, out.refused
        low = max(len(out.acked), max(out.acked))
        high = len(out.acked) + out.unanswered + len(out.refused)
    with serve(COUNTER_APP, data) as server:
        n = server.count("counter/a")
        assert low <= n <= high, (low, n, high)


# -- 5: access rules and the caller header --------------------------------------------------


def test_internal_class_refuses_outside_requests_before_creating_the_actor(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    with serve(COUNTER_APP, data, "--access", "counter=internal") as server:
        forged = {"content-type": "application/json", "x-actorkeep-caller": "counter/b"}
        for reply in (
            server.rpc("/counter/a/_rpc/incr", {"by": 1}),
            server.post("/counter/a/_rpc/incr", b'{"by": 1}', forged),
            server.get("/counter/a/"),
        ):
            assert reply.status == 403
            assert reply.json() == {
                "error": "Forbidden",
                "message": "actor class 'counter' is internal",
            }
        assert server.get("/_actorkeep/health").json() == {"status": "ok", "active": 0}
        files = sorted(p.relative_to(data).as_posix() for p in data.rglob("*") if p.is_file())
        assert not (data / "actors").exists(), files
        assert all(f.startswith("host/host.sqlite") or f == "host/lock" for f in files), files


def test_outside_clients_cannot_forge_the_caller(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with serve(TEST_APP, data, "--access", "vault=internal") as server:
        forged = {
            "X-Actorkeep-Caller": "relay/r",
            "x-actorkeep-other": "1",
            "X-Other": "kept",
        }
        reply = server.get("/echo/e/whoami", forged)
        assert reply.status == 200
        assert reply.json() == {"caller": None, "reserved": [], "x-other": "kept"}
        # A forged caller does not open an internal class either.
        reply = server.get("/vault/v/whoami", forged)
        assert reply.status == 403
        assert reply.json()["error"] == "Forbidden"
        assert sqlite_files(data) == {actor_path(data / "actors", "echo", "e")}
        # Called by an actor, the receiver sees that actor, whatever header the caller forged.
        for target in ("echo/e", "vault/v"):
            reply = server.rpc("/relay/r/_rpc/ask", {"target": target})
            assert reply.status == 200, reply
            assert reply.json() == {
                "status": 200,
                "body": {"caller": "relay/r", "reserved": ["x-actorkeep-caller"], "x-other": None},
            }
        assert actor_path(data / "actors", "vault", "v") in sqlite_files(data)


# -- 6: CLI errors --------------------------------------------------------------------------


def run_cli(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``actorkeep serve ARGS --data DATA``, expected to fail before serving."""
    cmd = [sys.executable, "-m", "actorkeep", "serve", *args, "--data", str(data)]
    return subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nocolon"], "want MODULE:APP, got 'nocolon'"),
        (["examples.counter.app:"], "want MODULE:APP, got 'examples.counter.app:'"),
        (
            ["no_such_module_xyz:app"],
            "cannot import 'no_such_module_xyz': No module named 'no_such_module_xyz'",
        ),
        (["examples.counter.app:nope"], "'examples.counter.app:nope' is not an actorkeep.App"),
        (
            ["examples.counter.app:Counter"],
            "'examples.counter.app:Counter' is not an actorkeep.App",
        ),
        (
            [COUNTER_APP, "--access", "nosuch=internal"],
            "--access names unknown actor class 'nosuch'",
        ),
        ([COUNTER_APP, "--access", "counter"], "--access wants CLASS=internal, got 'counter'"),
        (
            [COUNTER_APP, "--access", "counter=private"],
            "--access wants CLASS=internal, got 'counter=private'",
        ),
        (
            [COUNTER_APP, "--max-pending", "0"],
            "idle_timeout, max_active, max_pending and max_body must be positive",
        ),
        (
            [COUNTER_APP, "--cluster", "dbname=x", "--lease-ttl", "2", "--lease-margin", "1"],
            "need 0 < margin < ttl / 2, not ttl=2.0, margin=1.0",
        ),
        (
            [COUNTER_APP, "--cluster", "dbname=x", "--partitions", "0"],
            "partitions must be an integer from 1 to 65536, not 0",
        ),
    ],
    ids=[
        "no-colon",
        "no-attr",
        "no-module",
        "no-such-attr",
        "not-an-app",
        "unknown-class",
        "no-rule",
        "bad-rule",
        "bad-limit",
        "bad-lease",
        "bad-partitions",
    ],
)
def test_cli_errors_are_one_clear_line(tmp_path: Path, args: list[str], message: str) -> None:
    done = run_cli(tmp_path / "data", *args, "--port", str(free_port()))
    assert done.returncode == 1
    assert done.stderr == f"actorkeep: {message}\n"
    assert done.stdout == ""
    assert not (tmp_path / "data").exists()  # refused before anything was made


@pytest.mark.parametrize("problem", ["busy-port", "data-is-a-file", "no-cluster-database"])
def test_cli_environment_errors_are_one_clear_line(tmp_path: Path, problem: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1] if problem == "busy-port" else free_port()
        data = tmp_path / "data"
        if problem == "data-is-a-file":
            data.write_text("not a directory")
        cluster = ["--cluster", f"host={tmp_path} port=1 dbname=x connect_timeout=2"]
        extra = cluster if problem == "no-cluster-database" else []
        done = run_cli(data, COUNTER_APP, "--port", str(port), *extra)
    assert done.returncode == 1
    last = done.stderr.splitlines()[-1]  # after the open-file warning, where the limit is low
    assert last.startswith("actorkeep: "), done.stderr
    assert "Traceback" not in done.stderr
    if problem == "no-cluster-database":
        assert last.startswith("actorkeep: cannot reach the cluster's PostgreSQL: "), last


# -- 7: bad input over real HTTP ------------------------------------------------------------


def raw_exchange(port: int, head: bytes) -> Reply:
    """Send a request head (and no body) on a raw socket; read the one reply."""
    with socket.create_connection(("127.0.0.1", port), timeout=CLIENT_TIMEOUT) as sock:
        sock.sendall(head)
        resp = http.client.HTTPResponse(sock, method="POST")
        resp.begin()
        return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())


def test_bad_input_is_refused_and_the_host_keeps_serving(tmp_path: Path) -> None:
    data = tmp_path / "data"
    json_ct = {"content-type": "application/json"}
    with serve(TEST_APP, data) as server:

        def add(by: int) -> int:
            reply = server.rpc("/ledger/x/_rpc/add", {"by": by})
            assert reply.status == 200, reply
            n: int = reply.json()
            return n

        def refused(reply: Reply, status: int, error: str) -> str:
            assert (reply.status, reply.json()["error"]) == (status, error), reply
            assert reply.headers["content-type"] == "application/json"
            message: str = reply.json()["message"]
            return message

        assert add(2) == 2
        # Too large by Content-Length: refused before the body is read (none is sent).
        head = (
            b"POST /ledger/x/_rpc/add HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % (MAX_BODY + 1)
        )
        reply = raw_exchange(server.port, head)
        assert refused(reply, 413, "PayloadTooLarge") == f"body over {MAX_BODY} bytes"
        # Too large while streaming a chunked body (no Content-Length to go by).
        chunks = (b" " * 65536 for _ in range(MAX_BODY // 65536 + 1))
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=CLIENT_TIMEOUT)
        try:
            conn.request("POST", "/ledger/x/_rpc/add", chunks, json_ct, encode_chunked=True)
            resp = conn.getresponse()
            reply = Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
        finally:
            conn.close()
        refused(reply, 413, "PayloadTooLarge")
        # Exactly max_body is accepted.
        body = b'{"by": 3}'
        assert server.post("/ledger/x/_rpc/add", body.ljust(MAX_BODY), json_ct).json() == 5

        # Malformed bodies and arguments: 400, nothing applied, no actor created.
        assert "not valid json" in refused(
            server.post("/ledger/x/_rpc/add", b"{by", json_ct), 400, "BadRequest"
        )
        refused(server.post("/ledger/x/_rpc/add", b"[1, 2]", json_ct), 400, "BadRequest")
        refused(server.rpc("/ledger/x/_rpc/add", {"by": 1, "extra": 2}), 400, "BadRequest")
        refused(
            server.post("/ledger/x/_rpc/add", b"by=1", {"content-type": "text/plain"}),
            400,
            "BadRequest",
        )
        refused(server.post("/ledger/fresh/_rpc/add", b"{by", json_ct), 400, "BadRequest")
        # Unknown class, method, route: 404.
        assert (
            refused(server.rpc("/nosuch/a/_rpc/add", {}), 404, "NotFound")
            == "no actor class 'nosuch'"
        )
        refused(server.rpc("/ledger/x/_rpc/nosuch", {}), 404, "NotFound")
        refused(server.get("/ledger/x/nosuch"), 404, "NotFound")
        refused(server.get("/ledger"), 404, "NotFound")
        # Invalid actor names: 400, and no file.
        for name in (".hidden", "..", "a%20b", "a%2Fb", "caf%C3%A9", "n" * 201, "%2E%2E"):
            reply = server.rpc(f"/ledger/{name}/_rpc/add", {"by": 1})
            assert refused(reply, 400, "BadRequest").startswith("invalid actor name"), name
        assert sqlite_files(data) == {actor_path(data / "actors", "ledger", "x")}

        # A handler that raises: 500 with an error id (the exception stays in the log, with
        # that id), its transaction rolled back.
        reply = server.rpc("/ledger/x/_rpc/fail", {"by": 100})
        assert reply.status == 500
        assert reply.json()["error"] == "InternalError"
        error_id = reply.json()["message"].rpartition(" ")[2]
        assert "refuses" not in reply.body.decode() and "sqlite" not in reply.body.decode()
        failure = server.wait_for_line("event failed")
        assert "address=ledger/x" in failure and "error=RuntimeError" in failure
        assert f"error_id={error_id}" in failure
        assert "RuntimeError: ledger x refuses 100" in server.stderr()  # the traceback

        # The host keeps serving, and nothing refused above was applied.
        assert server.proc.poll() is None
        assert server.get("/_actorkeep/health").status == 200
        assert server.count("ledger/x") == 5
        assert add(1) == 6
    assert sqlite_files(data) == {actor_path(data / "actors", "ledger", "x")}


def test_limits_from_the_command_line(tmp_path: Path) -> None:
    with serve(COUNTER_APP, tmp_path / "data", "--max-body", "16") as server:
        ok = server.post(
            "/counter/a/_rpc/incr", b'{"by": 1234567}', {"content-type": "application/json"}
        )
        assert ok.status == 200
        big = server.post(
            "/counter/a/_rpc/incr", b'{"by": 123456789}', {"content-type": "application/json"}
        )
        assert big.status == 413
