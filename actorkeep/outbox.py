"""The transactional outbox: queue messages in the same commit as the actor's own rows
(docs/queues.md#transactional-outbox, decision 0024).

``async with self.outbox.transaction():`` first sets a fallback schedule (a gated write, so
it is in the database before anything the transaction writes), then runs the block in one
transaction whose commit is gated, then delivers the rows ``outbox.send`` wrote to
``actorkeep_outbox``. A delivery is a queue send keyed by the row's identity, so a row sent
twice (a crash after the send, before the row was deleted) is queued once; the output gate
holds each send until the commit is durable, so no queue ever holds a message that power loss
could take from the outbox. Rows left (a crash, an unreachable queue) are delivered by the
fallback schedule, retried with backoff until they go.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import structlog

from .actor import Actor
from .address import split_address
from .errors import CallTimeout, RemoteError
from .queue import Client
from .schedules import ScheduleRun
from .wire.queue_checks import (
    check_body,
    check_message_key,
    check_priority,
    check_seconds,
)

if TYPE_CHECKING:
    from .sql import Sql

__all__ = ["REMEMBER", "Outbox", "OutboxActor"]

log = structlog.get_logger("actorkeep")

TABLE = "actorkeep_outbox"
#: The key of the outbox's fallback schedule.
SCHEDULE_KEY = "actorkeep:outbox"
#: Rows read per statement by a delivery.
_PAGE = 100
#: Seconds the fallback waits before it delivers what the transaction's own delivery left.
FALLBACK = 5.0
#: The longest wait between deliveries of rows a queue refused or did not answer.
MAX_RETRY = 300.0
#: Seconds a queue remembers an outbox row's key after the message is done: a row delivered
#: again within this time (after a crash between the send and the row's deletion) is not
#: queued again.
REMEMBER = 7 * 86400.0

_SCHEMA = f"""CREATE TABLE IF NOT EXISTS {TABLE} (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    queue TEXT NOT NULL,
    body BLOB NOT NULL,
    delay REAL NOT NULL,
    priority INTEGER NOT NULL,
    grp TEXT,
    created_at REAL NOT NULL)"""


class Outbox:
    """One actor's outbox (``self.outbox`` of an ``OutboxActor``)."""

    __slots__ = ("_actor", "_key_prefix", "_open")

    def __init__(self, actor: Actor) -> None:
        self._actor = actor
        self._open = False
        digest = hashlib.blake2b(actor.address.encode(), digest_size=16).hexdigest()
        self._key_prefix = f"outbox:{digest}:"

    @property
    def _sql(self) -> Sql:
        return self._actor.sql

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        """A transaction whose ``send``s are queued exactly once if it commits, never if it
        rolls back. The rows are delivered when the block ends, after the commit."""
        if self._sql.in_transaction:
            raise RuntimeError("outbox.transaction() cannot start inside a transaction")
        await self._fallback(FALLBACK)
        with self._sql.transaction(durable=True):
            self._sql.exec(_SCHEMA)
            self._open = True
            try:
                yield
            finally:
                self._open = False
        await self.deliver()

    def send(
        self,
        queue: str,
        body: bytes,
        *,
        delay: float = 0.0,
        priority: int = 0,
        group: str | None = None,
    ) -> None:
        """Queue ``body`` on ``queue`` (``"queue/emails"``) when the transaction commits."""
        if not self._open:
            raise RuntimeError(
                "outbox.send() belongs inside `async with self.outbox.transaction()`"
            )
        split_address(queue)
        self._sql.exec(
            f"INSERT INTO {TABLE} (queue, body, delay, priority, grp, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (
                queue,
                check_body(body),
                check_seconds(delay, "delay"),
                check_priority(priority),
                check_message_key(group, "group"),
                self._actor.now(),
            ),
        )

    def key_of(self, row: int) -> str | None:
        """The dedup key the queue knows outbox row ``row`` of this actor by."""
        return f"{self._key_prefix}{row}"

    def pending(self) -> int:
        """Rows committed and not delivered yet."""
        if not _has_table(self._sql):
            return 0
        (n,) = self._sql.exec(f"SELECT COUNT(*) FROM {TABLE}").fetchone()
        return int(n)

    async def deliver(self) -> bool:
        """Send the committed rows, oldest first; True if none is left. A queue that refuses
        or does not answer leaves its rows (and the ones after them) to the fallback."""
        sql = self._sql
        if not _has_table(sql):
            return True
        after = 0
        # A page at a time: a backlog behind a queue that is down is neither read whole (its
        # bodies held in memory) nor read again past the first row at each try.
        while rows := sql.exec(
            f"SELECT id, queue, body, delay, priority, grp FROM {TABLE} WHERE id > ? "
            "ORDER BY id LIMIT ?",
            (after, _PAGE),
        ).fetchall():
            for id_, queue, body, delay, priority, group in rows:
                try:
                    await Client(queue).send(
                        body,
                        delay,
                        priority,
                        key=self.key_of(id_),
                        group=group,
                        remember=REMEMBER,
                    )
                except (RemoteError, CallTimeout, ValueError) as exc:
                    log.warning(
                        "outbox delivery failed; retried later",
                        address=self._actor.address,
                        queue=queue,
                        id=id_,
                        error=f"{type(exc).__name__}: {exc}",
                    )
                    return False
                sql.exec(f"DELETE FROM {TABLE} WHERE id = ?", (id_,))
            after = rows[-1][0]
        if self._actor.get_schedule(SCHEDULE_KEY) is not None:
            await self._actor.cancel_schedule(SCHEDULE_KEY, wait=False)
        return True

    async def _fallback(self, delay: float, failures: int = 0) -> None:
        await self._actor.schedule(
            "deliver_outbox", failures, delay=delay, key=SCHEDULE_KEY, wait=False
        )

    async def retry(self, run: ScheduleRun) -> None:
        """The fallback schedule's run: deliver; if rows are left, come back with backoff."""
        if not await self.deliver():
            failures = int(run.payload or 0) + 1
            await self._fallback(min(MAX_RETRY, FALLBACK * 2.0 ** min(failures, 16)), failures)


def _has_table(sql: Sql) -> bool:
    found = sql.exec(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (TABLE,)
    ).fetchone()
    return found is not None


class OutboxActor(Actor):
    """An ``ak.Actor`` with ``self.outbox``: queue messages in the same commit as its rows."""

    _ak_outbox: Outbox | None = None

    @property
    def outbox(self) -> Outbox:
        """This actor's outbox."""
        if self._ak_outbox is None:
            self._ak_outbox = Outbox(self)
        return self._ak_outbox

    async def deliver_outbox(self, run: ScheduleRun) -> None:
        """The outbox's fallback delivery (a schedule of the outbox's own)."""
        await self.outbox.retry(run)
