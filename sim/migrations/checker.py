"""The migrations scenario's invariants, on the history of a run:

- ``migrated-writes``: the final read of each ledger holds every acknowledged write, in cents
  (those written before the conversion were converted once), no write that definitely failed
  and nothing no client wrote.
- ``migrations-once``: each ledger ends at the last version, its journal holding each
  migration's number exactly once.
- ``migrated-events``: every event ran on a database at its class's last migration, with each
  migration's effect there once (never on a half-migrated schema).
- ``migrations-durable``: no migration ran again after an answered event had seen its effect
  (what an answer reveals is durable).
"""

from __future__ import annotations

from typing import Any

from ..check import Violation
from ..history import History

#: The number of the migration that reports its runs (``to_cents``), and the last migration.
REPORTED = 3
LAST = 4
CENTS = 100


def check_migrations(history: History) -> list[Violation]:
    return (_writes(history) + _once(history) + _events(history) + _durable(history))[:20]


def _final_reads(history: History) -> dict[str, tuple[int, dict[str, Any]]]:
    """Each ledger's last read at the end (``mig.final``): its op id and what it returned."""
    return {
        o.args["address"]: (o.id, o.result)
        for o in history.ops
        if o.kind == "mig.final" and o.status == "ok"
    }


def _writes(history: History) -> list[Violation]:
    final = _final_reads(history)
    found: list[Violation] = []
    written: set[tuple[str, str]] = set()
    for op in history.ops:
        if op.kind != "mig.add" or op.args["address"] not in final:
            continue
        address, key, dollars = op.args["address"], op.args["id"], op.args["dollars"]
        written.add((address, key))
        read_id, read = final[address]
        held = read["entries"].get(key)
        if op.status == "ok" and held != dollars * CENTS:
            what = "is gone" if held is None else f"holds {held}"
            found.append(
                Violation(
                    "migrated-writes",
                    f"{address}: the acknowledged write {key} of {dollars} dollars {what}, not "
                    f"{dollars * CENTS} cents",
                    (op.id, read_id),
                )
            )
        elif op.status == "fail" and held is not None:
            found.append(
                Violation(
                    "migrated-writes",
                    f"{address}: the write {key} failed, yet it holds {held}",
                    (op.id, read_id),
                )
            )
        elif op.status == "unknown" and held not in (None, dollars * CENTS):
            found.append(
                Violation(
                    "migrated-writes",
                    f"{address}: the write {key} of {dollars} dollars holds {held}",
                    (op.id, read_id),
                )
            )
    for address, (read_id, read) in sorted(final.items()):
        for key in sorted(set(read["entries"]) - {k for a, k in written if a == address}):
            found.append(
                Violation("migrated-writes", f"{address}: {key} was never written", (read_id,))
            )
    return found


def _once(history: History) -> list[Violation]:
    found: list[Violation] = []
    final = _final_reads(history)
    unread = {o.args["address"]: o for o in history.ops if o.kind == "mig.final"}
    for address, op in sorted(unread.items()):
        if address not in final:
            found.append(
                Violation(
                    "migrations-once",
                    f"{address} could not be read at the end: {op.result}",
                    (op.id,),
                )
            )
    for address, (read_id, read) in sorted(final.items()):
        if read["version"] != LAST or read["journal"] != list(range(1, LAST + 1)):
            found.append(
                Violation(
                    "migrations-once",
                    f"{address} ends at version {read['version']} with the journal "
                    f"{read['journal']}, not at {LAST} with each migration once",
                    (read_id,),
                )
            )
    return found


def _events(history: History) -> list[Violation]:
    found: list[Violation] = []
    for f in history.observations:
        if f.kind != "mig.event":
            continue
        d = f.detail
        if d["version"] != d["declared"] or d["journal"] != list(range(1, d["version"] + 1)):
            found.append(
                Violation(
                    "migrated-events",
                    f"an event of {d['address']} ran at version {d['version']} with the journal "
                    f"{d['journal']}; its class declares {d['declared']} migrations",
                    entries=(f.index,),
                )
            )
    return found


def _durable(history: History) -> list[Violation]:
    """A run of migration ``REPORTED`` after an answer of its ledger that saw it applied."""
    found: list[Violation] = []
    seen: dict[str, int] = {}  # address -> the first answer that saw the migration applied
    answers = sorted(
        (o for o in history.ops if o.status == "ok" and isinstance(o.result, dict)),
        key=lambda o: o.complete_index,
    )
    ran = [f for f in history.observations if f.kind == "mig.ran"]
    i = 0
    for f in ran:
        while i < len(answers) and answers[i].complete_index < f.index:
            op = answers[i]
            if op.result.get("version", 0) >= REPORTED:
                seen.setdefault(op.args["address"], op.id)
            i += 1
        address = f.detail["address"]
        if address in seen:
            found.append(
                Violation(
                    "migrations-durable",
                    f"migration {REPORTED} of {address} ran again after an answer had seen it "
                    "applied: what the answer revealed was not durable",
                    (seen[address],),
                    (f.index,),
                )
            )
    return found
