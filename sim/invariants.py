"""Invariants ready to use on your own app's history (docs/simulation.md), and the error a
test raises with what they found.

- ``acknowledged_writes_survive``: every write the app acknowledged is still there at the end.
- ``exactly_once``: a consumer fed at least once (a queue's push delivery, retried calls) that
  records the ids it handled has each acknowledged message's effect exactly once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Hashable, Iterable

from .check import Violation
from .history import History, Op


class CheckFailed(AssertionError):
    """Invariants were broken: ``violations`` says which, with the operations involved (the
    pytest plugin shows the history around them)."""

    def __init__(self, violations: list[Violation]) -> None:
        lines = [str(v) for v in violations[:10]]
        if len(violations) > 10:
            lines.append(f"... and {len(violations) - 10} more")
        super().__init__(f"{len(violations)} violations:\n  " + "\n  ".join(lines))
        self.violations = violations


def expect_no_violations(*checks: Iterable[Violation]) -> None:
    """Raise ``CheckFailed`` with every violation of ``checks``, if there is one."""
    found = [v for check in checks for v in check]
    if found:
        raise CheckFailed(found)


def _by_id(op: Op) -> Hashable:
    return op.args["id"]  # type: ignore[no-any-return]


def acknowledged_writes_survive(
    history: History,
    present: Iterable[Hashable],
    *,
    kinds: Collection[str],
    id_of: Callable[[Op], Hashable] = _by_id,
) -> list[Violation]:
    """Each ``ok`` operation of ``kinds`` (a write the app acknowledged) must have its id
    (``id_of(op)``, by default ``op.args["id"]``) among ``present``, what a read after the
    heal found. For data that is only added: orders, messages, events."""
    found = set(present)
    return [
        Violation(
            "no-lost-write",
            f"{op.kind} {id_of(op)!r} was acknowledged, and is gone",
            (op.id,),
        )
        for op in history.ops
        if op.kind in kinds and op.status == "ok" and id_of(op) not in found
    ]


def exactly_once(
    history: History,
    effects: Iterable[Hashable],
    *,
    kinds: Collection[str],
    id_of: Callable[[Op], Hashable] = _by_id,
) -> list[Violation]:
    """The ids a consumer recorded (``effects``, read after the heal, once the queue
    drained) against the sends (operations of ``kinds``), all the sends of one id together (a
    send retried under its id is one message): an id with an acknowledged send handled exactly
    once; one whose sends' outcomes are unknown at most once; one whose every send was refused
    never; and no id that was never sent."""
    seen = Counter(effects)
    out: list[Violation] = []
    sends: dict[Hashable, list[Op]] = {}
    for op in history.ops:
        if op.kind in kinds:
            sends.setdefault(id_of(op), []).append(op)
    for key, ops in sends.items():
        n = seen.get(key, 0)
        statuses = {op.status for op in ops}
        acked = [op for op in ops if op.status == "ok"]
        involved = tuple(op.id for op in (acked or ops))
        if acked and n == 0:
            out.append(Violation("exactly-once", f"{key!r} was sent and never handled", involved))
        elif statuses == {"fail"} and n:
            out.append(
                Violation("exactly-once", f"{key!r} was refused, and handled {n} times", involved)
            )
        elif n > 1:
            out.append(Violation("exactly-once", f"{key!r} was handled {n} times", involved))
    for key in sorted(set(seen) - set(sends), key=repr):
        out.append(Violation("exactly-once", f"{key!r} was handled and never sent"))
    return out
