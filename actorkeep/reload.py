"""``actorkeep serve --reload``: for development, serve in a child process and start it again
whenever a Python file under the current directory changes (docs/getting-started.md).

The child is the same ``actorkeep serve`` without ``--reload``. A change stops it as SIGTERM
does (requests running get their graceful time, the host closes its actors' files), then a new
one starts on the same data directory. Files are watched by polling their modification times
twice a second: no dependency, and enough for a source tree.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

POLL = 0.5  # seconds between looks at the files
#: Seconds a stopping host gets before it is killed (its graceful time is 5 s by default).
STOP_WAIT = 30.0
#: Folders never watched: caches, virtual environments, version control, data.
SKIPPED = frozenset({".git", ".venv", "venv", "__pycache__", "node_modules", ".mypy_cache"})


def python_files(root: Path, skip: Path | None = None) -> Iterator[Path]:
    """The ``.py`` files under ``root``, outside ``SKIPPED`` folders and ``skip``."""
    for folder, dirs, files in os.walk(root):
        dirs[:] = [
            d
            for d in dirs
            if d not in SKIPPED and not d.startswith(".") and Path(folder, d) != skip
        ]
        for name in files:
            if name.endswith(".py"):
                yield Path(folder, name)


def snapshot(root: Path, skip: Path | None = None) -> dict[Path, float]:
    """Each watched file's modification time."""
    times = {}
    for path in python_files(root, skip):
        try:
            times[path] = path.stat().st_mtime
        except OSError:  # gone meanwhile, a dangling or looping link: not watched
            continue
    return times


def supervise(argv: list[str], data: Path) -> int:
    """Run ``actorkeep serve`` with ``argv`` (``--reload`` left out) until SIGINT or SIGTERM,
    starting it again after each change; the last child's exit status."""
    root = Path.cwd()
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    command = [sys.executable, "-m", "actorkeep", *argv]
    seen = snapshot(root, data)
    while True:
        child = subprocess.Popen(command)
        try:
            changed = _wait_for_change(child, root, data, seen, lambda: stopping)
        finally:
            _stop(child)
        if stopping:
            return child.returncode or 0
        if changed is None:  # the child ended by itself (an import error, a port in use)
            print("actorkeep: the host stopped; a change starts it again", file=sys.stderr)
            changed = _wait_for_change(None, root, data, seen, lambda: stopping)
            if changed is None:
                return child.returncode or 0
        print(f"actorkeep: {changed.relative_to(root)} changed: restarting", file=sys.stderr)
        seen = snapshot(root, data)


def _stop(child: subprocess.Popen[bytes]) -> None:
    """Stop ``child`` as SIGTERM does; kill it if it is not gone after its graceful time."""
    if child.poll() is None:
        child.send_signal(signal.SIGTERM)
    try:
        child.wait(timeout=STOP_WAIT)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def _wait_for_change(
    child: subprocess.Popen[bytes] | None,
    root: Path,
    data: Path,
    seen: dict[Path, float],
    stopping: Callable[[], bool],
) -> Path | None:
    """The first file that changed since ``seen``; None if ``child`` ended first or a signal
    came."""
    while not stopping():
        if child is not None and child.poll() is not None:
            return None
        time.sleep(POLL)
        now = snapshot(root, data)
        if now != seen:
            changed = [p for p in now.keys() | seen.keys() if now.get(p) != seen.get(p)]
            return sorted(changed)[0]
    return None
