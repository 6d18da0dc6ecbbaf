"""``actorkeep serve --reload``: a change to a Python file starts the host again."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.test_process import free_port, http_request

APP = """
import actorkeep as ak

app = ak.App()


@app.actor("v")
class V(ak.Actor):
    @ak.route("GET", "/")
    async def show(self, req: ak.Request) -> ak.Response:
        return ak.Response.json({"version": VERSION})


VERSION = 1
"""


def version(port: int) -> int | None:
    with contextlib.suppress(OSError, http.client.HTTPException):
        reply = http_request(port, "GET", "/v/a/", timeout=2)
        if reply.status == 200:
            found: int = json.loads(reply.body)["version"]
            return found
    return None


def wait_for(port: int, wanted: int | None, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while version(port) != wanted:
        assert time.monotonic() < deadline, f"never saw version {wanted}"
        time.sleep(0.1)


def test_a_changed_file_restarts_the_host_and_a_broken_one_waits_for_the_fix(
    tmp_path: Path,
) -> None:
    (tmp_path / "rapp.py").write_text(APP)
    port = free_port()
    log = tmp_path / "host.log"
    err = log.open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "actorkeep", "serve", "rapp:app", "--port", str(port), "--reload"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=err,
    )
    try:
        wait_for(port, 1)
        time.sleep(0.1)  # a new modification time, on coarse clocks too
        (tmp_path / "rapp.py").write_text(APP.replace("VERSION = 1", "VERSION = 2"))
        wait_for(port, 2)
        (tmp_path / "rapp.py").write_text("this is not Python\n")
        deadline = time.monotonic() + 30
        while "a change starts it again" not in log.read_text():  # it could not import it
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert version(port) is None and proc.poll() is None
        (tmp_path / "rapp.py").write_text(APP.replace("VERSION = 1", "VERSION = 3"))
        wait_for(port, 3)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        wait_for(port, None)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        err.close()
    assert log.read_text().count("rapp.py changed: restarting") == 3
