"""What the benchmarks that run real host processes share: ports, stopping, /proc, percentiles."""

from __future__ import annotations

import signal
import socket
import subprocess
from pathlib import Path

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A loopback port that was free a moment ago."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def stop_process(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM, then SIGKILL after 15 s; the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    return proc.returncode


def read_rss_kib(pid: int) -> int:
    """The resident memory of a process (``VmRSS``), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def pct(values: list[float], p: float) -> float:
    """The ``p``-th percentile (nearest rank); NaN for no values."""
    s = sorted(values)
    if not s:
        return float("nan")
    return s[max(0, min(len(s) - 1, round(p / 100 * len(s) + 0.5) - 1))]
