"""The queue checker: accounting, attempts and stale leases over a history
(docs/reference.md §8, §10).

It reads the ``queue.*`` operations of a history (sends, leases, acks, retries, settles,
extends, gets, stats, dead letters; see sim/queues/workload.py for their args and results) and
the push consumer's ``queue.deliver`` observations. A body is unique to one send, so a body
seen names its send. A delivery begins when the queue handed its lease out (the queue's
``queue.leased`` observation of the same name) and ends when the consumer reports it. The
invariants:

- ``no-phantom``: every message seen (leased, delivered, read, dead-lettered) was sent by a
  send that had begun, under the id that send was given if it was acknowledged; an id always
  carries one body, and no two acknowledged sends get the same id.
- ``failed-send-invisible``: a send that failed (refused before the queue saw it) is never
  seen.
- ``attempts-bounded``: attempts are 1..max_attempts; a dead letter had exactly max_attempts.
- ``attempts-increase``: a lease or delivery that begins after another of the same message
  ended carries a higher attempt, and a read of the message shows at least that many. Pull
  leases are durable, so this holds under power loss and no two pull leases ever share a name
  ``(id, attempt)``. Push delivery leases with plain writes (decision 0008): there, a power
  loss that rolled the queue's file back in between excuses a repeated or lower attempt.
- ``stale-ack-refused``: an ack, retry or extend of ``(id, a)`` that begins after a lease
  ``(id, a' > a)`` completed answers False; a settled (acked or retried) lease is not settled
  or extended again unless a power loss rolled its settlement back.
- ``acked-stays-acked``: after an ack answered True the message is not seen again (leased,
  delivered, read or dead-lettered) unless a power loss rolled the queue's file back in
  between: acks are plain writes, and such a message comes back at a higher attempt.
- ``no-lost-message``: a message that is not among the final dead letters was deleted by an
  ack of its last lease (pull: an ack that answered True or is unknown; push: the consumer
  acked its last delivery). A read that finds no message needs such an ack before it. So an
  acknowledged send ends acked or dead-lettered, exactly once.
- ``liveness``: after the heal each queue drained: its final stats (an op with
  ``args["final"]``) show nothing ready, delayed or leased.

A queue ``<class>/<name>`` lives in the file ``actors/<class>/<name>``; power-loss faults name
the files they rolled back in ``detail["rolled_back"]``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from ..check import Violation
from ..history import History, Op

_PAST = {"lease": "leased", "deliver": "delivered", "get": "read", "dead": "dead-lettered"}
#: Operations that send: their args hold ``bodies``, their ok result the ids in order.
SEND_KINDS = frozenset({"queue.send", "queue.send_delayed", "queue.send_batch"})


@dataclass(slots=True)
class Seen:
    """A message observed during ``[start, end]`` (history indexes): leased, delivered, read
    (``get``) or listed as a dead letter, with its attempt (or the attempts a read shows)."""

    source: str  # "lease", "deliver", "get" or "dead"
    queue: str
    id: int
    body: bytes
    attempt: int
    start: float
    end: float
    op: Op | None = None  # None for a delivery (an observation, not an operation)
    outcome: str = ""  # a delivery's: "ack", "raise" or "later"
    state: str = ""  # a read's

    def where(self) -> str:
        return f"#{self.op.id}" if self.op is not None else f"delivery at entry {self.end:.0f}"


@dataclass(slots=True)
class Settlement:
    """An ack, retry or extend of ``(id, attempt)``; ``result`` None when unknown."""

    what: str
    queue: str
    id: int
    attempt: int
    result: bool | None
    op: Op

    @property
    def start(self) -> float:
        return self.op.invoke_index

    @property
    def end(self) -> float:
        return self.op.complete_index


class QueueChecker:
    """Checks the ``queue.*`` operations and deliveries of a history.

    ``max_attempts``: each queue's configured maximum. ``require_drained``: the history ends
    with a heal and the final state of every queue in ``max_attempts`` (``liveness`` and the
    final accounting of ``no-lost-message``).
    """

    def __init__(
        self, history: History, max_attempts: Mapping[str, int], require_drained: bool = True
    ) -> None:
        self.history = history
        self.max_attempts = dict(max_attempts)
        self.require_drained = require_drained
        self.ops = [op for op in history.ops if op.kind.startswith("queue.")]
        self.violations: list[Violation] = []
        self._reported: set[tuple[str, str]] = set()
        self.sends: dict[bytes, tuple[Op, int]] = {}  # body -> (its send, its index)
        self.sent_ids: dict[tuple[str, int], tuple[bytes, Op]] = {}  # acknowledged sends
        self.seen: dict[tuple[str, int], list[Seen]] = defaultdict(list)
        self.settlements: dict[tuple[str, int], list[Settlement]] = defaultdict(list)
        self.absent: list[tuple[str, int, Op]] = []  # reads that found no message
        self.final_stats: dict[str, Op] = {}
        self.final_dead: dict[str, set[int]] = {}
        self.rollbacks: list[tuple[int, frozenset[str]]] = [
            (f.index, frozenset(f.detail.get("rolled_back", ())))
            for f in history.faults
            if f.kind == "power-loss"
        ]

    def fail(self, invariant: str, message: str, *ops: Op | None) -> None:
        if (invariant, message) in self._reported:
            return  # the same fact seen through another operation
        self._reported.add((invariant, message))
        ids = tuple(sorted({o.id for o in ops if o is not None}))
        self.violations.append(Violation(invariant, message, ids))

    def rolled_back(self, queue: str, after: float, before: float) -> bool:
        """A power loss rolled the queue's file back between two history indexes."""
        key = f"actors/{queue}"
        return any(after < i < before and key in files for i, files in self.rollbacks)

    # -- reading the history ----------------------------------------------------------------
    def _collect(self) -> None:
        for op in self.ops:
            if op.kind in SEND_KINDS:
                self._send(op)
        for op in self.ops:
            if op.status in ("ok", "unknown"):
                self._read(op)
        leased: dict[tuple[str, int, int], int] = {}  # (queue, id, attempt): latest lease
        for f in self.history.observations:
            d = f.detail
            if f.kind == "queue.leased":
                leased[(d["queue"], d["id"], d["attempt"])] = f.index
            elif f.kind == "queue.deliver":
                # Begun when its lease was handed out: between hosts, the push call may be held
                # up on its way (a cut link) and arrive after later ones.
                start = leased.get((d["queue"], d["id"], d["attempt"]), f.index)
                s = Seen("deliver", d["queue"], d["id"], d["body"], d["attempt"], start, f.index)
                s.outcome = d["outcome"]
                self.seen[(s.queue, s.id)].append(s)

    def _send(self, op: Op) -> None:
        queue = op.args["queue"]
        for k, body in enumerate(op.args["bodies"]):
            self.sends[body] = (op, k)
        if op.status != "ok":
            return
        for body, i in zip(op.args["bodies"], op.result, strict=True):
            prior = self.sent_ids.get((queue, i))
            if prior is not None:
                self.fail(
                    "no-phantom",
                    f"{queue} gave id {i} to two acknowledged sends ({prior[0]!r} and {body!r})",
                    prior[1],
                    op,
                )
            self.sent_ids[(queue, i)] = (body, op)

    def _read(self, op: Op) -> None:
        kind, a, r = op.kind, op.args, op.result
        queue = a.get("queue", "")
        ok = op.status == "ok"
        if kind in ("queue.ack", "queue.retry", "queue.extend"):
            what = kind.removeprefix("queue.")
            result = bool(r) if ok else None
            self._settled(Settlement(what, queue, a["id"], a["attempt"], result, op))
        elif kind == "queue.settle":
            for n, (what, i, attempt, _, _) in enumerate(a["outcomes"]):
                result = bool(r[n]) if ok else None
                self._settled(Settlement(what, queue, i, attempt, result, op))
        elif not ok:
            return
        elif kind == "queue.lease":
            for i, attempt, body in r:
                self._add(
                    Seen("lease", queue, i, body, attempt, op.invoke_index, op.complete_index, op)
                )
        elif kind == "queue.get":
            if r is None:
                self.absent.append((queue, a["id"], op))
            else:
                state, attempts, body = r
                s = Seen(
                    "get", queue, a["id"], body, attempts, op.invoke_index, op.complete_index, op
                )
                s.state = state
                self._add(s)
        elif kind == "queue.dead_letters":
            for i, body, attempts, _ in r:
                self._add(
                    Seen("dead", queue, i, body, attempts, op.invoke_index, op.complete_index, op)
                )
            if a.get("final"):
                self.final_dead.setdefault(queue, set()).update(i for i, *_ in r)
        elif kind == "queue.stats" and a.get("final"):
            self.final_stats[queue] = op

    def _add(self, s: Seen) -> None:
        self.seen[(s.queue, s.id)].append(s)

    def _settled(self, st: Settlement) -> None:
        self.settlements[(st.queue, st.id)].append(st)

    # -- the checks -------------------------------------------------------------------------
    def check(self) -> list[Violation]:
        self._collect()
        bodies: dict[tuple[str, int], Seen] = {}
        for key in sorted(self.seen):
            for s in self.seen[key]:
                self._check_origin(s, bodies)
                self._check_bounds(s)
            self._check_order(self.seen[key])
        for key in sorted(self.settlements):
            self._check_settlements(key)
        for queue, i, op in self.absent:
            if (queue, i) in self.sent_ids and not self._acked_before(queue, i, op.complete_index):
                self.fail(
                    "no-lost-message",
                    f"{queue} has no message {i} (sent as {self.sent_ids[(queue, i)][0]!r}), "
                    "and no ack of it came before",
                    self.sent_ids[(queue, i)][1],
                    op,
                )
        if self.require_drained:
            for queue in sorted(self.max_attempts):
                if self._drained(queue):
                    self._check_final(queue)
        return self.violations

    def _check_origin(self, s: Seen, bodies: dict[tuple[str, int], Seen]) -> None:
        text = f"{s.queue} message {s.id} ({s.source}, {s.where()})"
        send = self.sends.get(s.body)
        if send is None:
            self.fail("no-phantom", f"{text} carries {s.body!r}, which nobody sent", s.op)
            return
        op, k = send
        if op.status == "fail":
            self.fail(
                "failed-send-invisible", f"{text} carries {s.body!r} from a failed send", op, s.op
            )
        if op.invoke_index > s.end:
            self.fail("no-phantom", f"{text} carries {s.body!r} before it was sent", op, s.op)
        if op.status == "ok" and op.args["queue"] == s.queue and op.result[k] != s.id:
            self.fail(
                "no-phantom",
                f"{text} carries {s.body!r}, which was acknowledged as id {op.result[k]}",
                op,
                s.op,
            )
        if op.args["queue"] != s.queue:
            self.fail("no-phantom", f"{text} carries {s.body!r}, sent to {op.args['queue']}", op)
        first = bodies.setdefault((s.queue, s.id), s)
        if first.body != s.body:
            self.fail(
                "no-phantom",
                f"{s.queue} id {s.id} carries {first.body!r} ({first.where()}) and {s.body!r} "
                f"({s.where()})",
                first.op,
                s.op,
            )

    def _check_bounds(self, s: Seen) -> None:
        top = self.max_attempts.get(s.queue)
        if top is None:
            return
        text = f"{s.queue} message {s.id} ({s.source}, {s.where()})"
        if s.source in ("lease", "deliver") and not 1 <= s.attempt <= top:
            self.fail("attempts-bounded", f"{text} at attempt {s.attempt} of {top}", s.op)
        elif s.source == "get" and not 0 <= s.attempt <= top:
            self.fail("attempts-bounded", f"{text} shows {s.attempt} attempts of {top}", s.op)
        if (s.source == "dead" or s.state == "dead") and s.attempt != top:
            self.fail(
                "attempts-bounded",
                f"{text} was dead-lettered after {s.attempt} attempts, not {top}",
                s.op,
            )

    def _check_order(self, seen: list[Seen]) -> None:
        leases = [s for s in seen if s.source in ("lease", "deliver")]
        for n, s1 in enumerate(leases):
            for s2 in leases[n + 1 :]:
                if s1.source == s2.source == "lease" and s1.attempt == s2.attempt:
                    self.fail(
                        "attempts-increase",
                        f"{s1.queue}: the lease name ({s1.id}, {s1.attempt}) was handed out "
                        f"twice ({s1.where()}, {s2.where()})",
                        s1.op,
                        s2.op,
                    )
        for s1 in leases:
            for s2 in seen:
                if s2 is s1 or s2.source == "dead" or not s1.end < s2.start:
                    continue
                if s1.source == s2.source == "lease" and s1.attempt == s2.attempt:
                    continue  # reported above
                if s2.source == "get":
                    if s2.attempt >= s1.attempt:
                        continue
                    then = f"read with {s2.attempt} attempts"
                elif s2.attempt > s1.attempt:
                    continue
                else:
                    then = f"{_PAST[s2.source]} at attempt {s2.attempt}"
                if s1.source == "deliver" and self.rolled_back(s1.queue, s1.start, s2.end):
                    continue  # push leases are plain writes: power loss may undo them
                self.fail(
                    "attempts-increase",
                    f"{s1.queue} message {s1.id} was {_PAST[s1.source]} at attempt {s1.attempt} "
                    f"({s1.where()}), then {then} ({s2.where()})",
                    s1.op,
                    s2.op,
                )

    def _check_settlements(self, key: tuple[str, int]) -> None:
        queue, i = key
        settled = self.settlements[key]
        leases = [s for s in self.seen.get(key, []) if s.source == "lease"]
        for st in settled:
            if st.result is not True:
                continue
            for s in leases:
                if s.attempt > st.attempt and s.end < st.start:
                    self.fail(
                        "stale-ack-refused",
                        f"{queue}: {st.what} of ({i}, {st.attempt}) answered True after lease "
                        f"({i}, {s.attempt}) ({s.where()})",
                        s.op,
                        st.op,
                    )
            for first in settled:
                if (
                    first is not st
                    and first.what in ("ack", "retry")
                    and first.result is True
                    and first.attempt == st.attempt
                    and first.end < st.start
                    and not self.rolled_back(queue, first.start, st.end)
                ):
                    self.fail(
                        "stale-ack-refused",
                        f"{queue}: lease ({i}, {st.attempt}) was settled by {first.what} "
                        f"(#{first.op.id}), then {st.what} answered True",
                        first.op,
                        st.op,
                    )
            if st.what != "ack":
                continue
            for s in self.seen.get(key, []):
                if st.end < s.start and not self.rolled_back(queue, st.start, s.end):
                    self.fail(
                        "acked-stays-acked",
                        f"{queue} message {i} was acked at attempt {st.attempt} (#{st.op.id}), "
                        f"then {_PAST[s.source]} ({s.where()}) with no power loss in between",
                        st.op,
                        s.op,
                    )

    def _acked_before(self, queue: str, i: int, before: float) -> bool:
        """An ack of the message that may have applied began before ``before``, or the push
        consumer acked a delivery of it."""
        for st in self.settlements.get((queue, i), []):
            if st.what == "ack" and st.result is not False and st.start < before:
                return True
        return any(
            s.source == "deliver" and s.outcome == "ack" and s.start < before
            for s in self.seen.get((queue, i), [])
        )

    def _drained(self, queue: str) -> bool:
        op = self.final_stats.get(queue)
        if op is None or op.status != "ok":
            self.fail("liveness", f"{queue}: no final stats after the heal", op)
            return False
        if sum(op.result[:3]) != 0:
            ready, delayed, leased, _ = op.result
            self.fail(
                "liveness",
                f"{queue} did not drain after the heal: {ready} ready, {delayed} delayed, "
                f"{leased} leased",
                op,
            )
            return False
        if queue not in self.final_dead:
            self.fail("liveness", f"{queue}: no final list of dead letters after the heal", op)
            return False
        return True

    def _check_final(self, queue: str) -> None:
        """Every message known by id is a final dead letter or was deleted by an ack of its
        last lease."""
        dead = self.final_dead[queue]
        known = {i for q, i in self.sent_ids if q == queue}
        known |= {i for q, i in self.seen if q == queue}
        for i in sorted(known - dead):
            ops = self._last_lease_unacked(queue, i)
            if ops is not None:
                origin = self.sent_ids.get((queue, i))
                self.fail(
                    "no-lost-message",
                    f"{queue} message {i} is gone, but no ack of its last lease may have "
                    f"deleted it{_last(ops)}",
                    origin[1] if origin is not None else None,
                    *(s.op for s in ops),
                )

    def _last_lease_unacked(self, queue: str, i: int) -> list[Seen] | None:
        """None if an ack of the message's last lease (or delivery) may have deleted it; else
        the last lease (empty when it was never leased)."""
        leases = [s for s in self.seen.get((queue, i), []) if s.source in ("lease", "deliver")]
        if not leases:
            return []
        last = max(leases, key=lambda s: (s.end, s.start))
        # The last to answer may be an older lease whose reply was held up (a cut link): one
        # begun after it with a greater attempt took effect after it.
        after = [s for s in leases if s.start >= last.start and s.attempt > last.attempt]
        if after:
            last = max(after, key=lambda s: (s.attempt, s.end, s.start))
        if last.source == "deliver":
            return None if last.outcome == "ack" else [last]
        for st in self.settlements.get((queue, i), []):
            if st.what == "ack" and st.attempt == last.attempt and st.result is not False:
                return None
        return [last]


def _last(seen: list[Seen]) -> str:
    if not seen:
        return " (it was never leased)"
    s = seen[0]
    return f" (last {s.source} at attempt {s.attempt}, {s.where()})"


def check_queue(
    history: History, max_attempts: Mapping[str, int], *, require_drained: bool = True
) -> list[Violation]:
    """Every queue invariant over ``history`` (see the module docstring)."""
    return QueueChecker(history, max_attempts, require_drained).check()


__all__ = ["SEND_KINDS", "QueueChecker", "Seen", "Settlement", "check_queue"]
