"""Shared fixtures: a data directory per test and pytest-trio's ``autojump_clock``."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from actorkeep.runtime.ring import FsyncRing

from .pg import Server, running_server

#: tests/test_sim_plugin.py runs pytest on test files it writes.
pytest_plugins = ["pytester"]


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    path = tmp_path / "data"
    path.mkdir()
    return path


@pytest.fixture
def sync_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hosts made during the test sync in their threads, not through an io_uring (decision
    0026): for tests that hold, fail or count fdatasyncs by replacing ``storage._datasync``."""
    monkeypatch.setattr(FsyncRing, "open", classmethod(lambda cls, entries=0: None))


def sqlite_files(root: Path) -> list[Path]:
    """Every actor database under a data directory."""
    return sorted((root / "actors").rglob("*.sqlite")) if (root / "actors").exists() else []


@pytest.fixture(scope="session")
def postgres() -> Iterator[Server]:
    """A real PostgreSQL server for the session, under its own temporary directory (tests/pg.py)."""
    root = Path(tempfile.mkdtemp(prefix="actorkeep-pg-"))
    try:
        with running_server(root) as server:
            yield server
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def fresh_database(postgres: Server) -> Iterator[str]:
    """A new database on ``postgres``, dropped after; its conninfo."""
    import psycopg  # the cluster's extra (pyproject.toml), only for the tests that use it
    from psycopg import sql

    name = f"t{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres.conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield postgres.conninfo.replace("dbname=postgres", f"dbname={name}")
    with psycopg.connect(postgres.conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def pg_conninfo(postgres: Server) -> Iterator[str]:
    """A fresh database on the session's server for one test; its conninfo."""
    with fresh_database(postgres) as conninfo:
        yield conninfo


@pytest.fixture(scope="module")
def pg_module_conninfo(postgres: Server) -> Iterator[str]:
    """A fresh database on the session's server for the tests of one module."""
    with fresh_database(postgres) as conninfo:
        yield conninfo
