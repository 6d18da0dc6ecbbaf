"""A real PostgreSQL server for tests: ``initdb`` and ``pg_ctl`` under a temporary directory,
reached over a Unix socket in that directory (no TCP port unless a test asks for one on an
address of its own), and a synchronous standby of it made with ``pg_basebackup``.

Debian's postgresql-15 puts its programs in /usr/lib/postgresql/15/bin (``make test`` installs it
when missing). PostgreSQL refuses to run as root: as root, the server runs as the ``postgres``
user that package creates.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

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
    """One PostgreSQL server: ``conninfo`` reaches its ``postgres`` database. ``listen``: an
    address to take TCP connections on as well (trusted, like the socket). ``primary``: make
    this server a streaming standby of that one (named ``standby``: ``sync_primary`` makes it
    synchronous)."""

    def __init__(
        self,
        root: Path,
        bindir: Path,
        port: int = 5432,
        listen: str = "",
        primary: Server | None = None,
    ) -> None:
        self.root = root
        self.data = root / "data"
        self.socket_dir = root / "socket"
        self.bindir = bindir
        self.port = port
        self.listen = listen
        self.primary = primary

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
            if self.primary is None:
                self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-N")
                if self.listen:
                    with (self.data / "pg_hba.conf").open("a") as hba:
                        hba.write(f"host all all {self.listen}/24 trust\n")
            else:
                p = self.primary
                self._run(
                    "pg_basebackup", "-D", str(self.data), "-h", str(p.socket_dir),
                    "-p", str(p.port), "-U", "postgres", "-R", "-X", "stream",
                )  # fmt: skip
                with (self.data / "postgresql.auto.conf").open("a") as conf:
                    conf.write(
                        f"primary_conninfo = 'host={p.socket_dir} port={p.port} user=postgres "
                        "application_name=standby'\n"
                    )
        options = (
            f"-c listen_addresses='{self.listen}' -c unix_socket_directories='{self.socket_dir}' "
            f"-p {self.port} -c fsync=on -c max_connections=50 -c wal_level=replica "
            "-c max_wal_senders=4"
        )
        log = self.root / "server.log"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(log), "-o", options, "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def kill(self) -> None:
        """kill -9 of the postmaster (its backends notice and exit)."""
        pid = int((self.data / "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
        end = time.monotonic() + 10
        while time.monotonic() < end:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.02)
        raise AssertionError(f"postmaster {pid} still alive")

    def promote(self) -> None:
        """A standby becomes a primary."""
        self._run("pg_ctl", "-D", str(self.data), "-w", "promote")

    def sql(self, statement: str, dbname: str = "postgres") -> list[tuple[Any, ...]]:
        """One statement on a database (``postgres``); its rows."""
        import psycopg

        conninfo = self.conninfo.replace("dbname=postgres", f"dbname={dbname}")
        with psycopg.connect(conninfo, autocommit=True) as conn:
            cur = conn.execute(statement)
            return cur.fetchall() if cur.description else []

    def sync_primary(self) -> None:
        """Make the primary wait for this standby at every commit, once it streams."""
        assert self.primary is not None
        self.primary.sql("ALTER SYSTEM SET synchronous_standby_names = 'standby'")
        self.primary.sql("SELECT pg_reload_conf()")
        end = time.monotonic() + 30
        while self.primary.sql(
            "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby'"
        ) != [("sync",)]:
            assert time.monotonic() < end, "the standby never became synchronous"
            time.sleep(0.05)


@contextmanager
def running_server(root: Path) -> Iterator[Server]:
    """A server started under ``root`` for the block, stopped after it."""
    bindir = pg_bin()
    if bindir is None:
        raise RuntimeError(
            "PostgreSQL is not installed (Debian: apt-get install postgresql-15; make test does it)"
        )
    server = Server(root, bindir)
    server.start()
    try:
        yield server
    finally:
        server.stop("immediate")


@contextmanager
def running_pair(primary_root: Path, standby_root: Path) -> Iterator[tuple[Server, Server]]:
    """A primary and its synchronous standby (every commit waits for the standby to have it),
    started for the block, stopped after it. Each root must be a directory of its own that
    the server's user may own (``tempfile.mkdtemp``)."""
    bindir = pg_bin()
    if bindir is None:
        raise RuntimeError("PostgreSQL is not installed")
    primary = Server(primary_root, bindir)
    primary.start()
    standby = Server(standby_root, bindir, primary=primary)
    try:
        standby.start()
        standby.sync_primary()
        yield primary, standby
    finally:
        for server in (standby, primary):
            with contextlib.suppress(subprocess.CalledProcessError):
                server.stop("immediate")


def multi_host(*servers: Server, dbname: str) -> str:
    """A conninfo that tries each server in turn and takes the one that accepts writes."""
    hosts = ",".join(str(s.socket_dir) for s in servers)
    ports = ",".join(str(s.port) for s in servers)
    return (
        f"host={hosts} port={ports} user=postgres dbname={dbname} target_session_attrs=read-write"
    )


def wait_for_a_lock_wait(probe: Any) -> None:
    """Until a backend of the test's database waits for a lock. ``probe``: a psycopg
    connection in autocommit, so that each look reads ``pg_stat_activity`` afresh."""
    deadline = time.monotonic() + 10
    while not probe.execute(
        "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND datname = current_database() AND pid <> pg_backend_pid()"
    ).fetchone():
        assert time.monotonic() < deadline, "nothing waited for the lock"
        time.sleep(0.01)
