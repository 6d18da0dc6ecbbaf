"""Schedules: many timers per actor, multiplexed on its one durable alarm (docs/schedules.md,
docs/decisions/0023-schedules.md).

An actor's schedules live in its own database, in ``actorkeep_schedule``, one row per key, with
the time it is next due. Once an actor has that table, the actor's own ``alarm()`` is a row of
it too (key ``""``), and the actor's one alarm is kept at the earliest due time of all rows: a
crash between the two writes leaves an alarm with nothing to do, never a row nothing wakes.
When the alarm fires, ``run_alarm`` runs every due row in due order, each run advancing its
row only once it has returned: at least once, never early.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, get_args
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import structlog
from cronsim import CronSim, CronSimError

from .codec import pack, unpack_counted

if TYPE_CHECKING:
    from .context import ActorContext
    from .sql import Sql

__all__ = [
    "MAX_PAYLOAD",
    "AlarmInfo",
    "Missed",
    "Schedule",
    "ScheduleRun",
    "Timetable",
    "check_cron",
    "check_schedule",
    "next_cron",
    "run_alarm",
    "timetable_of",
]

log = structlog.get_logger("actorkeep")

TABLE = "actorkeep_schedule"
#: The key of the row that stands for the actor's own ``alarm()``.
ALARM_KEY = ""
MAX_KEY = 200
#: The largest payload a schedule keeps, msgpack-encoded.
MAX_PAYLOAD = 65_536
#: Runs one alarm event makes at most; more due runs continue in the next event, at once.
MAX_RUNS_PER_EVENT = 100

#: What a cron schedule does with occurrences that passed while the actor could not run
#: (the host was down, or earlier runs were slow): run the latest once, run each in turn, or
#: skip them all and wait for the next.
Missed = Literal["once", "each", "skip"]
_MISSED = frozenset(get_args(Missed))

_SCHEMA = (
    f"""CREATE TABLE IF NOT EXISTS {TABLE} (
        key TEXT PRIMARY KEY,
        due REAL NOT NULL,
        method TEXT NOT NULL,
        payload BLOB NOT NULL,
        cron TEXT,
        tz TEXT,
        missed TEXT NOT NULL)""",
    f"CREATE INDEX IF NOT EXISTS {TABLE}_due ON {TABLE} (due, key)",
)


@dataclass(frozen=True, slots=True)
class AlarmInfo:
    """What ``alarm(self, info)`` receives: when it was due and how many retries came before."""

    scheduled_at: float
    retry_count: int


@dataclass(frozen=True, slots=True)
class Schedule:
    """One schedule as ``Actor.schedules()`` lists it; ``due`` is when it runs next."""

    key: str
    method: str
    payload: Any
    due: float
    cron: str | None
    tz: str | None
    missed: Missed


@dataclass(frozen=True, slots=True)
class ScheduleRun:
    """What a scheduled method receives: its schedule's key and payload, the time this run was
    due (for a cron schedule, the occurrence it stands for) and the retries before it."""

    key: str
    payload: Any
    due: float
    retry_count: int


# -- cron ---------------------------------------------------------------------------------------


def zone(tz: str) -> ZoneInfo:
    """The time zone named ``tz`` (IANA: ``"Europe/Riga"``), or ``ValueError``."""
    if not isinstance(tz, str) or not tz:
        raise ValueError(f"tz must be an IANA time zone name, not {tz!r}")
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"unknown time zone {tz!r}") from exc


def check_cron(cron: str, tz: str, now: float) -> None:
    """``ValueError`` unless ``cron`` (5 fields, or 6 with seconds first) parses."""
    if not isinstance(cron, str) or not cron.strip():
        raise ValueError(f"cron must be a cron expression, not {cron!r}")
    try:
        CronSim(cron, datetime.fromtimestamp(now, zone(tz)))
    except CronSimError as exc:
        raise ValueError(f"bad cron expression {cron!r}: {exc}") from exc


def next_cron(cron: str, tz: str, after: float) -> float | None:
    """The first occurrence of ``cron`` in ``tz`` strictly after ``after`` (epoch seconds), or
    None if there is none in the next 50 years. ``ValueError`` for a bad expression or zone."""
    start = datetime.fromtimestamp(after, zone(tz))
    try:
        return next(CronSim(cron, start)).timestamp()
    except CronSimError as exc:
        raise ValueError(f"bad cron expression {cron!r}: {exc}") from exc
    except StopIteration:
        return None


def last_cron(cron: str, tz: str, until: float) -> float | None:
    """The latest occurrence of ``cron`` in ``tz`` at or before ``until``, or None."""
    start = datetime.fromtimestamp(math.floor(until), zone(tz)) + timedelta(seconds=1)
    try:
        return next(CronSim(cron, start, reverse=True)).timestamp()
    except StopIteration:
        return None


# -- the table ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Row:
    key: str
    due: float
    method: str
    payload: bytes
    cron: str | None
    tz: str | None
    missed: Missed


_COLUMNS = "key, due, method, payload, cron, tz, missed"


def _schedule(
    key: str, due: float, method: str, payload: bytes, cron: str | None, tz: str | None, missed: Any
) -> Schedule:
    return Schedule(key, method, unpack_counted(payload)[0], due, cron, tz, missed)


class Timetable:
    """One actor's schedules and its own alarm, kept on its one alarm (``ctx``'s)."""

    __slots__ = ("_ctx", "_sql", "user_writes")

    def __init__(self, sql: Sql, ctx: ActorContext) -> None:
        self._sql = sql
        self._ctx = ctx
        #: Counts the actor's own set_alarm/delete_alarm: run_alarm tells from it whether the
        #: alarm() it ran set a new alarm.
        self.user_writes = 0

    @staticmethod
    def present(sql: Sql) -> bool:
        """Whether the actor's database has a schedule table."""
        found = sql.exec(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (TABLE,)
        ).fetchone()
        return found is not None

    def create(self) -> None:
        """Create the table; the actor's alarm, if set, becomes its ``alarm()`` row."""
        exec_ = self._sql.exec
        exec_("SAVEPOINT actorkeep_schedule")  # one commit, inside a transaction or not
        for statement in _SCHEMA:
            exec_(statement)
        at = self._ctx.get_alarm()
        if at is not None:
            self._write(_Row(ALARM_KEY, at, "alarm", pack(None), None, None, "once"), False)
        exec_("RELEASE actorkeep_schedule")

    # -- the actor's own alarm ------------------------------------------------------------------

    def user_alarm(self) -> float | None:
        row = self._sql.exec(f"SELECT due FROM {TABLE} WHERE key = ?", (ALARM_KEY,)).fetchone()
        return None if row is None else float(row[0])

    async def set_user_alarm(self, at: float, *, durable: bool, wait: bool) -> None:
        self.user_writes += 1
        await self._arm(at, ALARM_KEY, durable)
        self._write(_Row(ALARM_KEY, at, "alarm", pack(None), None, None, "once"), durable)
        if durable and wait:
            await self._sql.sync()

    async def delete_user_alarm(self, *, wait: bool) -> None:
        self.user_writes += 1
        self._sql.exec(f"DELETE FROM {TABLE} WHERE key = ?", (ALARM_KEY,), durable=True)
        await self.rearm(wait=wait)

    # -- schedules ------------------------------------------------------------------------------

    async def put(
        self,
        key: str,
        method: str,
        payload: bytes,
        due: float,
        cron: str | None,
        tz: str | None,
        missed: Missed,
        wait: bool,
    ) -> None:
        await self._arm(due, key, True)
        self._write(_Row(key, due, method, payload, cron, tz, missed), True)
        if wait:
            await self._sql.sync()

    async def cancel(self, key: str, wait: bool) -> bool:
        written = self._sql.exec(f"DELETE FROM {TABLE} WHERE key = ?", (key,), durable=True)
        if written.rowcount == 1:
            await self.rearm(wait=wait)
        elif wait:
            await self._sql.sync()
        return written.rowcount == 1

    def list(self) -> list[Schedule]:
        rows = self._sql.exec(
            f"SELECT {_COLUMNS} FROM {TABLE} WHERE key != ? ORDER BY due, key", (ALARM_KEY,)
        ).fetchall()
        return [_schedule(*row) for row in rows]

    def get(self, key: str) -> Schedule | None:
        row = self._sql.exec(
            f"SELECT {_COLUMNS} FROM {TABLE} WHERE key = ? AND key != ?", (key, ALARM_KEY)
        ).fetchone()
        return None if row is None else _schedule(*row)

    # -- the alarm ------------------------------------------------------------------------------

    async def rearm(self, *, wait: bool = False) -> None:
        """Keep the actor's alarm at the earliest due row, or delete it if there is none."""
        earliest = self._earliest()
        if earliest is None:
            if self._ctx.get_alarm() is not None:
                await self._ctx.delete_alarm(wait=wait)
            elif wait:
                await self._sql.sync()
        elif self._ctx.get_alarm() != earliest:
            await self._ctx.set_alarm(earliest, durable=True, wait=wait)
        elif wait:
            await self._sql.sync()

    async def _arm(self, at: float, key: str, durable: bool) -> None:
        """Before row ``key`` is written due at ``at``: keep the alarm at the earliest row
        that will then be due (gated)."""
        current = self._ctx.get_alarm()
        earliest = self._earliest(exclude=key)
        target = at if earliest is None else min(at, earliest)
        if current != target:
            await self._ctx.set_alarm(target, durable=durable, wait=False)

    def _earliest(self, exclude: str | None = None) -> float | None:
        if exclude is None:
            (due,) = self._sql.exec(f"SELECT MIN(due) FROM {TABLE}").fetchone()
        else:
            (due,) = self._sql.exec(
                f"SELECT MIN(due) FROM {TABLE} WHERE key != ?", (exclude,)
            ).fetchone()
        return None if due is None else float(due)

    def _write(self, row: _Row, durable: bool) -> None:
        params = (row.key, row.due, row.method, row.payload, row.cron, row.tz, row.missed)
        statement = f"INSERT OR REPLACE INTO {TABLE} ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)"
        if durable:
            self._sql.exec(statement, params, durable=True)
        else:
            self._sql.exec(statement, params)

    def first_due(self, now: float, alarm_ran: bool) -> _Row | None:
        """The first row due by ``now`` (not the actor's alarm if it ran in this event)."""
        row = self._sql.exec(
            f"SELECT {_COLUMNS} FROM {TABLE} WHERE due <= ? AND (key != ? OR ?) "
            "ORDER BY due, key LIMIT 1",
            (now, ALARM_KEY, not alarm_ran),
        ).fetchone()
        return None if row is None else _Row(*row)

    def advance(self, row: _Row, after: float | None) -> None:
        """After a run of ``row``: due again at ``after``, or gone (None). Gated."""
        if after is None:
            self._sql.exec(
                f"DELETE FROM {TABLE} WHERE key = ? AND due = ?", (row.key, row.due), durable=True
            )
        else:
            self._sql.exec(
                f"UPDATE {TABLE} SET due = ? WHERE key = ? AND due = ?",
                (after, row.key, row.due),
                durable=True,
            )


def timetable_of(actor: Any, create: bool = False) -> Timetable | None:
    """The actor instance's timetable (looked up once per instance), or None if it has no
    schedules; ``create``: make one."""
    timetable = actor._ak_timetable
    if timetable is False:
        timetable = Timetable(actor.sql, actor._ak) if Timetable.present(actor.sql) else None
        actor._ak_timetable = timetable
    if timetable is None and create:
        timetable = Timetable(actor.sql, actor._ak)
        timetable.create()
        actor._ak_timetable = timetable
    return timetable  # type: ignore[no-any-return]


# -- the alarm event ----------------------------------------------------------------------------


def _plan(row: _Row, now: float) -> tuple[float | None, float | None]:
    """For a due row: the due time of the run to make now (None: skip it) and when the row is
    due next (None: never)."""
    if row.cron is None:
        return row.due, None
    assert row.tz is not None
    if row.missed == "each":
        return row.due, next_cron(row.cron, row.tz, row.due)
    following = next_cron(row.cron, row.tz, now)
    if row.missed == "skip":
        on_time = (next_cron(row.cron, row.tz, row.due) or math.inf) > now
        return (row.due if on_time else None), following
    return (last_cron(row.cron, row.tz, now) or row.due), following


async def run_alarm(
    actor: Any,
    timetable: Timetable | None,
    info: AlarmInfo,
    last_try: bool,
    fatal: Callable[[Exception], bool],
) -> None:
    """One alarm event of ``actor``: its ``alarm(info)`` when it has no schedules; otherwise
    every due row in due order, then the alarm kept at the next.

    A run that raises fails the event, which the host retries as any alarm event (the rows
    run before it have advanced); on the last try (``last_try``) it is dropped with an error
    logged and the others go on, unless ``fatal(exc)`` (damaged storage).
    """
    if timetable is None:
        await actor.alarm(info)
        return
    now = actor.now()
    alarm_ran = False
    for _ in range(MAX_RUNS_PER_EVENT):
        row = timetable.first_due(now, alarm_ran)
        if row is None:
            break
        run_due, after = _plan(row, now)
        try:
            if row.key == ALARM_KEY:
                alarm_ran = True  # an alarm it sets for now fires in the next event
                writes = timetable.user_writes
                await actor.alarm(AlarmInfo(row.due, info.retry_count))
                if timetable.user_writes != writes:
                    continue  # alarm() set or deleted the alarm: its row says what is next
            elif run_due is not None:
                method = getattr(actor, row.method)
                payload = unpack_counted(row.payload)[0]
                await method(ScheduleRun(row.key, payload, run_due, info.retry_count))
            _check_closed(actor)
        except Exception as exc:
            if not last_try or fatal(exc):
                raise
            if actor.sql.in_transaction:
                actor.sql.exec("ROLLBACK")
                actor.sql.rolled_back()
            log.error(
                "scheduled run dropped after its last retry",
                address=actor.address,
                key=row.key,
                method=row.method,
                due=run_due,
                error=repr(exc),
            )
        timetable.advance(row, after)
    await timetable.rearm()


def _check_closed(actor: Any) -> None:
    if actor.sql.in_transaction:
        raise RuntimeError(
            "a scheduled run ended with a transaction still open: commit it before returning"
        )


# -- checking what schedule() is given ---------------------------------------------------------


def _seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number of seconds, not {value!r}")
    return float(value)


def check_schedule(
    cls: type,
    method: object,
    key: object,
    when: tuple[object, object, object],
    tz: object,
    missed: object,
    now: float,
) -> tuple[float, str | None, str | None]:
    """The first due time, cron and tz of a schedule, or ``ValueError``/``TypeError``."""
    if not isinstance(method, str) or method.startswith("__") or method == "alarm":
        raise ValueError(f"method must name a method of the actor other than alarm, not {method!r}")
    fn = getattr(cls, method, None)
    if fn is None or not inspect.iscoroutinefunction(fn):
        raise TypeError(f"{cls.__name__}.{method} must be an async def method")
    if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY:
        raise ValueError(f"key must be a str of 1 to {MAX_KEY} characters, not {key!r}")
    if missed not in _MISSED:
        raise ValueError(f"missed must be one of {sorted(_MISSED)}, not {missed!r}")
    at, delay, cron = when
    if sum(x is not None for x in when) != 1:
        raise ValueError("give exactly one of at=, delay= or cron=")
    if cron is not None:
        tz_name = "UTC" if tz is None else tz
        if not isinstance(cron, str) or not isinstance(tz_name, str):
            raise ValueError("cron= and tz= take str")
        check_cron(cron, tz_name, now)
        first = next_cron(cron, tz_name, now)
        if first is None:
            raise ValueError(f"cron expression {cron!r} never comes due")
        return first, cron, tz_name
    if tz is not None:
        raise ValueError("tz= goes with cron=")
    if delay is not None:
        seconds = _seconds("delay", delay)
        if seconds < 0:
            raise ValueError(f"delay must be >= 0, not {delay!r}")
        return now + seconds, None, None
    return _seconds("at", at), None, None
