"""``actorkeep backup DEST``: a copy of a data directory, made while its host runs or not,
that ``actorkeep serve --data DEST`` serves (docs/operations.md).

Every actor's database is copied with SQLite's backup API, all its pages in one step, from a
read-only connection (``inspect.read``): each copy is one consistent snapshot of its actor,
taken beside the running host. Actors are copied one after another, so the backup as a whole
is not one moment: an actor written during the backup may be newer than one copied before
it, as after any crash; each actor on its own is whole. The host database is not copied: it
is rebuilt from the actors' files when the backup is first served, so its registry and alarm
index describe exactly the files in the backup.
"""

from __future__ import annotations

import functools
import os
import sqlite3
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ..address import actor_path, split_address
from ..runtime.files import database_files
from .inspect import InspectError, read


def check_destination(dest: Path) -> Path:
    """``dest`` as a backup may be written there: absolute, and not an existing file or a
    non-empty directory (``InspectError``)."""
    try:
        if b"\x00" in os.fsencode(dest):
            raise ValueError("a NUL in the path")
        if not dest.is_absolute():
            raise InspectError(f"the backup's destination must be an absolute path, not {dest}")
        if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
            raise InspectError(f"{dest} exists and is not an empty directory")
    except (ValueError, OSError) as exc:  # a NUL or a lone surrogate in it; unreadable
        # (UnicodeEncodeError is a ValueError)
        raise InspectError(f"not a usable destination: {exc}") from None
    return dest


def check_outside(dest: Path, data: Path) -> None:
    """``InspectError`` if ``dest`` is inside the data directory ``data``."""
    if dest.resolve().is_relative_to(data.resolve()):
        raise InspectError(f"the backup's destination {dest} is inside the data directory")


def backup(data: Path, dest: Path) -> dict[str, Any]:
    """Copy every actor database under ``data`` to ``dest`` (checked by
    ``check_destination``); ``{"dest", "actors", "bytes", "failed": [{"file", "error"}]}``."""
    check_destination(dest)
    check_outside(dest, data)
    made = _make_dirs(dest / "host")
    actors_root = data / "actors"
    copied, size, failed = 0, 0, []
    for _, path in database_files(actors_root):
        target = dest / "actors" / path.relative_to(actors_root)
        part = target.with_name(target.name + ".part")
        try:
            made |= _make_dirs(target.parent)
            read(path, functools.partial(_copy, to=part), max_steps=1 << 62)
            _fsync(part)
            part.replace(target)
        except (InspectError, sqlite3.Error, OSError) as exc:
            part.unlink(missing_ok=True)
            failed.append({"file": str(path), "error": str(exc)})
            continue
        copied += 1
        size += target.stat().st_size
    _sync_dirs(made)
    return {"dest": str(dest), "actors": copied, "bytes": size, "failed": failed}


def backup_cluster(
    addresses: Iterable[str], image: Callable[[str], bytes], dest: Path
) -> dict[str, Any]:
    """Write the database of every actor of ``addresses`` as the cluster's store holds it
    (``image(address)``: its durable state, one snapshot each) under ``dest``, laid out as a
    data directory; the same answer as ``backup``."""
    check_destination(dest)
    made = _make_dirs(dest / "host")
    copied, size, failed = 0, 0, []
    for address in addresses:
        class_name, name = split_address(address)
        target = actor_path(dest / "actors", class_name, name)
        part = target.with_name(target.name + ".part")
        try:
            data = image(address)
            if not data:
                continue  # deleted since it was listed
            made |= _make_dirs(target.parent)
            part.write_bytes(data)
            _fsync(part)
            part.replace(target)
        except Exception as exc:  # the store, the disk, or what the store holds of it
            part.unlink(missing_ok=True)
            failed.append({"file": address, "error": repr(exc)})
            continue
        copied += 1
        size += len(data)
    _sync_dirs(made)
    return {"dest": str(dest), "actors": copied, "bytes": size, "failed": failed}


def _sync_dirs(made: set[Path]) -> None:
    """Every directory that now names a new entry: the new ones, and the one above each."""
    for d in sorted(made | {p.parent for p in made}, key=lambda p: -len(p.parts)):
        _fsync(d)


def _copy(source: sqlite3.Connection, to: Path) -> None:
    to.unlink(missing_ok=True)
    out = sqlite3.connect(to)
    try:
        # All pages in one step: one read transaction, one snapshot. In steps, each write of
        # the host would start the copy again.
        source.backup(out, pages=-1)
    finally:
        out.close()


def _make_dirs(path: Path) -> set[Path]:
    """Make ``path`` and its missing parents: the ones made (``InspectError`` if it cannot)."""
    missing = []
    d = path
    while not d.exists():
        missing.append(d)
        d = d.parent
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (OSError, ValueError) as exc:
        raise InspectError(f"cannot make {path}: {exc}") from None
    return set(missing)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
