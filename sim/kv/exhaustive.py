"""A backstop for the KV checker: an exhaustive linearizability search on short key histories.

``sim/kv/checker.py`` checks pairwise rules over version observations; it can miss a history
that only a whole order rules out (one delete made to explain two absences, for instance).
Here, for each key with at most ``max_ops`` operations (an ok ``list`` whose prefix covers the
key counts as a read of it), a depth-first
search in the style of Wing & Gong and Lowe looks for an order of the key's operations that
respects real time (an operation that completed before another was invoked comes first) and a
sequential model of one key, remembering every (operations placed, model state) pair it has
tried. A key with more operations is skipped and counted in ``KVExhaustive.skipped``; one whose
search passes ``limit`` configurations (many operations of unknown outcome overlapping, which
may each take effect anywhere after their start) is given up and counted in
``KVExhaustive.gave_up``. Both are still checked by ``sim/kv/checker.py``.

The model of one key (docs/reference.md §7, the shapes recorded by ``sim/kv/workload.py``):

- The key is absent or holds (value, version, expiry in ms or none). A write's version must be
  greater than every version the key had before it in the order (versions never come back).
- ``get`` and ``list`` return the entry, or nothing when the key is absent.
- ``put`` writes; its expiry is its execution time in ms plus ``max(1, ceil(ttl * 1000))``.
- ``cas`` writes if its expectation holds (ANY, ABSENT = 0, a version); a conflict writes
  nothing and reports the live version, which does not meet the expectation.
- ``delete`` / ``delete_if`` answer True after deleting a live key, False when the key was
  absent (and the expectation was ANY or ABSENT); a conflict is as for ``cas``.
- Time: an operation runs at some millisecond within [invoke, complete] (floored, as the shard
  floors its clock). An entry whose expiry falls in that range may be seen live or expired;
  once seen expired it stays absent, and once seen live its expiry is known to be later.
- Unknown operations may take effect at any point after their invocation, or never; not after
  their host incarnation stopped (crash, power loss or stop), since the fenced storage refuses
  late writes. Their version, and a put's expiry, are then known only as bounds until a read
  pins them.
- Power loss is modelled, not skipped: each power loss that rolled the key's shard file back is
  an extra event at its index that resets the key to one of the states it had since its last
  acknowledged durable write or delete (the file goes back to its last sync, which came at or
  after that write); versions handed out stay used.

Left out (and not counted): reads whose outcome is unknown and operations refused before a
shard saw them (``{"refused": ...}``); neither can have changed the key.

The model is exact except where it allows more than the store can do, which may hide a
violation but never invents one: successive operations are not made to run at increasing times
(only what they decided about an expiry is kept); a write after an unknown write need only
exceed the least version the unknown one may have had; a version or expiry learnt later does
not narrow the older states kept for a rollback; and a rollback may restore any state since the
last durable write, not only one a sync made durable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from actorkeep.kv import shard_for

from ..check import Violation
from ..history import NEVER, History, Op
from ..linearizability import candidates, search

KV_CLASS = "kv"
INVARIANT = "linearizable"
#: Configurations a key's search may visit before it gives up. Measured at stop 42: the KV
#: scenario's seeds 0..99 on clusters each needed at most 20,000 a key; cluster seed 172
#: needed 1.26 million (28 s) at stop 41's code, and more than 5 minutes' worth at stop 42's.
SEARCH_LIMIT = 300_000

#: The key's entry: value, version bounds, expiry bounds in ms. A version upper bound of None
#: is unbounded; an expiry lower bound of None means no expiry, an upper bound of None unbounded.
Entry = tuple[bytes, int, int | None, int | None, int | None]
Cur = Entry | None
#: (the key's entry or None, a lower bound of the greatest version the key has had, the states a
#: rollback may restore; empty when the key's shard file is never rolled back).
State = tuple[Cur, int, frozenset[Cur]]
#: What a read returned for the key: (value, version, expiry ms), or None for absent.
Seen = tuple[bytes, int, int | None] | None

_NO_STATES: frozenset[Cur] = frozenset()
_STOPS = ("crash", "power-loss", "stop")


@dataclass(slots=True)
class Step:
    """One operation of a key's history, or a power loss that rolled the key's shard back."""

    op: Op | None  # None for a rollback
    kind: str  # "read", "put", "cas", "delete", "delete_if" or "rollback"
    status: str  # "ok", "fail" or "unknown"
    inv: float  # history index of the invocation (of the fault, for a rollback)
    comp: float  # history index of the completion; NEVER when unknown
    lo_ms: int  # the operation ran at a millisecond within [lo_ms, hi_ms]
    hi_ms: int | None  # None: no known bound
    deadline: float = NEVER  # an unknown operation takes effect before this index or never
    seen: Seen = None  # for reads

    @property
    def definite(self) -> bool:
        return self.status != "unknown"


def _ms(t: float) -> int:
    return math.floor(t * 1000)


def _views(cur: Cur, lo_ms: int, hi_ms: int | None) -> list[Cur]:
    """What an operation running within [lo_ms, hi_ms] may find: the entry, narrowed to expire
    after lo_ms, and/or absence, when the entry may have expired by then."""
    if cur is None:
        return [None]
    value, vlo, vhi, elo, ehi = cur
    if elo is None:
        return [cur]
    out: list[Cur] = []
    if ehi is None or ehi > lo_ms:
        out.append((value, vlo, vhi, max(elo, lo_ms + 1), ehi))
    if hi_ms is None or elo <= hi_ms:
        out.append(None)
    return out


def _pin(entry: Entry, version: int) -> Entry | None:
    """``entry`` known to be at ``version``, or None if its bounds exclude it."""
    value, vlo, vhi, elo, ehi = entry
    if version < vlo or (vhi is not None and version > vhi):
        return None
    return (value, version, version, elo, ehi)


def _meets(view: Cur, expect: int | None) -> bool:
    """Whether ``view`` meets an expectation: None = ANY, 0 = ABSENT, n = version n."""
    if expect is None:
        return True
    if expect == 0 or view is None:
        return view is None and expect == 0
    return _pin(view, expect) is not None


def _write(state: State, new: Cur, top: int, barrier: bool) -> State:
    """The state after a write (or delete) leaves ``new``. After an acknowledged durable one
    (``barrier``) a rollback can only restore what follows it."""
    durable = state[2]
    if durable:
        durable = frozenset((new,)) if barrier else durable | {new}
    return (new, top, durable)


def _read(seen: Seen, views: list[Cur], top: int, durable: frozenset[Cur]) -> list[State]:
    if seen is None:
        return [(None, top, durable)] if None in views else []
    value, version, exp = seen
    out: list[State] = []
    for view in views:
        if view is None or view[0] != value:
            continue
        pinned = _pin(view, version)
        if pinned is None:
            continue
        _, _, _, elo, ehi = pinned
        if exp is None:
            if elo is not None:
                continue
        elif elo is None or exp < elo or (ehi is not None and exp > ehi):
            continue
        else:
            pinned = (value, version, version, exp, exp)
        out.append((pinned, max(top, version), durable))
    return out


def _conflict(
    current: int | None, expect: int | None, views: list[Cur], top: int, durable: frozenset[Cur]
) -> list[State]:
    """A refused expectation that reported ``current`` as the live version."""
    if current is None:
        if None in views and expect not in (None, 0):
            return [(None, top, durable)]
        return []
    if expect is None or expect == current:
        return []  # ANY is never refused; the expected version would have been accepted
    out: list[State] = []
    for view in views:
        if view is not None:
            pinned = _pin(view, current)
            if pinned is not None:
                out.append((pinned, max(top, current), durable))
    return out


def transitions(step: Step, state: State) -> list[State]:
    """The states the key may be in after ``step`` takes effect in ``state`` (none: it cannot
    take effect there)."""
    cur, top, durable = state
    if step.kind == "rollback":
        return [(c, top, frozenset((c,))) for c in durable]
    views = _views(cur, step.lo_ms, step.hi_ms)
    if step.kind == "read":
        return _read(step.seen, views, top, durable)
    assert step.op is not None
    args, result, status = step.op.args, step.op.result, step.status
    expect: int | None = args.get("expect")
    if status == "fail":
        return _conflict(result["conflict"], expect, views, top, durable)
    known = status == "ok"
    if step.kind in ("put", "cas"):
        if step.kind == "cas" and not any(_meets(v, expect) for v in views):
            return []
        version: int = result if known else top + 1
        if version <= top:
            return []
        elo = ehi = None
        ttl: float | None = args.get("ttl")
        if ttl is not None:
            span = max(1, math.ceil(ttl * 1000))
            elo = step.lo_ms + span
            ehi = None if step.hi_ms is None else step.hi_ms + span
        entry = (args["value"], version, version if known else None, elo, ehi)
        return [_write(state, entry, version, known and not args.get("local"))]
    # delete and delete_if (a plain delete expects ANY)
    if known and result is False:
        return [(None, top, durable)] if None in views and expect in (None, 0) else []
    if any(v is not None and _meets(v, expect) for v in views):
        return [_write(state, None, top, known)]
    return []  # an unknown delete that deletes nothing is the same as one that never ran


class KVExhaustive:
    """Searches each short key history of ``history`` for a linearization."""

    def __init__(
        self,
        history: History,
        n_shards: int,
        max_ops: int = 12,
        kv_class: str = KV_CLASS,
        limit: int = SEARCH_LIMIT,
    ) -> None:
        self.history = history
        self.n_shards = n_shards
        self.max_ops = max_ops
        self.kv_class = kv_class
        self.limit = limit
        self.checked: list[bytes] = []  # keys searched
        self.skipped: list[bytes] = []  # keys with more than max_ops operations
        self.gave_up: list[bytes] = []  # keys whose search passed limit configurations
        self.configurations = 0  # (placed, state) pairs visited, over every key
        self.violations: list[Violation] = []

    def file_of(self, key: bytes) -> str:
        return f"actors/{self.kv_class}/shard-{shard_for(key, self.n_shards)}"

    # -- building each key's steps ------------------------------------------------------------
    def _stops(self) -> dict[int, tuple[float, float]]:
        """Per host incarnation: index and time of the fault that ended it."""
        stops: dict[int, tuple[float, float]] = {}
        for f in self.history.faults:
            host = f.detail.get("host")
            if f.kind in _STOPS and isinstance(host, int):
                stops.setdefault(host, (f.index, f.time))
        return stops

    def key_steps(self) -> dict[bytes, list[Step]]:
        """The operations of every key, in invocation order (rollbacks not included)."""
        ops = [op for op in self.history.ops if op.kind.startswith("kv.")]
        keys: set[bytes] = set()
        for op in ops:
            if "key" in op.args:
                keys.add(op.args["key"])
            elif op.kind == "kv.list" and op.status == "ok":
                keys.update(entry[0] for entry in op.result[0])
        stops = self._stops()
        steps: dict[bytes, list[Step]] = {key: [] for key in keys}
        for op in ops:
            kind = op.kind[3:]
            status = op.status if op.status in ("ok", "fail") else "unknown"
            if status == "fail" and "conflict" not in op.result:
                continue  # refused before a shard saw it: nothing happened
            if status == "ok" and op.kind == "kv.get":
                r = op.result
                seen: Seen = None if r is None else (r[0], r[1], r[2])
                steps[op.args["key"]].append(self._step(op, "read", status, stops, seen))
            elif status == "ok" and op.kind == "kv.list":
                for key, seen in _listed(op, keys):
                    steps[key].append(self._step(op, "read", status, stops, seen))
            elif kind in ("put", "cas", "delete", "delete_if"):
                steps[op.args["key"]].append(self._step(op, kind, status, stops))
        return steps

    @staticmethod
    def _step(
        op: Op, kind: str, status: str, stops: dict[int, tuple[float, float]], seen: Seen = None
    ) -> Step:
        lo_ms = _ms(op.invoke_time)
        if status != "unknown":
            hi_ms = _ms(op.complete_time)
            return Step(
                op, kind, status, op.invoke_index, op.complete_index, lo_ms, hi_ms, seen=seen
            )
        index, time = stops.get(op.incarnation, (NEVER, math.inf))
        end = None if time == math.inf else _ms(time)
        return Step(op, kind, status, op.invoke_index, NEVER, lo_ms, end, deadline=index)

    def _rollbacks(self, key: bytes) -> list[Step]:
        file = self.file_of(key)
        return [
            Step(None, "rollback", "ok", f.index, f.index, 0, None)
            for f in self.history.faults
            if f.kind == "power-loss" and file in f.detail.get("rolled_back", ())
        ]

    # -- the search -----------------------------------------------------------------------------
    def check(self) -> list[Violation]:
        """Search every key with at most ``max_ops`` operations; skip (and count) the rest."""
        for key, steps in sorted(self.key_steps().items()):
            if len(steps) > self.max_ops:
                self.skipped.append(key)
                continue
            self.checked.append(key)
            self._search(key, sorted(steps + self._rollbacks(key), key=lambda s: s.inv))
        return self.violations

    def _search(self, key: bytes, steps: list[Step]) -> None:
        """Search for an order of ``steps`` (``sim/linearizability.py``); report ``key`` if
        none places every definite step."""
        tracked = any(s.kind == "rollback" for s in steps)
        initial: State = (None, 0, frozenset((None,)) if tracked else _NO_STATES)
        found = search(steps, initial, lambda i, state: transitions(steps[i], state), self.limit)
        self.configurations += found.configurations
        if found.gave_up:
            self.gave_up.append(key)
        elif not found.found:
            self._report(key, steps, (found.done, found.state))

    def _report(self, key: bytes, steps: list[Step], best: tuple[int, State]) -> None:
        """A violation for ``key``, told from the deepest point the search reached."""
        done, state = best
        ops = [s.op for s in steps if s.op is not None]
        known = [i for i, s in enumerate(steps) if s.definite and s.op is not None]
        placed = sum(1 for i in known if done >> i & 1)
        stuck = [
            op
            for i in candidates(steps, done, len(steps))
            if steps[i].definite and (op := steps[i].op) is not None
        ]
        self.violations.append(
            Violation(
                INVARIANT,
                f"{key!r}: no linearization of its {len(ops)} operations: at most {placed} of "
                f"the {len(known)} with a known outcome can be ordered, leaving the key "
                f"{_state_text(state[0])}, and none of "
                f"{', '.join(_op_text(op) for op in stuck) or 'the others'} can come next",
                tuple(sorted({op.id for op in stuck} or {op.id for op in ops})),
            )
        )


def _listed(op: Op, keys: set[bytes]) -> list[tuple[bytes, Seen]]:
    """What an ok list says of each key: its entry, or absence for a key its prefix covers
    that the page would have shown."""
    entries, cursor = op.result
    prefix: bytes = op.args["prefix"]
    out: list[tuple[bytes, Seen]] = []
    listed = set()
    for key, value, version, exp in entries:
        listed.add(key)
        out.append((key, (value, version, exp)))
    for key in sorted(keys):
        if key not in listed and key.startswith(prefix) and (cursor is None or key <= cursor):
            out.append((key, None))
    return out


def _state_text(cur: Cur) -> str:
    if cur is None:
        return "absent"
    value, vlo, vhi, elo, ehi = cur
    version = str(vlo) if vlo == vhi else f">={vlo}"
    expiry = "" if elo is None else f", expiring at {elo}..{'' if ehi is None else ehi} ms"
    return f"at {value!r} version {version}{expiry}"


def _op_text(op: Op) -> str:
    return f"#{op.id} {op.kind} ({op.status})"


def check_kv_exhaustive(history: History, n_shards: int, max_ops: int = 12) -> list[Violation]:
    """A linearizability search over each key with at most ``max_ops`` operations (given up
    past ``SEARCH_LIMIT`` configurations)."""
    return KVExhaustive(history, n_shards, max_ops).check()
