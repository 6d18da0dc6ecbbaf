"""Hostile and broken input against real ``actorkeep serve`` processes (docs/reliability.md).

Each test is one probe of issue 10's adversarial review, run small enough for ``make test``;
``bench/hostile.py`` runs the same probes at full size and prints the figures.
"""

from __future__ import annotations

import http.client
import json
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from actorkeep import codec
from bench.procs import read_rss_kib
from tests.test_process import COUNTER_APP, serve
from tests.test_server import H2_PROBES, PREFACE, SETTINGS

# They measure how a host copes with its own limits: alone, with no other test's load.
pytestmark = [pytest.mark.slow, pytest.mark.alone]


def raw(port: int, data: bytes, timeout: float = 5.0) -> bytes:
    """Send ``data`` on a fresh connection and read until the server closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
        return got


@pytest.mark.parametrize("frames", list(H2_PROBES.values()), ids=list(H2_PROBES))
def test_raw_http2_frames_do_not_end_the_process(tmp_path: Path, frames: bytes) -> None:
    with serve(COUNTER_APP, tmp_path / "data", "--max-active", "100") as server:
        for _ in range(3):
            reply = raw(server.port, PREFACE + SETTINGS + frames)
            assert reply.startswith(b"HTTP/1.1 505 "), reply
        time.sleep(0.5)  # the reported crash took the host down within 0.5 s
        assert server.proc.poll() is None, server.stderr()
        assert server.rpc("/counter/a/_rpc/incr", {"by": 1}).json() == 1
        assert "Traceback" not in server.stderr()


def test_a_normal_client_is_answered_while_hostile_connections_are_held(tmp_path: Path) -> None:
    """Under a 512-descriptor limit the host keeps at most a quarter of what its own files
    leave (103 connections); 600 hostile ones (idle uploads of a declared 1 MiB, half request
    lines, connections that send nothing) are held open by the client while a normal client
    makes its requests."""
    from actorkeep import cli

    with serve(COUNTER_APP, tmp_path / "data", open_files=512) as server:
        line = server.wait_for_line("actorkeep serving")
        cap = cli.fit_open_files(10_000, 1024, 512)[1]
        assert cap == (512 - cli.FILES_RESERVED) // cli.SOCKET_SHARE
        assert f"max_connections={cap}" in line, line
        hostile: list[socket.socket] = []
        openers = [
            b"POST /counter/h/_rpc/incr HTTP/1.1\r\nhost: t\r\ncontent-length: 1048576\r\n\r\n",
            b"GET /counter/h/ HTTP/1.1\r\nhost:",
            b"",
        ]
        try:
            for i in range(600):
                sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
                sock.sendall(openers[i % 3])
                hostile.append(sock)
            slowest = 0.0
            for n in range(1, 31):
                started = time.monotonic()
                reply = server.rpc("/counter/a/_rpc/incr", {"by": 1})
                slowest = max(slowest, time.monotonic() - started)
                assert reply.status == 200 and reply.json() == n, reply
            assert slowest < 2.0, slowest
            assert server.get("/_actorkeep/health").status == 200
        finally:
            for sock in hostile:
                sock.close()
        assert server.proc.poll() is None
        assert "accept failed" not in server.stderr()  # the cap kept descriptors to spare


HOSTILE_APP = "tests.apps.hostile_app:app"


def _post(
    port: int, path: str, body: bytes, content_type: str
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", path, body, {"content-type": content_type})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def test_decoded_bodies_stay_within_the_in_flight_budget(tmp_path: Path) -> None:
    """A 1 MiB body of empty maps is refused while it decodes; 32 concurrent bodies just under
    the value limit (about 8 MiB of Python objects each) are held only as far as the 64 MiB
    budget goes, the rest refused with 503, and resident memory stays bounded."""
    bomb = b"\x81\xa4data\xdd" + (1_000_000).to_bytes(4, "big") + b"\x80" * 1_000_000
    # Each held 3 s: on a loaded machine the 32 uploads may take a second or more to arrive,
    # and the first ones must still hold their share when the last come.
    heavy = codec.pack({"data": [[{}] * 100] * 1280, "seconds": 3.0})  # 129,285 values
    with serve(HOSTILE_APP, tmp_path / "data", "--max-active", "100") as server:
        started = time.monotonic()
        status, _, body = _post(server.port, "/sink/a/_rpc/hold", bomb, codec.MSGPACK)
        assert status == 400 and b"131072" in body and time.monotonic() - started < 2
        before = read_rss_kib(server.proc.pid)
        peak = before
        results: list[int] = []
        done = threading.Event()

        def watch() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, read_rss_kib(server.proc.pid))
                time.sleep(0.01)

        def send(i: int) -> None:
            status, headers, _ = _post(server.port, f"/sink/s{i}/_rpc/hold", heavy, codec.MSGPACK)
            results.append(status)
            if status == 503:
                assert headers["retry-after"] == "1"

        watcher = threading.Thread(target=watch)
        watcher.start()
        senders = [threading.Thread(target=send, args=(i,)) for i in range(32)]
        for t in senders:
            t.start()
        for t in senders:
            t.join()
        done.set()
        watcher.join()
        assert sorted(set(results)) == [200, 503], results
        assert 4 <= results.count(200) <= 8, results  # 64 MiB / about 8.3 MiB each
        assert (peak - before) / 1024 < 200, (before, peak)  # MiB over the start, at most
        assert server.get("/_actorkeep/health").status == 200


def test_a_burst_of_new_actors_under_a_low_descriptor_limit_gets_only_200_and_503(
    tmp_path: Path,
) -> None:
    """With 256 descriptors the host keeps 48 actors and 48 connections; 1,000 new actors from
    16 clients: every answer is 200 or a 503 with Retry-After, never a 500."""
    with serve(HOSTILE_APP, tmp_path / "data", open_files=256) as server:
        statuses: list[int] = []
        lock = threading.Lock()

        def client(k: int) -> None:
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
            try:
                for i in range(k, 1000, 16):
                    try:
                        conn.request("POST", f"/open/n{i}/_rpc/hi", b"{}")
                        resp = conn.getresponse()
                        resp.read()
                        status = resp.status
                        if status == 503:
                            assert resp.getheader("retry-after") == "1"
                    except (OSError, http.client.HTTPException):
                        conn.close()
                        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
                        status = -1
                    with lock:
                        statuses.append(status)
            finally:
                conn.close()

        threads = [threading.Thread(target=client, args=(k,)) for k in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(statuses) == 1000
        assert set(statuses) <= {200, 503}, sorted(set(statuses))
        assert statuses.count(200) >= 900, statuses.count(503)
        assert "Traceback" not in server.stderr()


def test_shutdown_answers_a_running_request_with_503_not_a_closed_connection(
    tmp_path: Path,
) -> None:
    with serve(HOSTILE_APP, tmp_path / "data", "--graceful-timeout", "0.5") as server:
        replies: list[tuple[int, dict[str, str], bytes]] = []
        body = json.dumps({"seconds": 30}).encode()
        slow = threading.Thread(
            target=lambda: replies.append(
                _post(server.port, "/sink/s/_rpc/hold", body, "application/json")
            )
        )
        slow.start()
        time.sleep(0.3)
        started = time.monotonic()
        assert server.stop(signal.SIGTERM, timeout=5.0) == 0
        assert time.monotonic() - started < 3.0
        slow.join(timeout=5)
        ((status, headers, reply),) = replies
        assert status == 503 and json.loads(reply)["error"] == "HostClosed"
        assert headers["connection"] == "close"
