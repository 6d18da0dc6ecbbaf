"""The cluster's own checks over a history: one owner at a time, fencing, liveness after
``heal``."""

from __future__ import annotations

from ..check import Violation
from ..history import History


def check_single_owner(history: History) -> list[Violation]:
    """Every reply (and call) left a host that owned the actor's partition by the store and by
    its own clock; the store accepted no write under an epoch its partition no longer had;
    after ``heal``, every partition got an owner."""
    out = []
    for entry in history.observations:
        if entry.kind == "cluster.stale-reply":
            d = entry.detail
            out.append(
                Violation(
                    "single-owner",
                    f"host {d['host']} let a {d['what']} of {d['address']} out while the store "
                    f"said owner {d['owner']} epoch {d['epoch']}"
                    f"{' (expired)' if d['expired'] else ''}, its own clock "
                    f"{'agreed' if d['own_clock_ok'] else 'said its lease had run out'}",
                    entries=(entry.index,),
                )
            )
        elif entry.kind == "cluster.stale-commit":
            d = entry.detail
            out.append(
                Violation(
                    "fenced",
                    f"the store accepted a write of {', '.join(d['addresses'])} from "
                    f"{d['by']} under an epoch its partition no longer had",
                    entries=(entry.index,),
                )
            )
        elif entry.kind == "cluster.owned" and not entry.detail["ok"]:
            out.append(
                Violation(
                    "owned-after-heal",
                    f"some partitions had no owner {entry.detail['waited']:.1f} s after heal",
                    entries=(entry.index,),
                )
            )
    return out
