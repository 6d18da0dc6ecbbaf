"""``ak.Actor``: the base class of every actor (docs/reference.md §2-§5)."""

from __future__ import annotations

import math
import random
import re
from typing import TYPE_CHECKING, Any, ClassVar

from .codec import pack
from .migrations import Migration, Step, check_migrations
from .schedules import (
    MAX_PAYLOAD,
    Missed,
    Schedule,
    Timetable,
    check_schedule,
    timetable_of,
)

if TYPE_CHECKING:
    import sqlalchemy

    from .calls import ActorsClient
    from .context import ActorContext
    from .sql import Sql
    from .ws import WebSocket


COUNTER_NAME = re.compile(r"[a-z][a-z0-9_.]{0,62}")
MAX_LABEL = 200
_CHECKED_COUNTERS: set[tuple[str, str]] = set()  # (counter, label) pairs already checked


def _check_counter(counter: object, label: object) -> None:
    if not isinstance(counter, str) or COUNTER_NAME.fullmatch(counter) is None:
        raise ValueError(f"counter name must match {COUNTER_NAME.pattern}, not {counter!r}")
    if not isinstance(label, str) or len(label) > MAX_LABEL:
        raise ValueError(f"label must be a str of at most {MAX_LABEL} characters")
    if len(_CHECKED_COUNTERS) < 10_000:
        _CHECKED_COUNTERS.add((counter, label))


def _outside_transaction(actor: Actor, what: str) -> None:
    if actor.sql.in_transaction:
        raise RuntimeError(f"{what}() cannot run inside a transaction: commit it first")


class Actor:
    """Subclass this and register it with ``@app.actor(name)``.

    The host creates instances with no arguments and sets ``address``, ``class_name``, ``name``,
    ``options``, ``sql`` and ``actors`` before ``setup()`` runs. Instance attributes are a cache:
    they are lost on eviction, after a failed event and on restart.
    """

    #: Refuse requests that do not come from another actor (403 before the actor is created).
    callers_only: ClassVar[bool] = False
    #: ``(request, reply)``: a WebSocket message equal to ``request`` is answered with
    #: ``reply`` by the host, without an event (the actor stays asleep): a client's ping.
    websocket_auto_reply: ClassVar[tuple[str, str] | None] = None
    #: Run a burst of queued events in one SQLite transaction, one commit for all their
    #: gated writes (docs/storage.md, "Runs"; the ready KV shards do). A failed commit, a
    #: deferred constraint say, then refuses every event of the burst.
    coalesce_writes: ClassVar[bool] = False

    #: The schema migrations of the class's databases, in order (docs/migrations.md): SQL text
    #: or functions of ``ak.MigrationSql``. Append only: the database's ``PRAGMA
    #: user_version`` counts the ones applied. Empty: the runtime leaves ``user_version`` alone.
    migrations: ClassVar[list[Migration] | tuple[Migration, ...]] = ()
    _ak_migration_steps: ClassVar[tuple[Step, ...]] = ()

    address: str
    class_name: str
    name: str
    options: dict[str, Any]
    sql: Sql
    actors: ActorsClient
    _ak: ActorContext
    _ak_db: sqlalchemy.Connection | None = None
    _ak_timetable: Timetable | bool | None = False  # False: not looked up yet (schedules.py)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Checked once, when the class is defined: a mistake fails at import.
        cls._ak_migration_steps = check_migrations(cls.__qualname__, cls.migrations)

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> None:
        """Called by ``app.mount(cls, name, **options)``: raise ``TypeError`` or ``ValueError``
        for options the class cannot take, so that a mistake fails at import, not at the first
        event. Accepts anything by default."""

    async def setup(self) -> None:
        """Runs before the first event of each instance. Create tables here."""

    def now(self) -> float:
        """The host clock in epoch seconds. Use it, not ``time.time()``."""
        return self._ak.now()

    @property
    def rng(self) -> random.Random:
        """The host's random number generator (the simulator seeds it). Use it, not ``random``."""
        return self._ak.rng

    @property
    def db(self) -> sqlalchemy.Connection:
        """A SQLAlchemy ``Connection`` on this actor's database (same connection as ``sql``).
        In a run (``coalesce_writes``) its transaction commits first: SQLAlchemy's statements
        run as outside one."""
        self.sql.settle()
        if self._ak_db is None:
            self._ak_db = self._ak.sqlalchemy_connection()
        return self._ak_db

    def buggify(self, site: str) -> bool:
        """Whether the simulator injects the fault named ``site`` here now (BUGGIFY).

        Always False outside the simulator. Use it to make legal but rare things happen often
        in simulation: ``if self.buggify("cache.evict"): self._cache.clear()``.
        """
        return self._ak.buggify(site)

    def count_metric(self, counter: str, n: int = 1, *, label: str = "") -> None:
        """Add ``n`` to the host's counter ``counter`` of this actor's class, shown at the
        admin API's ``/metrics`` (docs/operations.md). ``label`` splits the counter (a kind of
        operation, say); keep its values few: never an actor name or a user's id. Names
        starting ``queue.`` and ``kv.`` are the ready classes'."""
        if (counter, label) not in _CHECKED_COUNTERS:
            _check_counter(counter, label)
        if type(n) is not int or n < 0:
            raise ValueError(f"a counter only grows: want an int >= 0, not {n!r}")
        self._ak.count(counter, n, label)

    async def set_alarm(self, at: float, *, durable: bool = True, wait: bool = True) -> None:
        """Set the actor's one alarm to ``at`` (epoch seconds), replacing any earlier one.

        Durable when it returns. ``TypeError`` if the class has no ``alarm`` method.

        ``wait=False`` makes it a gated write (docs/storage.md): it returns without waiting
        for the actor's fsync, and the actor's replies and calls after it wait until it is
        durable. (The first alarm of an actor still waits for the host's index: an alarm
        must never be on disk where nothing would wake it.)

        ``durable=False`` writes it like ``sql.exec``: no fsync once the host's index has a
        durable entry for this actor (the first call pays one for that), and the actor's next
        durable write makes it durable. A process crash keeps it. Power loss before that may
        bring back the alarm it replaced (or none, if none was durable), and the alarm that
        comes back may fire as late as any time set since. For alarms that only need to fire
        at least once, soon: a debounce, a queue's wake-up.
        """
        if not callable(getattr(self, "alarm", None)):
            raise TypeError(f"{type(self).__name__} has no alarm() method to call")
        if isinstance(at, bool) or not isinstance(at, int | float) or not math.isfinite(at):
            raise ValueError(f"alarm time must be a finite number of epoch seconds, not {at!r}")
        timetable = timetable_of(self)
        if timetable is not None:
            await timetable.set_user_alarm(float(at), durable=durable, wait=wait)
        else:
            await self._ak.set_alarm(float(at), durable=durable, wait=wait)

    def get_alarm(self) -> float | None:
        """The time the alarm is set for, or ``None``."""
        timetable = timetable_of(self)
        return timetable.user_alarm() if timetable is not None else self._ak.get_alarm()

    async def delete_alarm(self, *, wait: bool = True) -> None:
        """Remove the alarm, if any. Durable when it returns; ``wait=False``: a gated write,
        durable before the actor's next reply or call leaves."""
        timetable = timetable_of(self)
        if timetable is not None:
            await timetable.delete_user_alarm(wait=wait)
        else:
            await self._ak.delete_alarm(wait=wait)

    async def schedule(
        self,
        method: str,
        payload: Any = None,
        *,
        at: float | None = None,
        delay: float | None = None,
        cron: str | None = None,
        tz: str | None = None,
        missed: Missed = "once",
        key: str | None = None,
        wait: bool = True,
    ) -> str:
        """Call ``await self.<method>(run)`` at ``at`` (epoch seconds), after ``delay``
        seconds, or at every occurrence of ``cron`` in time zone ``tz`` (default UTC); its key.

        ``run`` is an ``ak.ScheduleRun`` carrying ``payload`` (any msgpack value, at most
        64 KiB encoded). A schedule of the same ``key`` is replaced; without a key, a new one
        is made. ``missed`` says what a cron schedule does with occurrences that passed while
        it could not run: ``"once"`` (run the latest), ``"each"``, or ``"skip"``. Runs are at
        least once and never early; a run that raises is retried as the alarm is
        (docs/schedules.md). Durable when it returns; ``wait=False``: a gated write.
        """
        _outside_transaction(self, "schedule")
        if key is None:
            key = f"{method}-{self.rng.getrandbits(64):016x}"
        due, cron, tz = check_schedule(
            type(self), method, key, (at, delay, cron), tz, missed, self.now()
        )
        try:
            packed = pack(payload)
        except (TypeError, ValueError, OverflowError) as exc:
            raise ValueError(f"payload must be a msgpack value: {exc}") from exc
        if len(packed) > MAX_PAYLOAD:
            raise ValueError(f"payload is {len(packed)} bytes encoded; at most {MAX_PAYLOAD}")
        timetable = timetable_of(self, create=True)
        assert timetable is not None
        await timetable.put(key, method, packed, due, cron, tz, missed, wait)
        return key

    def schedules(self) -> list[Schedule]:
        """The actor's schedules, the next due first."""
        timetable = timetable_of(self)
        return [] if timetable is None else timetable.list()

    def get_schedule(self, key: str) -> Schedule | None:
        """The schedule of this key, or None."""
        timetable = timetable_of(self)
        return None if timetable is None else timetable.get(key)

    async def cancel_schedule(self, key: str, *, wait: bool = True) -> bool:
        """Remove the schedule of this key; False if there was none. Durable when it returns;
        ``wait=False``: a gated write."""
        _outside_transaction(self, "cancel_schedule")
        timetable = timetable_of(self)
        if timetable is None:
            return False
        return await timetable.cancel(key, wait)

    def websockets(self, tag: str | None = None) -> list[WebSocket]:
        """The actor's open WebSockets, oldest first (with ``tag``: those accepted with it).
        They stay open while the actor is out of memory (docs/websockets.md)."""
        return self._ak.websockets(tag)

    async def delete_all(self) -> None:
        """Delete everything this actor stored: every table, view and trigger of its database
        (their indexes with them), its ``PRAGMA user_version`` (back to 0) and its alarm.
        Durable when it returns.

        The running event goes on with the empty database; the next event gets a new instance,
        whose ``setup()`` runs again. ``RuntimeError`` inside an open transaction. The file
        keeps its size (SQLite reuses the free pages); ``actorkeep rm`` deletes the file.
        """
        await self._ak.delete_all()
        self._ak_timetable = False
