"""SQLite databases set up as the host sets up an actor's, for the cluster's tests."""

from __future__ import annotations

import sqlite3
from pathlib import Path


def open_db(path: Path) -> sqlite3.Connection:
    """A connection as the host has (WAL, no syncs, no automatic checkpoints) to a database
    with a table ``kv (k, v)``: its log and index exist once this returns."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("CREATE TABLE IF NOT EXISTS kv (k INTEGER PRIMARY KEY, v BLOB NOT NULL)")
    return conn


def rows(conn: sqlite3.Connection) -> list[tuple[int, bytes]]:
    """Every row of ``kv``, by key."""
    return conn.execute("SELECT k, v FROM kv ORDER BY k").fetchall()
