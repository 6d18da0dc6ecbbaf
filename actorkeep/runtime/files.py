"""The file backend's directory of actor databases: listing them (for the host's rebuild and
for backups), deleting one."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from ..address import CLASS_NAME_RE, check_actor_name, name_from_stem
from .damage import read_address


def database_files(root: Path) -> Iterator[tuple[str, Path]]:
    """``(class_name, path)`` of every actor database file under ``root``
    (``<root>/<class>/<aa>/<bb>/<stem>.sqlite``; no symbolic links), in path order."""
    for class_dir in sorted(_subdirs(root)):
        if CLASS_NAME_RE.fullmatch(class_dir.name) is None:
            continue
        for outer in sorted(_subdirs(class_dir)):
            for inner in sorted(_subdirs(outer)):
                with os.scandir(inner) as entries:
                    found = [
                        Path(e.path)
                        for e in entries
                        if e.name.endswith(".sqlite") and e.is_file(follow_symlinks=False)
                    ]
                for path in sorted(found):
                    yield class_dir.name, path


def actor_files(root: Path) -> Iterator[tuple[str, str]]:
    """``(class_name, name)`` of every actor database under ``root``."""
    for class_name, path in database_files(root):
        name = _name_of(path)
        if name is not None:
            yield class_name, name


def delete_database(path: Path) -> int:
    """Delete a database with its ``-wal`` and ``-shm`` files, durably (the directory is
    synced); how many bytes they held."""
    files = [path.with_name(path.name + suffix) for suffix in ("", "-wal", "-shm")]
    size = 0
    for f in files:
        with contextlib.suppress(FileNotFoundError):
            size += f.stat().st_size
            f.unlink()
    if path.parent.exists():
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return size


def _name_of(path: Path) -> str | None:
    name = name_from_stem(path.name[: -len(".sqlite")])
    if name is not None:
        return name
    # A long name is kept as its digest; the database records the name itself.
    with contextlib.suppress(sqlite3.Error):
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            found = read_address(conn)
        finally:
            conn.close()
        if found is not None:
            name = found[0].partition("/")[2]
            with contextlib.suppress(ValueError):
                return check_actor_name(name)
    return None


def _subdirs(path: Path) -> list[Path]:
    try:
        with os.scandir(path) as entries:
            return [Path(e.path) for e in entries if e.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return []
