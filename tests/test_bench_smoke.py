"""Each benchmark in ``bench/`` runs with ``--quick``, exits 0 and prints its ratio line.

Nothing here asserts on timing: the numbers of a tiny run on a shared machine mean nothing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.mark.parametrize(
    "name", ["rpc", pytest.param("http", marks=pytest.mark.slow), "durable", "queue"]
)
def test_bench_quick_run(name: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH / f"{name}.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert any("ratio" in line for line in proc.stdout.splitlines()), proc.stdout


@pytest.mark.slow
def test_load_quick_run() -> None:
    """bench/load.py --quick: 200 clients for 5 s against a real host; no error, nothing lost."""
    proc = subprocess.run(
        [sys.executable, str(BENCH / "load.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "all checks passed" in proc.stdout, proc.stdout


@pytest.mark.slow
def test_scale_quick_run() -> None:
    """bench/scale.py --quick: 2,000 actors with alarms; restarts, latency, alarms fire."""
    proc = subprocess.run(
        [sys.executable, str(BENCH / "scale.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "latency ratio" in proc.stdout, proc.stdout
