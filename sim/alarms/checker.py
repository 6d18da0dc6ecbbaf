"""The alarm checker (docs/reference.md §4, §10): never early, never a phantom or a replaced
alarm, and at least once, with its effects, once the faults are over.

It reads the ``alarm.*`` operations of sim/alarms/workload.py and the ``fire`` and ``rearm``
observations the timers report. An alarm is named by its time ``at`` (``scheduled_at`` in the
handler); retries keep it and count up ``retry_count``. The invariants:

- ``alarm-never-early``: a first firing comes at or after ``scheduled_at``; retry n comes at
  least ``retry_delay(n - 1)`` after the failed firing n - 1.
- ``alarm-no-phantom``: a firing's ``scheduled_at`` was set on that timer before it fired
  (by a set that answered it, an unanswered set that could have, or the handler's re-arm,
  which the handler reports before (``rearm``) and after (``rearmed``) setting it).
- ``alarm-replaced-never-fires``: once a set, a delete or the timer's removal that does not
  set ``at`` completed, having started after every possible source of ``at`` completed, ``at``
  never fires again (all three are durable, so no crash or power loss excuses it).
- ``alarm-timely``: a first firing comes no later than ``late`` (the world's late-alarm bound)
  plus a second after its time or the host's last restart, whichever is later. (Not checked
  when the BUGGIFY site that fails alarm events is on: each failure adds a 2 s cooldown.)
- ``alarm-removed-is-gone``: a state read begun after a removal of the timer completed shows
  no firing recorded before the removal began (``rm`` deletes the timer's data).
- ``alarm-liveness``: after the heal and a wait longer than any alarm, retry or lateness, no
  timer still holds an alarm.
- ``alarm-at-least-once``: the last alarm a timer was definitely given (and any alarm its
  handler set after that) fired successfully, and the plain write its handler made survived
  (a removal that was not refused counts as a change: it empties the timer).
"""

from __future__ import annotations

import math
from collections import defaultdict

from actorkeep.runtime.alarm_store import MAX_RETRIES, retry_delay

from ..check import Violation
from ..history import NEVER, Fault, History, Op

EPS = 1e-6


#: Seconds an alarm may fire after its due time beyond the injected lateness: events ahead of
#: it in the actor's queue, slow fsyncs.
SLACK = 1.0
_FAILING_SITE = "buggify site host.alarm-event-fails enabled"


class AlarmChecker:
    def __init__(self, history: History, late: float = 0.0) -> None:
        self.history = history
        self.late = late
        self.restarts = [f.time for f in history.faults if f.kind == "restart"]
        self.check_timely = not any(e.text == _FAILING_SITE for e in history.entries)
        self.violations: list[Violation] = []
        self.ops: dict[str, list[Op]] = defaultdict(list)
        self.fires: dict[str, list[Fault]] = defaultdict(list)
        self.rearms: dict[str, list[Fault]] = defaultdict(list)  # attempted re-arms
        self.rearmed: dict[str, list[Fault]] = defaultdict(list)  # completed re-arms
        for op in history.ops:
            if op.kind.startswith("alarm."):
                self.ops[op.args["timer"]].append(op)
        for o in history.observations:
            if o.kind == "fire":
                self.fires[o.detail["actor"]].append(o)
            elif o.kind == "rearm":
                self.rearms[o.detail["actor"]].append(o)
            elif o.kind == "rearmed":
                self.rearmed[o.detail["actor"]].append(o)

    def fail(self, invariant: str, message: str, *ops: Op, entries: tuple[int, ...] = ()) -> None:
        self.violations.append(Violation(invariant, message, tuple(op.id for op in ops), entries))

    def check(self) -> list[Violation]:
        for timer in sorted(set(self.ops) | set(self.fires)):
            self.check_timer(timer)
        return self.violations

    # -- per timer ------------------------------------------------------------------------
    def sources(self, timer: str, at: float, before: int) -> list[float]:
        """Where alarm ``at`` of ``timer`` may come from, as completion indexes (NEVER for an
        unanswered set): sets and re-arms that began before history index ``before``."""
        out: list[float] = []
        for op in self.ops[timer]:
            if op.kind != "alarm.set" or op.invoke_index > before:
                continue
            if op.status == "ok" and abs(op.result - at) <= EPS:
                out.append(op.complete_index)
            elif op.status == "unknown" and op.invoke_time + op.args["delay"] <= at + EPS:
                out.append(NEVER)
        for r in self.rearms[timer]:
            if r.index < before and abs(r.detail["at"] - at) <= EPS:
                done = [
                    d.index
                    for d in self.rearmed[timer]
                    if d.index > r.index and d.detail == r.detail
                ]
                out.append(float(min(done)) if done else NEVER)
        return out

    def timely(self, timer: str, f: Fault, at: float) -> None:
        if not self.check_timely:
            return
        restarted = max((t for t in self.restarts if t <= f.time), default=-math.inf)
        due = max(at, restarted)
        if f.time > due + self.late + SLACK:
            self.fail(
                "alarm-timely",
                f"{timer} fired at {f.time:.6f}, {f.time - due:.3f} s after it was due "
                f"({at:.6f}, last restart {restarted:.6f}) (entry {f.index})",
                *self.setters(timer, at),
                entries=(f.index,),
            )

    def setters(self, timer: str, at: float) -> list[Op]:
        """The answered sets of ``timer`` that set ``at``."""
        return [
            op
            for op in self.ops[timer]
            if op.kind == "alarm.set" and op.status == "ok" and abs(op.result - at) <= EPS
        ]

    def check_timer(self, timer: str) -> None:
        fires = self.fires[timer]
        for f in fires:
            at, n = f.detail["scheduled_at"], f.detail["retry_count"]
            if n == 0:
                if f.time + EPS < at:
                    self.fail(
                        "alarm-never-early",
                        f"{timer} fired at {f.time:.6f}, before its time {at:.6f} "
                        f"(entry {f.index})",
                        *self.setters(timer, at),
                        entries=(f.index,),
                    )
                self.timely(timer, f, at)
                srcs = self.sources(timer, at, f.index)
                if not srcs:
                    self.fail(
                        "alarm-no-phantom",
                        f"{timer} fired for {at:.6f}, which nobody set (entry {f.index})",
                        entries=(f.index,),
                    )
                    continue
            else:
                previous = [
                    p
                    for p in fires
                    if p.index < f.index
                    and p.detail["fails"]
                    and p.detail["retry_count"] == n - 1
                    and abs(p.detail["scheduled_at"] - at) <= EPS
                ]
                if not previous:
                    self.fail(
                        "alarm-no-phantom",
                        f"{timer} retry {n} of {at:.6f} with no failed try {n - 1} before it "
                        f"(entry {f.index})",
                        entries=(f.index,),
                    )
                    continue
                due = min(p.time for p in previous) + retry_delay(n - 1)
                if f.time + EPS < due:
                    self.fail(
                        "alarm-never-early",
                        f"{timer} retry {n} of {at:.6f} came at {f.time:.6f}, before "
                        f"{due:.6f} (entry {f.index})",
                        entries=(f.index,),
                    )
                srcs = self.sources(timer, at, f.index) + [float(p.index) for p in previous]
            self.check_not_replaced(timer, f, at, max(srcs))
        self.check_removed(timer)
        self.check_final(timer)

    def check_not_replaced(self, timer: str, f: Fault, at: float, last_source: float) -> None:
        for op in self.ops[timer]:
            if op.status != "ok" or op.kind not in ("alarm.set", "alarm.delete", "alarm.remove"):
                continue
            if op.kind == "alarm.set" and abs(op.result - at) <= EPS:
                continue
            if last_source < op.invoke_index and op.complete_index < f.index:
                what = (
                    f"replaced by {op.result:.6f}"
                    if op.kind == "alarm.set"
                    else "deleted with its timer"
                    if op.kind == "alarm.remove"
                    else "deleted"
                )
                self.fail(
                    "alarm-replaced-never-fires",
                    f"{timer}'s alarm {at:.6f} was {what} and still fired (entry {f.index})",
                    op,
                    entries=(f.index,),
                )
                return

    def check_removed(self, timer: str) -> None:
        """A state read after a removal completed shows no firing from before it began."""
        removals = [op for op in self.ops[timer] if op.kind == "alarm.remove" and op.status == "ok"]
        reads = [op for op in self.ops[timer] if op.kind == "alarm.state" and op.status == "ok"]
        for removal in removals:
            for read in reads:
                if read.invoke_index < removal.complete_index:
                    continue
                for at in read.result[1]:
                    after = [
                        f
                        for f in self.fires[timer]
                        if f.index > removal.invoke_index
                        and abs(f.detail["scheduled_at"] - at) <= EPS
                    ]
                    if not after:
                        self.fail(
                            "alarm-removed-is-gone",
                            f"{timer} was deleted, and still shows its firing for {at:.6f}",
                            removal,
                            read,
                        )
                        return

    def check_final(self, timer: str) -> None:
        finals = [
            op
            for op in self.ops[timer]
            if op.kind == "alarm.state" and op.process == "final" and op.status == "ok"
        ]
        if not finals:
            return
        final = finals[-1]
        alarm_at, fired = final.result
        if alarm_at is not None:
            self.fail(
                "alarm-liveness",
                f"{timer} still holds an alarm for {alarm_at:.6f} after the heal and the wait",
                final,
            )
        changes = [
            op
            for op in self.ops[timer]
            if op.kind in ("alarm.set", "alarm.delete", "alarm.remove")
            and op.status != "fail"  # a refused removal changed nothing
            and op.invoke_index < final.invoke_index
        ]
        definite = [op for op in changes if op.status == "ok"]
        if not definite:
            return
        last = max(definite, key=lambda op: op.complete_index)
        if any(op.status != "ok" and op.invoke_index > last.invoke_index for op in changes):
            return  # an unanswered change after it may have replaced it
        if any(op.invoke_index > last.invoke_index for op in changes if op is not last):
            return  # overlapping definite changes: which one ran last is not known
        required = [r.detail["at"] for r in self.rearmed[timer] if r.index > last.complete_index]
        if last.kind == "alarm.set":
            required.insert(0, last.result)
        for at in required:
            if self.dropped(timer, at):
                continue  # failed on every retry: dropped, as docs/reference.md §4 says
            if not any(abs(got - at) <= EPS for got in fired):
                self.fail(
                    "alarm-at-least-once",
                    f"{timer}'s alarm {at:.6f} has no surviving successful firing "
                    f"(recorded: {[round(x, 6) for x in fired]})",
                    last,
                    final,
                )

    def dropped(self, timer: str, at: float) -> bool:
        return any(
            f.detail["fails"]
            and f.detail["retry_count"] >= MAX_RETRIES
            and abs(f.detail["scheduled_at"] - at) <= EPS
            for f in self.fires[timer]
        )


def check_alarms(history: History, late: float = 0.0) -> list[Violation]:
    """Check the ``alarm.*`` operations and the timers' observations of ``history``; ``late``
    is how late the world may hand an alarm over."""
    return AlarmChecker(history, late).check()
