"""The recorded history of a run: operations (invoke -> ok / fail / unknown) and faults.

Every entry gets the next index of one total order (the order the world observed them in), so
"A completed before B was invoked" is ``a.complete_index < b.invoke_index``. Checkers read
``History.ops`` and ``History.faults``; the KV checker uses ops whose kind starts with
``"kv."``, a queue checker would use ``"queue."``.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

Status = Literal["pending", "ok", "fail", "unknown"]

#: An index later than every entry: the completion of an operation that never completed.
NEVER = math.inf


@dataclass(slots=True, eq=False)
class Op:
    """One operation of one client process."""

    id: int
    process: str
    kind: str
    args: dict[str, Any]
    incarnation: int
    invoke_index: int
    invoke_time: float  # host clock, epoch seconds
    status: Status = "pending"
    result: Any = None
    complete_index: float = NEVER  # int once completed with ok or fail
    complete_time: float = math.inf

    @property
    def definite(self) -> bool:
        """Completed with a known outcome (ok or fail)."""
        return self.status in ("ok", "fail")

    def precedes(self, other: Op) -> bool:
        """This operation completed before ``other`` was invoked (real-time order)."""
        return self.complete_index < other.invoke_index


@dataclass(slots=True)
class Fault:
    """A fault the world injected: crash, power loss, restart, ..."""

    index: int
    time: float
    kind: str
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Entry:
    """One line of the history: an invocation, a completion, a fault or a note."""

    index: int
    what: Literal["invoke", "complete", "fault", "observe", "note"]
    op: Op | None = None
    fault: Fault | None = None
    text: str = ""


def render(value: Any) -> str:
    """A deterministic text form of a recorded value."""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {render(value[k])}" for k in sorted(value)) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(render(v) for v in value) + "]"
    return repr(value)


class History:
    """Operations and faults in the order the world saw them."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.ops: list[Op] = []
        self.faults: list[Fault] = []
        self.observations: list[Fault] = []  # what the app reported from inside (e.g. fires)

    def _next(self) -> int:
        return len(self.entries)

    def invoke(
        self, process: str, kind: str, args: dict[str, Any], incarnation: int, now: float
    ) -> Op:
        op = Op(len(self.ops), process, kind, args, incarnation, self._next(), now)
        self.ops.append(op)
        self.entries.append(Entry(op.invoke_index, "invoke", op=op))
        return op

    def complete(self, op: Op, status: Status, result: Any, now: float) -> None:
        if op.status != "pending":
            raise RuntimeError(f"op {op.id} completed twice")
        op.status = status
        op.result = result
        if status == "unknown":
            op.complete_index = NEVER  # it may take effect at any later point
        else:
            op.complete_index = self._next()
            op.complete_time = now
        self.entries.append(Entry(self._next(), "complete", op=op))

    def fault(self, kind: str, now: float, **detail: Any) -> Fault:
        f = Fault(self._next(), now, kind, detail)
        self.faults.append(f)
        self.entries.append(Entry(f.index, "fault", fault=f))
        return f

    def observe(self, kind: str, now: float, **detail: Any) -> Fault:
        """Something the app saw from inside, in the same order (an alarm firing, a delivery)."""
        f = Fault(self._next(), now, kind, detail)
        self.observations.append(f)
        self.entries.append(Entry(f.index, "observe", fault=f))
        return f

    def note(self, text: str) -> None:
        self.entries.append(Entry(self._next(), "note", text=text))

    # -- output ---------------------------------------------------------------------------
    def line(self, entry: Entry) -> str:
        if entry.op is not None:
            op = entry.op
            if entry.what == "invoke":
                return (
                    f"{entry.index:5d} {op.invoke_time:.6f} {op.process:>6} invoke   #{op.id} "
                    f"{op.kind} {render(op.args)} (host {op.incarnation})"
                )
            return (
                f"{entry.index:5d} {'':17} {op.process:>6} {op.status:<8} #{op.id} "
                f"{op.kind} -> {render(op.result)}"
            )
        if entry.fault is not None:
            f = entry.fault
            who, what = ("app", "OBSERVE ") if entry.what == "observe" else ("world", "FAULT   ")
            return f"{entry.index:5d} {f.time:.6f} {who:>6} {what} {f.kind} {render(f.detail)}"
        return f"{entry.index:5d} {'':17} {'':>6} note     {entry.text}"

    def lines(self) -> Iterator[str]:
        for entry in self.entries:
            yield self.line(entry)

    def digest(self) -> str:
        """SHA-256 of the rendered history."""
        h = hashlib.sha256()
        for text in self.lines():
            h.update(text.encode())
            h.update(b"\n")
        return h.hexdigest()

    def counts(self) -> dict[str, int]:
        out = {"ok": 0, "fail": 0, "unknown": 0, "pending": 0}
        for op in self.ops:
            out[op.status] += 1
        return out
