"""``actorkeep migrate --dry-run --data DIR MODULE:APP [CLASS]``: what an app's migrations would
do to the actor files of a data directory, tried on copies (docs/migrations.md).

Migrations apply when an actor activates, inside its first event after a deploy (decision
0027); this command tells beforehand. Each actor file of a class that declares migrations is
copied into a temporary directory with SQLite's backup API, one consistent snapshot, beside a
running host too (``inspect.read``); its pending migrations are applied to the copy as the host
would apply them (``migrations.apply``), and the copy is deleted. Nothing under the data
directory is written or created.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import sqlite3
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..address import name_from_stem
from ..app import App
from ..errors import MigrationError
from ..migrations import Step, apply, pending
from ..runtime.damage import read_address
from ..runtime.files import database_files
from ..runtime.storage import configure_connection
from .inspect import InspectError, read

#: Why the command does not migrate for real (docs/migrations.md, decision 0027).
NOT_DRY = (
    "migrations apply when an actor activates (its first event once the new app is deployed), "
    "each in a transaction with its version; this command only tries them on copies: add "
    "--dry-run"
)


@dataclass(frozen=True)
class Tried:
    """One actor file: its address, its version and the version its migrations reach on the
    copy, or why they would fail (``error``: the migration's failure, a downgrade, a file
    that cannot be read)."""

    address: str
    file: str
    version: int | None
    reached: int | None
    error: str | None = None


def add_parser(sub: Any) -> None:
    """``actorkeep migrate``."""
    about = "try an app's pending migrations on copies of a data directory's actor files"
    p = sub.add_parser("migrate", help=about, description=f"{about}: {NOT_DRY}.")
    p.add_argument("app", metavar="MODULE:APP", help="the app about to be deployed")
    p.add_argument("cls", nargs="?", metavar="CLASS", help="only this class's actors")
    p.add_argument("--data", default="./data", help="data directory (default ./data)")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="apply the migrations to copies and report; the data directory is not touched",
    )
    p.add_argument("--json", action="store_true", help="print JSON, for scripts")


def run(args: argparse.Namespace, load_app: Callable[[str], App]) -> int:
    """``actorkeep migrate``: its exit status (1 if a file would fail, 2 for bad input)."""
    if not args.dry_run:
        print(f"actorkeep migrate: {NOT_DRY}", file=sys.stderr)
        return 2
    data = Path(args.data).resolve()
    if not data.is_dir():
        print(f"actorkeep migrate: no data directory at {str(data)!r}", file=sys.stderr)
        return 2
    try:
        app = load_app(args.app)
    except SystemExit as exc:  # its one line: not MODULE:APP, not importable, not an App
        print(exc.code, file=sys.stderr)
        return 2
    except Exception as exc:  # the module raised while imported (a bad declaration)
        print(f"actorkeep migrate: cannot import {args.app!r}: {_why(exc)}", file=sys.stderr)
        return 2
    try:
        classes = migrated_classes(app, args.cls)
    except ValueError as exc:
        print(f"actorkeep migrate: {exc}", file=sys.stderr)
        return 2
    tried = dry_run(data, classes)
    if args.json:
        print(json.dumps({"files": [asdict(t) for t in tried], **tally(tried)}, indent=2))
    else:
        show(tried, classes, data)
    return 1 if any(t.error is not None for t in tried) else 0


def migrated_classes(app: App, only: str | None) -> dict[str, tuple[Step, ...]]:
    """The migrations of each of ``app``'s classes that declares some (only ``only``, if
    given); ``ValueError`` if ``app`` has no class ``only``."""
    if only is not None and only not in app.classes:
        known = ", ".join(sorted(app.classes)) or "none"
        raise ValueError(f"the app has no actor class {only!r} (its classes: {known})")
    return {
        name: ac.cls._ak_migration_steps
        for name, ac in sorted(app.classes.items())
        if (only is None or name == only) and ac.cls._ak_migration_steps
    }


def dry_run(data: Path, classes: dict[str, tuple[Step, ...]]) -> list[Tried]:
    """Try the migrations of ``classes`` on a copy of each of their actor files under
    ``data``; in address order."""
    out: list[Tried] = []
    with tempfile.TemporaryDirectory(prefix="actorkeep-migrate-") as scratch:
        for class_name, path in database_files(data / "actors"):
            steps = classes.get(class_name)
            if steps is not None:
                out.append(try_file(path, class_name, steps, Path(scratch)))
    return sorted(out, key=lambda t: t.address)


def try_file(path: Path, class_name: str, steps: tuple[Step, ...], scratch: Path) -> Tried:
    """Copy the database at ``path`` into ``scratch``, apply ``steps`` to the copy, delete it."""
    stem = path.name[: -len(".sqlite")]
    address = f"{class_name}/{name_from_stem(stem) or stem}"
    copy = scratch / "copy.sqlite"
    try:
        snapshot(path, copy, scratch)
        conn = sqlite3.connect(copy, isolation_level=None)
        # The host's pragmas (foreign keys on, among them), so the copy migrates as the
        # host's connection would; "OFF": the copy is thrown away.
        configure_connection(conn, "OFF")
    except (InspectError, sqlite3.Error, OSError) as exc:
        _remove(copy)
        return Tried(address, str(path), None, None, f"cannot copy the file: {_why(exc)}")
    version: int | None = None
    try:
        recorded = read_address(conn)
        address = recorded[0] if recorded is not None else address
        version, todo = pending(conn, steps, address)
        for step in todo:
            apply(conn, step, address)
        return Tried(address, str(path), version, version + len(todo))
    except MigrationError as exc:
        at = exc.version if version is None else version
        return Tried(address, str(path), at, None, str(exc))
    except sqlite3.Error as exc:  # damaged: the copy is as unreadable as its file
        return Tried(address, str(path), version, None, f"cannot read the file: {_why(exc)}")
    finally:
        conn.close()
        _remove(copy)


def snapshot(path: Path, to: Path, scratch: Path) -> None:
    """Write a consistent copy of the database at ``path`` to ``to``, creating nothing beside
    ``path``.

    A database with a write-ahead log but no ``-shm`` index is open in no host (a host holds
    the index while it has the file open), as after a crash: reading it in place would make
    SQLite create the index beside it, so the file and its log are copied as they are and
    the log is read from the copies. If a host opened the file meanwhile (its index appeared,
    or the files changed), the copy is taken again from beside the host, whose snapshot is
    consistent."""
    wal, shm = _beside(path, "-wal"), _beside(path, "-shm")
    if wal.exists() and not shm.exists():
        before = _identities(path, wal)
        raw = scratch / "raw.sqlite"
        try:
            shutil.copyfile(path, raw)
            shutil.copyfile(wal, _beside(raw, "-wal"))
            if not shm.exists() and _identities(path, wal) == before:
                source = sqlite3.connect(raw)
                try:
                    _copy(source, to)
                finally:
                    source.close()
                return
        finally:
            for f in (raw, _beside(raw, "-wal"), _beside(raw, "-shm")):
                _remove(f)
    read(path, functools.partial(_copy, to=to), max_steps=1 << 62)


def _copy(source: sqlite3.Connection, to: Path) -> None:
    _remove(to)
    out = sqlite3.connect(to)
    try:
        source.backup(out, pages=-1)  # all pages in one step: one snapshot
    finally:
        out.close()


def tally(tried: list[Tried]) -> dict[str, int]:
    """How many files would migrate, are at their class's last migration, would fail."""
    failing = sum(t.error is not None for t in tried)
    moving = sum(t.error is None and t.reached != t.version for t in tried)
    return {"would_migrate": moving, "current": len(tried) - failing - moving, "failing": failing}


def show(tried: list[Tried], classes: dict[str, tuple[Step, ...]], data: Path) -> None:
    """One line per file, then the summary."""
    if not classes:
        print("no class of the app declares migrations: nothing to try")
        return
    width = max((len(t.address) for t in tried), default=0)
    for t in tried:
        if t.error is not None:
            print(f"{t.address:{width}}  FAILS: {t.error}")
        elif t.reached == t.version:
            print(f"{t.address:{width}}  {t.version} (at its last migration)")
        else:
            print(f"{t.address:{width}}  {t.version} -> {t.reached}")
    n = tally(tried)
    names = ", ".join(classes)
    print(
        f"{len(tried):,} files of {names}: {n['would_migrate']:,} would migrate, "
        f"{n['current']:,} at their last migration, {n['failing']:,} would fail "
        f"(tried on copies; nothing in {data} was changed)"
    )


def _beside(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def _identities(*paths: Path) -> list[tuple[int, int, int] | None]:
    out: list[tuple[int, int, int] | None] = []
    for p in paths:
        try:
            st = p.stat()
        except FileNotFoundError:
            out.append(None)
            continue
        out.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return out


def _remove(path: Path) -> None:
    path.unlink(missing_ok=True)


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
