"""Hostile and broken input against real ``actorkeep serve`` processes (docs/reliability.md).

Each test is one probe of issue 10's adversarial review, run small enough for ``make test``;
``bench/hostile.py`` runs the same probes at full size and prints the figures.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from tests.test_process import COUNTER_APP, serve
from tests.test_server import H2_PROBES, PREFACE, SETTINGS

pytestmark = pytest.mark.slow


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
    """Under a 512-descriptor limit the host keeps at most 112 connections; 600 hostile ones
    (idle uploads of a declared 1 MiB, half request lines, connections that send nothing)
    are held open by the client while a normal client makes its requests."""
    with serve(COUNTER_APP, tmp_path / "data", open_files=512) as server:
        line = server.wait_for_line("actorkeep serving")
        assert "max_connections=112" in line, line
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
        assert "accept returned" not in server.stderr()  # trio's EMFILE loop is not in play
