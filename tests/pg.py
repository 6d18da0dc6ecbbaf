"""A real PostgreSQL server for tests: ``initdb`` and ``pg_ctl`` under a temporary directory,
reached over a Unix socket in that directory (no TCP port, nothing shared with the machine).

Debian's postgresql-15 puts its programs in /usr/lib/postgresql/15/bin (``.ci/run`` installs it
when missing). PostgreSQL refuses to run as root: as root, the server runs as the ``postgres``
user that package creates.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PG_BIN_DIRS = [Path(f"/usr/lib/postgresql/{v}/bin") for v in (17, 16, 15)]


def pg_bin() -> Path | None:
    """The directory of ``initdb`` and ``pg_ctl``, or None if PostgreSQL is not installed."""
    for d in PG_BIN_DIRS:
        if (d / "initdb").exists() and (d / "pg_ctl").exists():
            return d
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def _as_server_user(argv: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return argv
    return ["runuser", "-u", "postgres", "--", *argv]


class Server:
    """One PostgreSQL server: ``conninfo`` reaches its ``postgres`` database."""

    def __init__(self, root: Path, bindir: Path, port: int = 5432) -> None:
        self.root = root
        self.data = root / "data"
        self.socket_dir = root / "socket"
        self.bindir = bindir
        self.port = port

    @property
    def conninfo(self) -> str:
        return f"host={self.socket_dir} port={self.port} user=postgres dbname=postgres"

    def _run(self, *argv: str) -> None:
        subprocess.run(
            _as_server_user([str(self.bindir / argv[0]), *argv[1:]]),
            check=True,
            capture_output=True,
            timeout=120,
        )

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
            shutil.chown(self.socket_dir, "postgres", "postgres")
        if not self.data.exists():
            self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-N")
        options = (
            f"-c listen_addresses='' -c unix_socket_directories='{self.socket_dir}' "
            f"-p {self.port} -c fsync=on -c max_connections=50"
        )
        log = self.root / "server.log"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(log), "-o", options, "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")


@contextmanager
def running_server(root: Path) -> Iterator[Server]:
    """A server started under ``root`` for the block, stopped after it."""
    bindir = pg_bin()
    if bindir is None:
        raise RuntimeError(
            "PostgreSQL is not installed (Debian: apt-get install postgresql-15; .ci/run does it)"
        )
    server = Server(root, bindir)
    server.start()
    try:
        yield server
    finally:
        server.stop("immediate")
