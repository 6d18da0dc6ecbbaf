"""Rebuild the host database from the actors' own databases.

The alarm index and the actor registry are copies of what each actor's database holds (its
``actorkeep_alarm`` row, its ``actorkeep_actor`` row). When the host database is missing while
actors exist, was damaged and set aside, or predates the registry, the host reads every actor's
database once at start and writes both again. Damaged actors found on the way are quarantined.
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog
import trio

from .alarm_index import AlarmIndex
from .alarm_store import read_alarm
from .hostdb import HostDb
from .registry import Registry
from .storage import StorageBackend, is_damage, read_address

log = structlog.get_logger("actorkeep")

#: Host database writes per transaction while rebuilding.
_BATCH = 1000
_PROGRESS_EVERY = 10_000


@dataclass(frozen=True, slots=True)
class Rebuilt:
    """What a rebuild found."""

    actors: int
    alarms: int
    quarantined: int
    unreadable: int


def rebuild_if_needed(
    storage: StorageBackend,
    host_db: HostDb,
    index: AlarmIndex,
    registry: Registry,
    now: float,
    set_aside: bool,
) -> Rebuilt | None:
    """Rebuild when the host database was damaged (``set_aside``), is new while actor files
    exist, or is from before the registry; None when it needed nothing."""
    if set_aside or (host_db.fresh and storage.has_actors()):
        if not set_aside:
            log.warning(
                "the host database is new but actors exist: rebuilding it from them",
                file=host_db.where,
            )
        return rebuild(storage, host_db, index, registry, now)
    if registry.new and not host_db.fresh:
        log.info("registering the actors of a host database from before the registry")
        return rebuild(storage, host_db, index, registry, now)
    return None


def rebuild(
    storage: StorageBackend, host_db: HostDb, index: AlarmIndex, registry: Registry, now: float
) -> Rebuilt:
    """Read every actor database of ``storage`` into ``index`` and ``registry``.

    An index entry only ever moves earlier (as when an actor is opened): an entry may guard an
    alarm whose deletion is not durable yet. Runs before the host serves anything.
    """
    started = trio.current_time()
    actors = alarms = quarantined = unreadable = 0
    conn = host_db.conn
    conn.execute("BEGIN")
    try:
        for class_name, name in storage.actors():
            address = f"{class_name}/{name}"
            try:
                db = storage.open_actor(class_name, name, existing=True)
                try:
                    identity = read_address(db.conn)
                    alarm = read_alarm(db.conn)
                finally:
                    db.close()
            except Exception as exc:
                if not is_damage(exc):
                    unreadable += 1
                    log.warning("cannot read an actor's database", address=address, error=repr(exc))
                    continue
                registry.add(address, now)
                registry.quarantine(address, getattr(exc, "reason", str(exc)), now)
                quarantined += 1
                log.error(
                    "actor quarantined: its storage is damaged",
                    address=address,
                    reason=getattr(exc, "reason", str(exc)),
                    file=getattr(exc, "where", None),
                )
                continue
            registry.add(address, identity[1] if identity is not None else now)
            if alarm is not None:
                entry = index.get(address)
                if entry is None or entry > alarm.at:
                    index.put(address, alarm.at)
                alarms += 1
            actors += 1
            if actors % _BATCH == 0:
                conn.execute("COMMIT")
                conn.execute("BEGIN")
            if actors % _PROGRESS_EVERY == 0:
                log.info("rebuilding the host database", actors=actors)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    report = Rebuilt(actors, alarms, quarantined, unreadable)
    log.info(
        "rebuilt the host database",
        actors=actors,
        alarms=alarms,
        quarantined=quarantined,
        unreadable=unreadable,
        seconds=round(trio.current_time() - started, 3),
    )
    return report
