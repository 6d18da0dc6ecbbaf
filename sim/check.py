"""What checkers report, and checks shared by every workload."""

from __future__ import annotations

from dataclasses import dataclass, field

from .history import History


@dataclass(frozen=True)
class Violation:
    """A broken invariant: its name, an explanation, and the operations involved."""

    invariant: str
    message: str
    ops: tuple[int, ...] = field(default=())
    entries: tuple[int, ...] = field(default=())  # history entries (observations) involved

    def __str__(self) -> str:
        ops = f" (ops {', '.join(f'#{i}' for i in self.ops)})" if self.ops else ""
        return f"{self.invariant}: {self.message}{ops}"


def check_errors(history: History) -> list[Violation]:
    """An operation that raised or timed out while its host stayed up is a bug (or a hang)."""
    out = []
    for op in history.ops:
        r = op.result
        if op.status == "unknown" and isinstance(r, dict) and r.get("host_alive"):
            out.append(Violation("no-error-while-up", f"{op.kind} failed: {r['error']}", (op.id,)))
        if op.status == "pending":
            out.append(Violation("every-op-completes", f"{op.kind} never completed", (op.id,)))
    return out
