"""What a failing run shows: the history entries around a violation."""

from __future__ import annotations

from collections.abc import Sequence

from .history import History


def _subject(entry_op: object, detail: dict[str, object] | None) -> object:
    """What an entry is about: a key, a timer, a queue or an actor (None: unknown)."""
    if detail is not None:
        return detail.get("actor", detail.get("queue"))
    args = getattr(entry_op, "args", {})
    return args.get("key", args.get("timer", args.get("queue")))


def around(
    history: History, op_ids: Sequence[int], entries: Sequence[int], context: int = 6
) -> list[str]:
    """Entries about the violation's subjects (keys, timers, queues) and every fault, from a
    little before its first operation or observation to a little after its last."""
    ops = [history.ops[i] for i in op_ids]
    observed = [e for e in history.entries if e.index in set(entries)]
    subjects = {_subject(op, None) for op in ops} | {
        _subject(None, e.fault.detail) for e in observed if e.fault is not None
    }
    subjects.discard(None)
    indexes = (
        [op.invoke_index for op in ops]
        + [int(op.complete_index) for op in ops if op.complete_index != float("inf")]
        + list(entries)
    )
    lo, hi = min(indexes) - context, max(indexes) + context
    named = f" about {sorted(map(str, subjects))}" if subjects else ""
    lines = [f"history entries {max(lo, 0)}..{hi}{named} (>> marks the ones involved):"]
    for entry in history.entries:
        if not lo <= entry.index <= hi:
            continue
        op = entry.op
        if op is not None:
            about = _subject(op, None)
        elif entry.what == "observe" and entry.fault is not None:
            about = _subject(None, entry.fault.detail)
        else:
            about = None  # faults and notes: always shown
        if (
            subjects
            and about is not None
            and about not in subjects
            and not (op and op.kind == "kv.list")
        ):
            continue
        marked = (op is not None and op.id in op_ids) or entry.index in entries
        lines.append(f"{'>>' if marked else '  '} {history.line(entry)}")
    return lines


def tail(history: History, count: int = 30) -> list[str]:
    """The last ``count`` entries of the history, and every fault before them."""
    last = history.entries[-count:]
    first = last[0].index if last else 0
    faults = [e for e in history.entries if e.index < first and e.what == "fault"]
    lines = [f"the faults before entry {first}, then the last {len(last)} entries:"]
    return lines + [f"   {history.line(e)}" for e in faults + last]
