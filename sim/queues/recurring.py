"""The recurring-sends scenario: a queue sends itself a message at every occurrence of a cron
(``queues.Recurring``, ``missed="each"``) while the host crashes and loses power; then every
message left in the queue is leased and checked (docs/simulation.md).

Each occurrence's run reports the ids it sent (``recur.sent``); power loss may undo a send
after its report, so the check is on what the queue holds at the end:

- ``recurring-once``: no two messages in the queue stand for one occurrence.
- ``recurring-each``: every occurrence due after the queue was first woken (its schedule
  declared) and before the horizon (the end less a margin for late alarms and retries) has a
  message in the queue.

A send and the mark of its occurrence commit in one gated transaction, and the run's row
advances after it, so power loss can bring back an occurrence but never both its message and
a second one.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

import trio

import actorkeep as ak
import queues
from actorkeep import next_cron
from queues.queue import Queue
from queues.sending import SendOptions, insert

from ..check import Violation
from ..faults import FaultDraw
from ..history import History, Op, Status
from ..runner import Scenario, Setup
from ..world import World

QUEUE = "recurring-queue/q"
CLIENT = "sim-recurring-client"
KEY = "tick"
#: After the heal: longer than every retry of a failing alarm event and a late alarm.
SETTLE = 20.0
#: Occurrences due within this many seconds of the end are not owed yet.
MARGIN = 8.0


class Recorder:
    """The world's ear inside the queue."""

    def __init__(self) -> None:
        self.world: World | None = None


class RecordingQueue(Queue):
    """The real queue; each recurring run reports the messages it sent."""

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> None:
        super().check_options({k: v for k, v in options.items() if k != "recorder"})

    async def send_recurring(self, run: ak.ScheduleRun) -> None:
        (before,) = self.sql.exec("SELECT COALESCE(MAX(id), 0) FROM actorkeep_queue").fetchone()
        await self.send_occurrence(run)
        ids = [
            i for (i,) in self.sql.exec("SELECT id FROM actorkeep_queue WHERE id > ?", (before,))
        ]
        recorder: Recorder = self.options["recorder"]
        assert recorder.world is not None
        recorder.world.history.observe(
            "recur.sent", self.now(), due=run.due, ids=ids, retry_count=run.retry_count
        )

    async def send_occurrence(self, run: ak.ScheduleRun) -> None:
        await super().send_recurring(run)

    def sent_already(self, key: str, due: float) -> bool:
        """Whether the recurring send ``key`` is marked as sent for ``due`` or later."""
        mark = self.sql.exec(
            "SELECT sent_due FROM actorkeep_queue_recurring WHERE key = ?", (key,)
        ).fetchone()
        return mark is not None and bool(mark[0] >= due)


class IgnoresMarker(RecordingQueue):
    """Planted: sends at every run of an occurrence, even one already sent (a run repeated
    after power loss took back the row's advance but not the send)."""

    async def send_occurrence(self, run: ak.ScheduleRun) -> None:
        r = self._recurring()[run.payload]
        with self.sql.transaction(durable=True):
            insert(self.sql, self.now(), [r.body], 0.0, r.priority, SendOptions())


class MarksApart(RecordingQueue):
    """Planted: the send is gated, the mark of its occurrence a plain write after it: power
    loss keeps the message and drops the mark."""

    async def send_occurrence(self, run: ak.ScheduleRun) -> None:
        r = self._recurring()[run.payload]
        if self.sent_already(r.key, run.due):
            return
        with self.sql.transaction(durable=True):
            sent = insert(self.sql, self.now(), [r.body], 0.0, r.priority, SendOptions())
        self.sql.exec(
            "INSERT OR REPLACE INTO actorkeep_queue_recurring (key, sent_due, id) VALUES (?, ?, ?)",
            (r.key, run.due, sent.ids[0]),
        )


class MarksFirst(RecordingQueue):
    """Planted: marks the occurrence in a gated write, then sends with a plain one: power loss
    keeps the mark and drops the message, and the occurrence is never sent again."""

    async def send_occurrence(self, run: ak.ScheduleRun) -> None:
        r = self._recurring()[run.payload]
        if self.sent_already(r.key, run.due):
            return
        self.sql.exec(
            "INSERT OR REPLACE INTO actorkeep_queue_recurring (key, sent_due, id) VALUES (?, ?, 0)",
            (r.key, run.due),
            durable=True,
        )
        insert(self.sql, self.now(), [r.body], 0.0, r.priority, SendOptions())


class RecurringClient(ak.Actor):
    """Wakes the queue, and leases what it holds at the end."""

    @ak.rpc
    async def wake(self) -> int | None:
        """The queue's ready count; None if the call was refused or its reply lost (the
        simulator's call faults)."""
        try:
            return (await ak.queue.Client(QUEUE).stats()).ready
        except (ak.Overloaded, ak.CallTimeout):
            return None

    @ak.rpc
    async def drain(self) -> list[int]:
        """Every message id the queue holds now (leased, then acked). After the heal: no call
        fault can lose a lease's reply."""
        q = ak.queue.Client(QUEUE)
        ids: list[int] = []
        while batch := await q.lease(500, visibility=60.0):
            ids.extend(m.id for m in batch)
            await q.settle([ak.queue.Ack(m.id, m.attempt) for m in batch])
        return ids


# -- the plan and the workload -----------------------------------------------------------------


@dataclass(frozen=True)
class RecurringPlan:
    every: int  # seconds between occurrences
    span: float  # virtual seconds of the fault phase
    wakes: int  # calls that wake the queue during it (and may evict it between)


def draw_plan(rng: random.Random) -> RecurringPlan:
    return RecurringPlan(
        every=rng.choice((1, 1, 2)),
        span=rng.choice((20.0, 30.0, 40.0)),
        wakes=rng.randint(1, 5),
    )


async def _op(w: World, process: str, kind: str, method: str) -> Op:
    address = f"{CLIENT}/c"
    return await w.invoke(
        process, kind, {}, lambda: w.rpc(address, method, timeout=None), classify=_classify
    )


def _classify(reply: Any) -> tuple[Status, Any]:
    return ("unknown", None) if reply is None else ("ok", reply)


def workload(plan: RecurringPlan, recorder: Recorder, draw: FaultDraw) -> Any:
    async def main(w: World) -> None:
        recorder.world = w
        rng = w.rng("recurring-client")
        while (await _op(w, "c", "recur.wake", "wake")).status != "ok":  # noqa: ASYNC110
            await trio.sleep(0.5)  # the host was down: ask again
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                w.timed_faults, w.rng("timed-faults"), draw.timed, plan.span, draw.power_p
            )
            for _ in range(plan.wakes):
                await trio.sleep(rng.uniform(0.0, plan.span / plan.wakes))
                await _op(w, "c", "recur.wake", "wake")
        w.heal()
        await w.wait_up()
        await trio.sleep(SETTLE)
        while (await _op(w, "final", "recur.drain", "drain")).status != "ok":  # noqa: ASYNC110
            await trio.sleep(0.5)

    return main


# -- the checker -------------------------------------------------------------------------------


def check_recurring(history: History, every: int) -> list[Violation]:
    woke = [o for o in history.ops if o.kind == "recur.wake" and o.status == "ok"]
    drains = [o for o in history.ops if o.kind == "recur.drain" and o.status == "ok"]
    if not woke or not drains:
        return []
    held: list[int] = drains[-1].result
    due_of: dict[int, float] = {}
    where: dict[int, int] = {}
    for f in history.observations:
        if f.kind == "recur.sent":
            for i in f.detail["ids"]:
                due_of[i] = f.detail["due"]
                where[i] = f.index
    found: list[Violation] = []
    by_due: dict[float, list[int]] = {}
    for i in held:
        if i not in due_of:
            found.append(Violation("recurring-once", f"message {i} was sent by no reported run"))
            continue
        by_due.setdefault(due_of[i], []).append(i)
    for at, ids in sorted(by_due.items()):
        if len(ids) > 1:
            found.append(
                Violation(
                    "recurring-once",
                    f"the occurrence due at {at:.3f} has {len(ids)} messages: {sorted(ids)}",
                    entries=tuple(where[i] for i in ids),
                )
            )
    start, horizon = woke[0].complete_time, drains[-1].invoke_time - MARGIN
    cron = f"*/{every} * * * * *"
    due: float | None = next_cron(cron, "UTC", start)
    while due is not None and due <= horizon:
        if due not in by_due:
            found.append(
                Violation(
                    "recurring-each",
                    f"no message in the queue for the occurrence due at {due:.3f} "
                    f"(the queue first answered at {start:.3f})",
                    (woke[0].id,),
                )
            )
            break
        due = next_cron(cron, "UTC", due)
    return found[:20]


def make_app(recorder: Recorder, every: int, queue: type[RecordingQueue]) -> ak.App:
    app = ak.App()
    recurring = [queues.Recurring(KEY, f"*/{every} * * * * *", b"tick", missed="each")]
    app.mount(queue, "recurring-queue", recurring={"q": recurring}, recorder=recorder)
    app.mount(RecurringClient, CLIENT)
    return app


def setup(plan: RecurringPlan, planted: type[RecordingQueue] | None, draw: FaultDraw) -> Setup:
    recorder = Recorder()
    return Setup(
        app=make_app(recorder, plan.every, planted or RecordingQueue),
        workload=lambda world: workload(plan, recorder, draw),
        check=lambda history: check_recurring(history, plan.every),
        ops=lambda history: len(history.ops) + len(history.observations),
        summary=asdict(plan),
    )


RECURRING_BUGS: dict[str, type[RecordingQueue]] = {
    "ignores-marker": IgnoresMarker,
    "marks-apart": MarksApart,
    "marks-first": MarksFirst,
}

RECURRING = Scenario("recurring", "recurring-scenario", RECURRING_BUGS, draw_plan, setup)

__all__ = ["RECURRING", "RECURRING_BUGS", "RecordingQueue", "check_recurring", "make_app"]
