"""Repairs on a data directory no host serves: ``actorkeep quarantine`` and ``actorkeep clock``
(docs/reliability.md)."""

from __future__ import annotations

import contextlib
import datetime
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import trio

from ..address import actor_path, split_address
from ..runtime.hostdb import HostDb
from ..runtime.registry import Registry
from ..runtime.storage import DataDirInUse, FileStorage


@contextlib.contextmanager
def _offline_host_db(data: Path) -> Iterator[HostDb]:
    """The host database of a data directory no host is serving (``SystemExit`` otherwise)."""
    if not (data / "host" / "host.sqlite").exists():
        raise SystemExit(f"actorkeep: no host database in {str(data)!r}")
    storage = FileStorage(data)
    try:
        host_db = HostDb(storage.open_host_db())
    except DataDirInUse as exc:
        raise SystemExit(f"actorkeep: {exc}; stop it first") from None
    try:
        yield host_db
    finally:
        host_db.close()
        storage.close()


def clock(data: Path, reset: bool) -> int:
    """``actorkeep clock``: the latest host time recorded, and how it stands to the wall
    clock; ``--reset`` forgets it."""
    with _offline_host_db(data) as host_db:
        latest = host_db.get_meta("clock_high_water")
        if not isinstance(latest, int | float):
            print("no host time recorded: the next start follows the wall clock")
            return 0
        when = datetime.datetime.fromtimestamp(latest, datetime.UTC).isoformat()
        ahead = latest - time.time()
        if reset:
            host_db.delete_meta("clock_high_water")
            trio.run(host_db.sync)
            print(f"forgot the latest host time ({when}): the next start follows the wall clock")
        else:
            print(f"latest host time {when}, {ahead:+.1f} s from the wall clock now")
        return 0


def quarantine(data: Path, release: str | None) -> int:
    """``actorkeep quarantine``: print the quarantined actors, or release one."""
    with _offline_host_db(data) as host_db:
        registry = Registry(host_db)
        if release is None:
            for address, (reason, since) in sorted(registry.quarantined().items()):
                when = datetime.datetime.fromtimestamp(since, datetime.UTC).isoformat()
                print(f"{address}\t{when}\t{reason}")
            return 0
        try:
            class_name, name = split_address(release)
        except ValueError as exc:
            print(f"actorkeep: {exc}", file=sys.stderr)
            return 1
        if not registry.release(release):
            print(f"actorkeep: {release} is not quarantined", file=sys.stderr)
            return 1
        path = actor_path(data / "actors", class_name, name)
        gone = not path.exists() or path.stat().st_size == 0
        if gone:
            registry.forget(release)
        trio.run(host_db.sync)
        if gone:
            print(f"released {release}; its database is gone, so its next event starts it afresh")
        else:
            print(f"released {release}; its next event opens and checks its database again")
        return 0
