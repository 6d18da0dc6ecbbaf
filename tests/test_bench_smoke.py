"""Each benchmark in ``bench/`` runs with ``--quick``, exits 0 and prints its result line.

Nothing here asserts on timing: the numbers of a tiny run on a shared machine mean nothing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


def run_quick(name: str, timeout: float) -> str:
    """``bench/<name>.py --quick``; its stdout (the test fails unless it exits 0)."""
    proc = subprocess.run(
        [sys.executable, str(BENCH / f"{name}.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc.stdout


@pytest.mark.parametrize(
    "name",
    ["rpc", pytest.param("http", marks=pytest.mark.slow), "durable", "kv", "kv_list", "queue"],
)
def test_bench_quick_run(name: str) -> None:
    out = run_quick(name, timeout=60)
    assert any("ratio" in line for line in out.splitlines()), out


def test_instructions_quick_run() -> None:
    out = run_quick("instructions", timeout=240)
    assert out.count("instructions per call") == 2, out


def test_gates_quick_run() -> None:
    """bench/gates.py --quick: every side runs and each target line is printed."""
    out = run_quick("gates", timeout=120)
    for what in (
        "sends per fsync", "one shard", "one caller", "ceiling here", "push fed by",
        "p99.9/p50", "floors here",
    ):  # fmt: skip
        assert what in out, out


def test_cluster_commit_quick_run() -> None:
    """bench/cluster_commit.py --quick: its own PostgreSQL, every side, both target lines."""
    out = run_quick("cluster_commit", timeout=120)
    for what in ("one write: store p50 / raw p50", "group commit, 32 writers"):
        assert what in out, out


@pytest.mark.slow
def test_cluster_failover_quick_run() -> None:
    """bench/cluster_failover.py --quick: two hosts, two kills, each timed."""
    out = run_quick("cluster_failover", timeout=180)
    assert "failover, kill -9 to the other host's first answer" in out, out


def test_cluster_actors_quick_run() -> None:
    """bench/cluster_actors.py --quick: a primary and its standby, 3 hosts, every side, each
    target line."""
    out = run_quick("cluster_actors", timeout=240)
    for line in (
        "an actor's durable write:",
        "32 callers on the shard's host:",
        "the shard's host's event loop (one thread) per put allows",
        "cores busy on average",
        "mixed load",
    ):
        assert line in out, out


@pytest.mark.slow
def test_load_quick_run() -> None:
    """bench/load.py --quick: 200 clients for 5 s against a real host; no error, nothing lost."""
    out = run_quick("load", timeout=240)
    assert "all checks passed" in out, out


@pytest.mark.slow
def test_scale_quick_run() -> None:
    """bench/scale.py --quick: 2,000 actors with alarms; restarts, latency, alarms fire."""
    out = run_quick("scale", timeout=240)
    assert "latency ratio" in out, out


@pytest.mark.slow
def test_hostile_quick_run() -> None:
    """bench/hostile.py --quick: every probe, small; each fails the run if the host misbehaves."""
    out = run_quick("hostile", timeout=240)
    assert "7 probes passed, 0 failed" in out, out
