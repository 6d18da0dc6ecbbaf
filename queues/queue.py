"""``queues.Queue``: one actor per queue (docs/reference.md §8, docs/decisions/0008-queues.md).

Messages live in ``actorkeep_queue``. One time column, ``visible_at``, orders and schedules
everything: a ready message has ``visible_at <= now``; a delayed one has ``visible_at > now``
and ``leased = 0``; a leased one has ``visible_at > now`` (the lease's end) and ``leased = 1``.
A lease that runs out is simply visible again (``visible_at <= now``), with ``leased`` still 1
until it is leased again or retried, so ``(id, attempts)`` stays the current lease until then.

Keys, groups, per-message expiry and attempts are columns of the same rows (schema.py,
sending.py). Plain sends are one durable multi-row INSERT. A pull ``lease`` is made durable
before it answers, so a lease name ``(id, attempt)`` a worker holds is never handed out
again, not even after power loss. Settle and extend, and the leases of push delivery (whose
names never leave the alarm event), use plain writes: losing one to power loss means a
message is delivered again, which at-least-once allows. Dead-lettering moves rows in one
transaction. The one alarm is kept at the earliest time anything is due: the next visible
message and lease end (push queues), the end of a lease on its last attempt and the next
expiry (every queue: they must reach the dead letters), and the next dead letter past its
retention.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import structlog

import actorkeep as ak
from actorkeep import wire
from actorkeep.wire import MSGPACK_HEADERS
from actorkeep.wire.queue import (
    CONFIG_FIELDS,
    DELIVER,
    Ack,
    Bury,
    Config,
    Lease,
    Outcome,
    Retry,
    State,
    lease_to_wire,
)
from actorkeep.wire.queue_checks import MAX_ERROR

from . import limits, schema
from .groups import check_ids, link, next_id, set_tails, unlink
from .order import earliest_head, leasable
from .recurring import RECURRING_PREFIX, Recurring, check_recurring
from .sending import PLAIN, SendOptions, insert

log = structlog.get_logger("actorkeep")


def backoff(attempts: int, base: float, cap: float, rand: float) -> float:
    """Equal-jitter backoff after the ``attempts``-th lease: ``d = min(cap, base * 2**(n-1))``,
    then ``d/2 + rand * d/2`` with ``rand`` in [0, 1)."""
    exponent = min(max(attempts, 1) - 1, 1100)  # 2.0**1100 would overflow; the cap applies anyway
    d = cap if exponent > 1023 else min(cap, base * 2.0**exponent)
    return d / 2 + rand * (d / 2)


def attempt_counts(sql: ak.Sql, least: int) -> Iterator[int]:
    """Each ``attempts`` from ``least`` up that a message leased before has, one seek each in
    the index of those messages: usually one, the queue's ``max_attempts``. (A range
    ``attempts >= ?`` beside the index's own ``attempts > 0`` read every message leased
    before: SQLite took the constant bound.)"""
    while True:
        (found,) = sql.exec(
            "SELECT MIN(attempts) FROM actorkeep_queue WHERE attempts >= ? AND attempts > 0",
            (least,),
        ).fetchone()
        if found is None:
            return
        yield found
        least = found + 1


#: The visible messages with one count of attempts and no ``max_attempts`` of their own: a
#: range of the index of messages leased before (``attempts > 0`` lets SQLite use it).
OUT_OF_ATTEMPTS = "attempts = ? AND attempts > 0 AND visible_at <= ? AND max_attempts IS NULL"
MAX_ATTEMPTS_REASON = "max attempts exceeded"
#: Messages one sweep moves to the dead letters at most: 100,000 messages expiring together
#: would otherwise hold the queue for seconds in one event (a log line each).
SWEEP_BATCH = 500
EXPIRED_REASON = "expired"
#: A push queue keeps its alarm this many seconds after its last delivery, and alarms due
#: within this many seconds are set without an fsync (``set_alarm(durable=False)``): a send to
#: a busy or recently busy queue pays one fsync, its insert (decision 0008).
LINGER = 2.0

_CONFIG_COLUMNS = ", ".join(CONFIG_FIELDS)
#: Dead letters a redrive reads and moves at a time: a bounded part of them in memory (their
#: bodies may be up to 1 MiB each), in one INSERT of seven parameters each.
_REDRIVE_ROWS = 100


def _marks(n: int) -> str:
    """``?,?,...``: ``n`` parameters."""
    return ",".join("?" * n)


class Queue(ak.Actor):
    """A durable queue: pull (``lease``/``ack``) or push (``Config(consumer=...)``).

    Answers only other actors (``callers_only``); ``allow=[...]`` at mount narrows the callers.
    """

    callers_only: ClassVar[bool] = True
    cfg: Config

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> None:
        """``configs={"name": ak.queue.Config(...)}``: the settings of the queues of those
        names until ``configure()`` stores others (which then win). ``recurring={"name":
        [queues.Recurring(...)]}``: messages those queues send themselves on a cron."""
        unknown = set(options) - {"configs", "recurring"}
        if unknown:
            raise TypeError(
                f"a Queue takes the options configs and recurring, not {sorted(unknown)}"
            )
        configs = options.get("configs", {})
        if not isinstance(configs, dict) or not all(
            isinstance(k, str) and isinstance(v, Config) for k, v in configs.items()
        ):
            raise TypeError("configs maps queue names to ak.queue.Config")
        check_recurring(options.get("recurring", {}))

    async def setup(self) -> None:
        schema.create(self.sql)
        row = self.sql.exec(
            f"SELECT {_CONFIG_COLUMNS} FROM actorkeep_queue_config WHERE id = 0"
        ).fetchone()
        if row is not None:
            self.cfg = Config(*row)
        else:  # as mounted, until configure() stores settings of its own
            self.cfg = self.options.get("configs", {}).get(self.name, Config())
            if self.cfg.consumer is not None:
                # Messages sent before the mount named a consumer wait for the alarm: arm it,
                # as configure() does.
                due = self.next_due()
                if due is not None:
                    await self.arm_by(due)
        await self._declare_recurring()

    # -- the protocol: one handler per operation of actorkeep.wire.queue, each given its
    # checked frame (checked before the queue was opened: a refused frame creates no file)

    @wire.queue.SEND.handler
    async def op_send(self, a: dict[str, Any]) -> dict[str, Any]:
        opts = PLAIN
        if (
            a["keys"] is not None
            or a["groups"] is not None
            or a["expires"] is not None
            or a["max_attempts"] is not None
        ):
            opts = SendOptions.from_frame(a)
        return {"ids": await self.send(a["bodies"], a["delay"], a["priority"], opts)}

    @wire.queue.LEASE.handler
    async def op_lease(self, a: dict[str, Any]) -> dict[str, Any]:
        leases = await self.pull_lease(a["max"], a["visibility"], a["worker"])
        return {"leases": [lease_to_wire(x) for x in leases]}

    @wire.queue.SETTLE.handler
    async def op_settle(self, a: dict[str, Any]) -> dict[str, Any]:
        outcomes: list[Outcome] = a["outcomes"]
        results, earliest = self.settle(self.now(), outcomes)
        if self.cfg.consumer is not None:
            if limits.limited(self.cfg):
                earliest = self.next_due()  # a lease that ended may let the next one go
            if earliest is not None:
                await self.arm_by(earliest)
        return {"results": results}

    @wire.queue.EXTEND.handler
    async def op_extend(self, a: dict[str, Any]) -> dict[str, Any]:
        i, attempt = a["id"], a["attempt"]
        until = self.now() + a["visibility"]
        row = self.sql.exec(
            "UPDATE actorkeep_queue SET visible_at = ? "
            "WHERE id = ? AND leased = 1 AND attempts = ? RETURNING max_attempts",
            (until, i, attempt),
        ).fetchone()
        ok = row is not None
        if ok and (self.cfg.consumer is not None or attempt >= (row[0] or self.cfg.max_attempts)):
            await self.arm_by(until)
        return {"ok": ok}

    @wire.queue.CANCEL.handler
    async def op_cancel(self, a: dict[str, Any]) -> dict[str, Any]:
        with self.sql.transaction(durable=True):
            gone = self.sql.exec(
                "DELETE FROM actorkeep_queue WHERE id = ? RETURNING id, grp, prev", (a["id"],)
            ).fetchall()
            unlink(self.sql, self.now(), gone)
        if gone:
            self.count_metric("queue.cancelled", label=self.address)
        return {"ok": bool(gone)}

    @wire.queue.GET.handler
    async def op_get(self, a: dict[str, Any]) -> dict[str, Any]:
        i = a["id"]
        now = self.now()
        self.sweep_now(now)
        row = self.sql.exec(
            "SELECT attempts, visible_at, last_error, priority, enqueued_at, body, leased, "
            "key, grp, expires_at, max_attempts, worker, blocked FROM actorkeep_queue "
            "WHERE id = ?",
            (i,),
        ).fetchone()
        if row is not None:
            attempts, visible_at, last_error, priority, enqueued_at, body, leased = row[:7]
            key, group, expires_at, max_attempts, worker, blocked = row[7:]
            # a message waiting behind its group's head counts as delayed, as in stats()
            ready = visible_at <= now and not blocked
            state: State = "ready" if ready else "leased" if leased else "delayed"
            job: dict[str, Any] = {
                "id": i,
                "state": state,
                "attempts": attempts,
                "visible_at": visible_at,
                "last_error": last_error,
                "priority": priority,
                "enqueued_at": enqueued_at,
                "body": body,
                "failed_at": None,
                "key": key,
                "group": group,
                "expires_at": expires_at,
                "max_attempts": max_attempts or self.cfg.max_attempts,
                "worker": worker,
            }
            return {"job": job}
        row = self.sql.exec(
            "SELECT attempts, reason, priority, enqueued_at, body, failed_at, key, grp, worker "
            "FROM actorkeep_queue_dead WHERE id = ?",
            (i,),
        ).fetchone()
        if row is None:
            return {"job": None}
        attempts, reason, priority, enqueued_at, body, failed_at, key, group, worker = row
        return {
            "job": {
                "id": i,
                "state": "dead",
                "attempts": attempts,
                "visible_at": None,
                "last_error": reason,
                "priority": priority,
                "enqueued_at": enqueued_at,
                "body": body,
                "failed_at": failed_at,
                "key": key,
                "group": group,
                "expires_at": None,
                "max_attempts": None,
                "worker": worker,
            }
        }

    @wire.queue.STATS.handler
    async def op_stats(self, a: dict[str, Any]) -> dict[str, Any]:
        now = self.now()
        self.sweep_now(now)
        ready, delayed, leased, oldest, keyed, groups = self.sql.exec(
            "SELECT COALESCE(SUM(visible_at <= :now AND blocked = 0), 0), "
            "COALESCE(SUM((visible_at > :now AND leased = 0) OR blocked = 1), 0), "
            "COALESCE(SUM(visible_at > :now AND leased = 1), 0), "
            "MIN(CASE WHEN visible_at <= :now AND blocked = 0 THEN enqueued_at END), "
            "COUNT(key), (SELECT COUNT(*) FROM actorkeep_queue_groups) FROM actorkeep_queue",
            {"now": now},
        ).fetchone()
        (dead,) = self.sql.exec("SELECT COUNT(*) FROM actorkeep_queue_dead").fetchone()
        (remembered,) = self.sql.exec("SELECT COUNT(*) FROM actorkeep_queue_keys").fetchone()
        recurring = sum(s.key.startswith(RECURRING_PREFIX) for s in self.schedules())
        return {
            "ready": ready,
            "delayed": delayed,
            "leased": leased,
            "dead": dead,
            "oldest_ready_age": None if oldest is None else max(0.0, now - oldest),
            "keys": keyed + remembered,
            "groups": groups,
            "schedules": recurring,
        }

    @wire.queue.DEAD_LETTERS.handler
    async def op_dead_letters(self, a: dict[str, Any]) -> dict[str, Any]:
        limit, after = a["limit"], a["after"]
        self.sweep_now(self.now())
        rows = self.sql.exec(
            "SELECT id, body, enqueued_at, attempts, failed_at, reason, key, grp, worker "
            "FROM actorkeep_queue_dead WHERE id > ? ORDER BY id LIMIT ?",
            (after, limit),
        ).fetchall()
        return {"items": [list(r) for r in rows]}

    @wire.queue.REDRIVE.handler
    async def op_redrive(self, a: dict[str, Any]) -> dict[str, Any]:
        ids: list[int] | None = a["ids"]
        now = self.now()
        self.sweep_now(now)
        chosen = ""  # all of them
        params: tuple[int, ...] = ()
        if ids is not None:
            chosen, params = f"id IN ({_marks(len(ids))})", tuple(ids)
        where = f"WHERE {chosen}" if chosen else ""
        if (
            self.cfg.consumer is not None
            and self.sql.exec(
                f"SELECT 1 FROM actorkeep_queue_dead {where} LIMIT 1", params
            ).fetchone()
        ):
            await self.arm_by(now)  # before the durable move, for the same reason as send
        with self.sql.transaction(durable=True):
            # New messages without a key (a live message may hold it now), at the end of
            # their groups.
            count = after = 0
            and_chosen = f"AND {chosen}" if chosen else ""
            while page := self.sql.exec(
                "SELECT id, body, enqueued_at, priority, grp FROM actorkeep_queue_dead "
                f"WHERE id > ? {and_chosen} ORDER BY id LIMIT ?",
                (after, *params, _REDRIVE_ROWS),
            ).fetchall():
                first = next_id(self.sql)
                prevs, tails = link(self.sql, [g for *_, g in page], first)
                values: list[Any] = []
                for (_, body, enqueued_at, priority, group), prev in zip(page, prevs, strict=True):
                    values += (body, enqueued_at, now, priority, group, prev is not None, prev)
                written = self.sql.exec(
                    "INSERT INTO actorkeep_queue (body, enqueued_at, visible_at, priority, "
                    "grp, blocked, prev) VALUES "
                    + ",".join(["(?, ?, ?, ?, ?, ?, ?)"] * len(page))
                    + " RETURNING id",
                    values,
                ).fetchall()
                check_ids((i for (i,) in written), first, len(page))
                set_tails(self.sql, tails)
                count += len(page)
                after = page[-1][0]
            self.sql.exec(f"DELETE FROM actorkeep_queue_dead {where}", params)
        self.count_metric("queue.redriven", count, label=self.address)
        return {"count": count}

    @wire.queue.CONFIGURE.handler
    async def op_configure(self, a: dict[str, Any]) -> dict[str, Any]:
        cfg: Config = a["config"]
        w = cfg.to_wire()
        # Arm for the new config before storing it, as send does: a crash in between leaves an
        # alarm with nothing to do, never a stored consumer with messages and no alarm.
        due = self.next_due(cfg)
        if due is not None:
            await self.arm_by(due)
        self.sql.exec(
            f"INSERT OR REPLACE INTO actorkeep_queue_config (id, {_CONFIG_COLUMNS}) "
            f"VALUES (0, {', '.join('?' * len(CONFIG_FIELDS))})",
            tuple(w[k] for k in CONFIG_FIELDS),
            durable=True,
        )
        self.cfg = cfg
        return {}

    @wire.queue.CONFIG.handler
    async def op_config(self, a: dict[str, Any]) -> dict[str, Any]:
        return {"config": self.cfg.to_wire()}

    # -- the operations ----------------------------------------------------------------------

    async def send(
        self, bodies: list[bytes], delay: float, priority: int, opts: SendOptions = PLAIN
    ) -> list[int]:
        """Queue the messages in one gated write (the reply with their ids leaves once it is
        durable); their ids in order, a duplicate's being the id of the message it matched."""
        now = self.now()
        due = now + delay if self.cfg.consumer is not None else None
        if opts.expires is not None:
            due = min(due, now + opts.expires) if due is not None else now + opts.expires
        if due is not None:
            # Arm before the insert: a crash between the two leaves an alarm with nothing to
            # do, never a message that waits for an alarm that was never set.
            await self.arm_by(due)
        sweeper = None if opts.keys is None else _SendSweeper(self)  # only keys are matched
        sent = insert(self.sql, now, bodies, delay, priority, opts, sweeper)
        self.count_metric("queue.sent", sent.new, label=self.address)
        if sent.new < len(bodies):
            self.count_metric("queue.duplicates", len(bodies) - sent.new, label=self.address)
        return sent.ids

    async def pull_lease(self, n: int, visibility: float, worker: str | None = None) -> list[Lease]:
        """Lease for a pull worker: durable before the lease names leave this event.

        A worker holds ``(id, attempt)`` outside the queue, so power loss must not undo the
        lease: the next lease of the message would carry the same name, and the first holder's
        late ack would settle it. A gated write: the reply waits for it, the queue does not
        (decision 0008, decision 0015).
        """
        leases = self.lease(self.now(), n, visibility, durable=True, worker=worker)
        if leases:
            await self._arm_after_lease(leases, visibility)
        return leases

    def lease(
        self,
        now: float,
        n: int,
        visibility: float,
        durable: bool = False,
        worker: str | None = None,
    ) -> list[Lease]:
        """Lease up to ``n`` visible messages until ``now + visibility`` (``durable``: a gated
        write, for the pull path; push delivery leaves them plain), at most one per group."""
        cfg = self.cfg
        with self.sql.transaction():
            self.sweep(now)
            if limits.limited(cfg):
                n = limits.allowance(self.sql, cfg, now, n)
            rows = leasable(self.sql, now, n, cfg.max_attempts)
            if rows:
                limits.spend(self.sql, cfg, now, len(rows))
                update = (
                    "UPDATE actorkeep_queue SET attempts = attempts + 1, leased = 1, "
                    f"visible_at = ?, worker = ? WHERE id IN ({','.join('?' * len(rows))})"
                )
                params = (now + visibility, worker, *(r[0] for r in rows))
                if durable:
                    self.sql.exec(update, params, durable=True)  # gates the commit
                else:
                    self.sql.exec(update, params)
                self.count_metric("queue.deliveries", len(rows), label=self.address)
        return [
            Lease(i, attempts + 1, body, enqueued_at, key, group)
            for i, attempts, body, enqueued_at, key, group in rows
        ]

    def settle(self, now: float, outcomes: list[Outcome]) -> tuple[list[bool], float | None]:
        """Apply acks, retries and burials of current leases; the results and the earliest new
        ``visible_at`` a retry set (None if none)."""
        # Acks alone, each of its own message (what a drain mostly settles): two statements,
        # not two an ack. Anything else goes one outcome at a time, in order.
        if all(type(o) is Ack for o in outcomes) and len({o.id for o in outcomes}) == len(outcomes):
            return self._ack_all(now, outcomes), None
        cfg = self.cfg
        results: list[bool] = []
        earliest: float | None = None
        acked = retried = 0
        exec_ = self.sql.exec
        acked_rows: list[tuple[int, str | None, int | None]] = []
        with self.sql.transaction():
            for o in outcomes:
                row = exec_(
                    "SELECT attempts, last_error, key, grp, remember, max_attempts, prev "
                    "FROM actorkeep_queue WHERE id = ? AND leased = 1 AND attempts = ?",
                    (o.id, o.attempt),
                ).fetchone()
                if row is None:
                    results.append(False)  # stale: leased again since, settled, or gone
                    continue
                results.append(True)
                attempts, last_error, key, group, remember, max_attempts, prev = row
                if isinstance(o, Ack):
                    exec_("DELETE FROM actorkeep_queue WHERE id = ?", (o.id,))
                    if key is not None and remember is not None:
                        self._remember_key(key, o.id, now + remember)
                    acked_rows.append((o.id, group, prev))
                    acked += 1
                    continue
                if isinstance(o, Bury):
                    self._bury("id = ?", (o.id,), now, o.reason, force=True)
                    continue
                error = o.error if o.error is not None else last_error
                if attempts >= (max_attempts or cfg.max_attempts):  # it could never be leased
                    self._bury("id = ?", (o.id,), now, error)
                    continue
                if o.delay is not None:
                    delay = o.delay
                else:
                    delay = backoff(attempts, cfg.backoff_base, cfg.backoff_max, self.rng.random())
                visible_at = now + delay
                exec_(
                    "UPDATE actorkeep_queue SET leased = 0, visible_at = ?, last_error = ? "
                    "WHERE id = ?",
                    (visible_at, error, o.id),
                )
                retried += 1
                earliest = visible_at if earliest is None else min(earliest, visible_at)
            unlink(self.sql, now, acked_rows)
        if acked:
            self.count_metric("queue.acked", acked, label=self.address)
        if retried:
            self.count_metric("queue.retries", retried, label=self.address)
        return results, earliest

    def _ack_all(self, now: float, acks: list[Outcome]) -> list[bool]:
        """``settle`` of acks of distinct messages only, in two statements however many: the
        messages still leased at the acked attempt are deleted; whether each was."""
        attempt_of = {o.id: o.attempt for o in acks}
        ids = list(attempt_of)
        with self.sql.transaction():
            current = [
                id_
                for id_, attempts in self.sql.exec(
                    f"SELECT id, attempts FROM actorkeep_queue WHERE id IN ({_marks(len(ids))}) "
                    "AND leased = 1",
                    ids,
                ).fetchall()
                if attempts == attempt_of[id_]
            ]
            rows = (
                self.sql.exec(
                    f"DELETE FROM actorkeep_queue WHERE id IN ({_marks(len(current))}) "
                    "RETURNING id, key, grp, remember, prev",
                    current,
                ).fetchall()
                if current
                else []
            )
            for id_, key, _, remember, _ in rows:
                if key is not None and remember is not None:
                    self._remember_key(key, id_, now + remember)
            unlink(self.sql, now, [(id_, group, prev) for id_, _, group, _, prev in rows])
        if rows:
            self.count_metric("queue.acked", len(rows), label=self.address)
        done = set(current)
        return [o.id in done for o in acks]

    def _remember_key(self, key: str, id_: int, until: float) -> None:
        """An acked message's key answers sends with ``id_`` until ``until``."""
        self.sql.exec(
            "INSERT OR REPLACE INTO actorkeep_queue_keys (key, id, until) VALUES (?, ?, ?)",
            (key, id_, until),
        )

    def _bury(
        self,
        where: str,
        params: tuple[Any, ...],
        now: float,
        error: str | None,
        force: bool = False,
        limit: int = SWEEP_BATCH,
    ) -> int:
        """Move the messages matching ``where`` to the dead letters (inside a transaction),
        at most ``limit`` of them, with reason ``error`` (``force``: whatever error they
        recorded), and let the next message of their groups go; how many."""
        reason = "COALESCE(?, ?)" if force else "COALESCE(?, last_error, ?)"
        buried = self.sql.exec(
            "INSERT INTO actorkeep_queue_dead "
            "(id, body, enqueued_at, attempts, failed_at, reason, priority, key, grp, worker) "
            f"SELECT id, body, enqueued_at, attempts, ?, {reason}, priority, key, grp, worker "
            f"FROM actorkeep_queue WHERE {where} LIMIT ? RETURNING id, attempts, reason, grp",
            (now, error, MAX_ATTEMPTS_REASON, *params, limit),
        ).fetchall()
        if not buried:
            return 0
        ids = [row[0] for row in buried]
        gone = self.sql.exec(
            f"DELETE FROM actorkeep_queue WHERE id IN ({_marks(len(ids))}) RETURNING id, grp, prev",
            ids,
        ).fetchall()
        unlink(self.sql, now, gone)
        self.count_metric("queue.dead_letters", len(buried), label=self.address)
        for id_, attempts, reason, _ in buried:
            log.warning(
                "message dead-lettered",
                queue=self.address,
                id=id_,
                attempts=attempts,
                reason=reason,
            )
        return len(buried)

    def sweep(self, now: float) -> None:
        """Inside a transaction: dead-letter messages past their expiry and visible messages
        out of attempts (a lease that ran out on its last attempt included), ``SWEEP_BATCH``
        at most (the rest go at the next sweep, which the alarm runs at once, and no lease
        takes them meanwhile); drop dead letters past retention and remembered keys past
        their window."""
        cfg = self.cfg
        left = SWEEP_BATCH - self._bury(
            "expires_at IS NOT NULL AND expires_at <= ?", (now,), now, EXPIRED_REASON, force=True
        )
        if left > 0:
            for attempts in attempt_counts(self.sql, cfg.max_attempts):
                left -= self._bury(OUT_OF_ATTEMPTS, (attempts, now), now, None, limit=left)
                if left <= 0:
                    break
        if left > 0:
            self._bury(
                "max_attempts IS NOT NULL AND attempts >= max_attempts AND visible_at <= ?",
                (now,),
                now,
                None,
                limit=left,
            )
        self.sql.exec("DELETE FROM actorkeep_queue_keys WHERE until <= ?", (now,))
        if cfg.dead_retention is not None:
            self.sql.exec(
                "DELETE FROM actorkeep_queue_dead WHERE failed_at <= ?", (now - cfg.dead_retention,)
            )

    def sweep_now(self, now: float) -> None:
        with self.sql.transaction():
            self.sweep(now)

    def next_due(self, cfg: Config | None = None) -> float | None:
        """The earliest time the alarm has something to do (under ``cfg``, by default the
        stored one), or None."""
        cfg = self.cfg if cfg is None else cfg
        exec_ = self.sql.exec
        times: list[float | None] = []
        if cfg.consumer is not None:
            ready = earliest_head(self.sql)
            now = self.now()
            if ready is not None and ready <= now and limits.limited(cfg):
                ready = limits.next_allowed(self.sql, cfg, now)  # held back by the limits
            times.append(ready)
        # Messages out of attempts are swept when their last lease ends, whatever the limits
        # hold back (a capped sweep leaves some for the next event, due at once).
        for attempts in attempt_counts(self.sql, cfg.max_attempts):
            times += exec_(
                "SELECT MIN(visible_at) FROM actorkeep_queue "
                "WHERE attempts = ? AND attempts > 0 AND max_attempts IS NULL",
                (attempts,),
            ).fetchone()
        times += exec_(
            "SELECT MIN(visible_at) FROM actorkeep_queue "
            "WHERE max_attempts IS NOT NULL AND attempts >= max_attempts"
        ).fetchone()
        times += exec_(
            "SELECT MIN(expires_at) FROM actorkeep_queue WHERE expires_at IS NOT NULL"
        ).fetchone()
        if cfg.dead_retention is not None:
            (failed,) = exec_("SELECT MIN(failed_at) FROM actorkeep_queue_dead").fetchone()
            if failed is not None:
                times.append(failed + cfg.dead_retention)
        due = min((t for t in times if t is not None), default=None)
        return float(due) if due is not None else None

    async def arm_by(self, at: float) -> None:
        """Make sure the alarm fires no later than ``at`` (set it only if that moves it).

        Callers arm before their durable write, which then makes a plain alarm durable too.
        """
        current = self.get_alarm()
        if current is None or current > at:
            await self._set_alarm_near_plain(at, current)

    async def _set_alarm_near_plain(self, at: float, current: float | None) -> None:
        """Set the alarm; without an fsync when both it and the one it replaces are due within
        ``LINGER``. Power loss can then bring back an alarm that fires at most ``LINGER`` late
        (the host's index entry left by power loss is one of these near times), never lose
        one. A far alarm, or moving one from far to near, is durable, so a far time never
        lingers in the index under a near alarm."""
        horizon = self.now() + LINGER
        near = at <= horizon and (current is None or current <= horizon)
        await self.set_alarm(at, durable=not near, wait=False)

    async def _arm_after_lease(self, leases: list[Lease], visibility: float) -> None:
        if not leases:
            return
        if self.cfg.consumer is not None or self._on_last_attempt(leases):
            await self.arm_by(self.now() + visibility)

    def _on_last_attempt(self, leases: list[Lease]) -> bool:
        """Whether any of ``leases`` is its message's last attempt (it must reach the dead
        letters when the lease runs out)."""
        cfg = self.cfg
        if any(x.attempt >= cfg.max_attempts for x in leases):
            return True
        found = self.sql.exec(
            "SELECT 1 FROM actorkeep_queue WHERE max_attempts IS NOT NULL "
            f"AND attempts >= max_attempts AND id IN ({','.join('?' * len(leases))}) LIMIT 1",
            [x.id for x in leases],
        ).fetchone()
        return found is not None

    # -- recurring sends (recurring.py) -----------------------------------------------------

    def _recurring(self) -> dict[str, Recurring]:
        declared: tuple[Recurring, ...] = self.options.get("recurring", {}).get(self.name, ())
        return {r.key: r for r in declared}

    async def _declare_recurring(self) -> None:
        """Bring the queue's schedules in line with the recurring sends declared at mount."""
        declared = self._recurring()
        stored = {
            s.key[len(RECURRING_PREFIX) :]: s
            for s in self.schedules()
            if s.key.startswith(RECURRING_PREFIX)
        }
        for key in stored.keys() - declared.keys():
            await self.cancel_schedule(RECURRING_PREFIX + key)
        for key, r in declared.items():
            s = stored.get(key)
            if s is None or (s.cron, s.tz, s.missed) != (r.cron, r.tz, r.missed):
                await self.schedule(
                    "send_recurring",
                    key,
                    cron=r.cron,
                    tz=r.tz,
                    missed=r.missed,
                    key=RECURRING_PREFIX + key,
                )

    async def send_recurring(self, run: ak.ScheduleRun) -> None:
        """One occurrence of a recurring send: the message and the mark of the occurrence it
        stands for, in one gated transaction; an occurrence already marked sends nothing."""
        r = self._recurring().get(run.payload)
        if r is None:
            return  # no longer declared: the next setup cancels the schedule
        if self.cfg.consumer is not None:
            await self.arm_by(self.now())
        with self.sql.transaction(durable=True):
            mark = self.sql.exec(
                "SELECT sent_due FROM actorkeep_queue_recurring WHERE key = ?", (r.key,)
            ).fetchone()
            if mark is not None and mark[0] >= run.due:
                return
            groups: list[str | None] | None = None if r.group is None else [r.group]
            sent = insert(
                self.sql, self.now(), [r.body], 0.0, r.priority, SendOptions(groups=groups)
            )
            self.sql.exec(
                "INSERT OR REPLACE INTO actorkeep_queue_recurring (key, sent_due, id) "
                "VALUES (?, ?, ?)",
                (r.key, run.due, sent.ids[0]),
            )
        self.count_metric("queue.sent", 1, label=self.address)

    # -- push delivery ---------------------------------------------------------------------

    async def alarm(self, info: ak.AlarmInfo) -> None:
        """Sweep; push one batch to the consumer; set the alarm for the next due time."""
        cfg = self.cfg
        now = self.now()
        pushed = False
        if cfg.consumer is None:
            self.sweep_now(now)
        else:
            # The lease sweeps first, in its own transaction: one sweep an event.
            leases = self.lease(now, cfg.batch_size, cfg.visibility, worker=cfg.consumer)
            if leases:
                await self._push(cfg.consumer, cfg.visibility, leases)
                pushed = True
        due = self.next_due()
        if due is None and pushed:
            due = now + LINGER  # stay armed a little: the next send then needs no fsync
        if due is not None:
            # Always set: an alarm left untouched by its own event is cleared by the host.
            # The stored alarm is the one that fired (durable, due): a plain set is safe.
            await self._set_alarm_near_plain(due, self.get_alarm())

    async def _push(self, consumer: str, visibility: float, leases: list[Lease]) -> None:
        """One delivery call; apply the outcomes, or retry the whole batch with backoff."""
        failure: str
        try:
            resp = await self.actors.call(
                consumer,
                "POST",
                DELIVER.path,
                DELIVER.frame(queue=self.address, messages=[lease_to_wire(x) for x in leases]),
                headers=MSGPACK_HEADERS,
                timeout=visibility,
            )
        except (ak.RemoteError, ak.CallTimeout) as exc:
            failure = f"delivery to {consumer} failed: {type(exc).__name__}: {exc}"
        else:
            if 200 <= resp.status < 300:
                try:
                    outcomes = DELIVER.reply(resp.body)["outcomes"]
                except ValueError as exc:
                    failure = f"delivery to {consumer}: bad reply: {exc}"
                else:
                    batch = {(x.id, x.attempt) for x in leases}
                    # The queue was busy while the consumer ran, so nobody leased these
                    # since: their outcomes apply even if the leases ran out meanwhile.
                    self.settle(self.now(), [o for o in outcomes if (o.id, o.attempt) in batch])
                    return
            else:
                snippet = resp.body[:300].decode("utf-8", "replace")
                failure = f"delivery to {consumer} answered {resp.status}: {snippet}"
        self.count_metric("queue.delivery_failures", 1, label=self.address)
        log.warning(
            "push delivery failed",
            queue=self.address,
            consumer=consumer,
            messages=len(leases),
            error=failure[:MAX_ERROR],
        )
        retries: list[Outcome] = [Retry(x.id, x.attempt, None, failure[:MAX_ERROR]) for x in leases]
        self.settle(self.now(), retries)


class _SendSweeper:
    """What a send does with a message holding a key it matched whose time or attempts are
    up, not swept yet (``sending.Sweeper``)."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.max_attempts = queue.cfg.max_attempts

    def expired(self, id_: int) -> None:
        self.queue._bury("id = ?", (id_,), self.queue.now(), EXPIRED_REASON, force=True)

    def out_of_attempts(self, id_: int) -> None:
        self.queue._bury("id = ?", (id_,), self.queue.now(), None)


__all__ = ["EXPIRED_REASON", "LINGER", "MAX_ATTEMPTS_REASON", "Queue", "backoff"]
