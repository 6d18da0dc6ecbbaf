"""``actorkeep backup DEST``: a copy of a data directory, made while its host runs or not,
that ``actorkeep serve --data DEST`` serves (docs/operations.md).

Every actor's database is copied with SQLite's backup API from a read-only connection
(``inspect.open_read_only``): each copy is one consistent snapshot of its actor, taken beside
the running host. Actors are copied one after another, so the backup as a whole is not one
moment: an actor written during the backup may be newer than one copied before it, as after
any crash; each actor on its own is whole. The host database is not copied: it can be rebuilt
from the actors' files, and is, when the backup is first served, so its registry and alarm
index describe exactly the files in the backup.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

from ..address import CLASS_NAME_RE
from .inspect import InspectError, open_read_only

#: Pages copied per step of SQLite's backup: a few MiB at a time.
_PAGES_PER_STEP = 1024


def check_destination(dest: Path) -> Path:
    """``dest`` as a backup may be written there: absolute, and not an existing file or a
    non-empty directory (``InspectError``)."""
    if not dest.is_absolute():
        raise InspectError(f"the backup's destination must be an absolute path, not {dest}")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise InspectError(f"{dest} exists and is not an empty directory")
    return dest


def backup(data: Path, dest: Path) -> dict[str, Any]:
    """Copy every actor database under ``data`` to ``dest`` (checked by
    ``check_destination``); ``{"dest", "actors", "bytes", "failed": [{"file", "error"}]}``."""
    check_destination(dest)
    if dest.resolve().is_relative_to(data.resolve()):
        raise InspectError(f"the backup's destination {dest} is inside the data directory")
    actors_root = data / "actors"
    copied, size, failed = 0, 0, []
    made: set[Path] = set()
    for path in _actor_files(actors_root):
        target = dest / "actors" / path.relative_to(actors_root)
        part = target.with_name(target.name + ".part")
        try:
            if target.parent not in made:
                target.parent.mkdir(parents=True, exist_ok=True)
                made.add(target.parent)
            with open_read_only(path, max_steps=1 << 62) as source:
                out = sqlite3.connect(part)
                try:
                    source.backup(out, pages=_PAGES_PER_STEP)
                finally:
                    out.close()
            _fsync(part)
            part.replace(target)
        except (InspectError, sqlite3.Error, OSError) as exc:
            part.unlink(missing_ok=True)
            failed.append({"file": str(path), "error": str(exc)})
            continue
        copied += 1
        size += target.stat().st_size
    (dest / "host").mkdir(parents=True, exist_ok=True)
    for d in sorted(made | {dest / "host", dest / "actors", dest}, key=lambda p: -len(p.parts)):
        if d.exists():
            _fsync(d)
    return {"dest": str(dest), "actors": copied, "bytes": size, "failed": failed}


def _actor_files(actors_root: Path) -> list[Path]:
    """The actors' database files: ``<class>/<aa>/<bb>/<stem>.sqlite``."""
    found = []
    for class_dir in sorted(_dirs(actors_root)):
        if CLASS_NAME_RE.fullmatch(class_dir.name) is None:
            continue
        for outer in sorted(_dirs(class_dir)):
            for inner in sorted(_dirs(outer)):
                with os.scandir(inner) as entries:
                    found += [
                        Path(e.path)
                        for e in entries
                        if e.name.endswith(".sqlite") and e.is_file(follow_symlinks=False)
                    ]
    return found


def _dirs(path: Path) -> list[Path]:
    try:
        with os.scandir(path) as entries:
            return [Path(e.path) for e in entries if e.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return []


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
