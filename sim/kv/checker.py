"""The KV checker: per-key linearizability checked through versions (docs/reference.md §7, §10).

Every operation is turned into observations of one key during the operation's interval: the
key held version v (with value x, when known), or the key was absent. Writes are known by their
unique values. The invariants:

- ``one-value-per-version``: within a shard, a version always names the same key and value
  (no version reuse, not even after a crash or power loss).
- ``no-phantom`` / ``failed-write-invisible``: every value read was written by an operation
  that did not fail, under the same key, invoked before the read completed.
- ``versions-increase``: a write acknowledged after a version was observed on its shard (in
  real time) has a greater version.
- ``no-stale-read``: after an observation of version v completed, no later operation observes
  an older version, nor absence, unless a delete, an expiry or the loss of a non-durable write
  (local, or never acknowledged, and rolled back by power loss) explains it. Absence is never
  followed by a version whose write completed before it.
- ``no-expired-read``: a read never returns an entry whose expiry had passed when it began.
- ``cas-follows-expected``: a successful compare-and-set with expected version e writes the
  version that directly follows e: no acknowledged, surviving write lies between them. A
  conflict never reports the expected version as current.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from actorkeep.kv import shard_for

from ..check import Violation
from ..history import History, Op

KV_CLASS = "kv"


@dataclass(slots=True)
class Obs:
    """Key ``key`` was at ``version`` (None: absent) at some point of ``op``'s interval."""

    op: Op
    key: bytes
    version: int | None
    value: bytes | None = None
    exp_ms: int | None = None  # known only from reads
    from_read: bool = False


def _ms(t: float) -> int:
    return math.floor(t * 1000)


class KVChecker:
    """Checks the ``kv.*`` operations of a history made against ``n_shards`` shards."""

    def __init__(self, history: History, n_shards: int, kv_class: str = KV_CLASS) -> None:
        self.history = history
        self.n_shards = n_shards
        self.kv_class = kv_class
        self.ops = [op for op in history.ops if op.kind.startswith("kv.")]
        self.violations: list[Violation] = []
        self._reported: set[tuple[str, str]] = set()
        self.writes: dict[bytes, Op] = {}  # value -> the put/cas that wrote it
        self.obs: dict[bytes, list[Obs]] = defaultdict(list)
        self.acked: dict[bytes, list[Op]] = defaultdict(list)  # ok writes per key
        self.deletes: dict[bytes, list[Op]] = defaultdict(list)  # deletes that may have deleted
        self.ttl_writes: dict[bytes, list[Op]] = defaultdict(list)
        self.version_write: dict[tuple[bytes, int], Op] = {}
        self.version_exp: dict[tuple[bytes, int], int] = {}
        self.rollbacks: list[tuple[int, frozenset[str]]] = [
            (f.index, frozenset(f.detail.get("rolled_back", ())))
            for f in history.faults
            if f.kind == "power-loss"
        ]

    def file_of(self, key: bytes) -> str:
        return f"actors/{self.kv_class}/shard-{shard_for(key, self.n_shards)}"

    def fail(self, invariant: str, message: str, *ops: Op) -> None:
        if (invariant, message) in self._reported:
            return  # the same fact seen through another operation
        self._reported.add((invariant, message))
        self.violations.append(Violation(invariant, message, tuple(sorted({o.id for o in ops}))))

    # -- building observations --------------------------------------------------------------
    def _collect(self) -> None:
        keys: set[bytes] = set()
        for op in self.ops:
            if "key" in op.args:
                keys.add(op.args["key"])
            if op.kind in ("kv.put", "kv.cas"):
                self.writes[op.args["value"]] = op
        for op in self.ops:
            self._observe(op, keys)

    def _check_acked_versions(self) -> None:
        for (key, version), op in list(self.version_write.items()):
            if op.status == "ok" and op.result != version:
                self.fail(
                    "one-value-per-version",
                    f"{key!r}: value {op.args['value']!r} was acknowledged as version "
                    f"{op.result} but read as version {version}",
                    op,
                )

    def _observe(self, op: Op, keys: set[bytes]) -> None:
        kind, a, r = op.kind, op.args, op.result
        add = self.obs[a["key"]].append if "key" in a else None
        if op.status == "ok":
            if kind == "kv.get":
                assert add is not None
                if r is None:
                    add(Obs(op, a["key"], None))
                else:
                    add(Obs(op, a["key"], r[1], r[0], r[2], from_read=True))
            elif kind == "kv.list":
                entries, cursor = r
                listed = set()
                for key, value, version, exp in entries:
                    listed.add(key)
                    self.obs[key].append(Obs(op, key, version, value, exp, from_read=True))
                if cursor is None:
                    for key in sorted(keys):
                        if key.startswith(a["prefix"]) and key not in listed:
                            self.obs[key].append(Obs(op, key, None))
            elif kind in ("kv.put", "kv.cas"):
                assert add is not None
                self.acked[a["key"]].append(op)
                add(Obs(op, a["key"], r, a["value"]))
                if kind == "kv.cas":
                    self._expected(op, add)
            elif kind == "kv.delete":
                assert add is not None
                if r is False:
                    add(Obs(op, a["key"], None))
            elif kind == "kv.delete_if":
                assert add is not None
                self._expected(op, add)
        elif op.status == "fail" and kind in ("kv.cas", "kv.delete_if") and "conflict" in r:
            assert add is not None
            current, expect = r["conflict"], a["expect"]
            add(Obs(op, a["key"], current))
            if (expect == 0 and current is None) or (expect and current == expect):
                self.fail(
                    "cas-follows-expected",
                    f"{kind} on {a['key']!r} expecting {_expect_text(expect)} was refused "
                    f"although the current version is {current}",
                    op,
                )
        # A delete explains an absence only if it may have deleted something: one that
        # answered False deleted nothing (and must not vouch for its own observation).
        if kind in ("kv.delete", "kv.delete_if") and (
            op.status == "unknown" or (op.status == "ok" and op.result is True)
        ):
            self.deletes[a["key"]].append(op)
        if kind == "kv.put" and op.status in ("ok", "unknown") and a.get("ttl") is not None:
            self.ttl_writes[a["key"]].append(op)

    @staticmethod
    def _expected(op: Op, add: Any) -> None:
        expect = op.args["expect"]
        if expect == 0:
            add(Obs(op, op.args["key"], None))
        elif expect is not None:
            add(Obs(op, op.args["key"], expect))

    # -- helpers ----------------------------------------------------------------------------
    def rolled_back(self, key: bytes, after: float, before: float) -> bool:
        """A power loss rolled the key's shard file back between two history indexes."""
        f = self.file_of(key)
        return any(after < i < before and f in files for i, files in self.rollbacks)

    def maybe_lost(self, key: bytes, version: int, after: float, before: float) -> bool:
        """The write of ``version`` may have vanished between two indexes: it was not
        acknowledged as durable, and a power loss rolled its file back in between."""
        w = self.version_write.get((key, version))
        if w is not None and w.status == "ok" and not w.args.get("local"):
            return False
        return self.rolled_back(key, after, before)

    def exp_lower(self, key: bytes, version: int) -> int | None:
        """The earliest millisecond at which ``version`` of ``key`` can have expired."""
        exact = self.version_exp.get((key, version))
        if exact is not None:
            return exact
        w = self.version_write.get((key, version))
        if w is None:
            return -1  # a version whose write is unknown: it may have had any ttl
        ttl: float | None = w.args.get("ttl")
        if ttl is None:
            return None
        return _ms(w.invoke_time) + max(1, math.ceil(ttl * 1000))

    # -- the checks -------------------------------------------------------------------------
    def check(self) -> list[Violation]:
        self._collect()
        self._check_values()
        self._check_acked_versions()
        self._check_version_order()
        for key in sorted(self.obs):
            self._check_key(key)
        self._check_cas()
        return self.violations

    def _check_values(self) -> None:
        by_shard: dict[str, dict[int, tuple[bytes, bytes | None, Op]]] = defaultdict(dict)
        for key in sorted(self.obs):
            for o in self.obs[key]:
                if o.version is None:
                    continue
                if o.value is not None:
                    w = self.writes.get(o.value)
                    if w is None:
                        self.fail("no-phantom", f"{key!r} read {o.value!r}: nobody wrote it", o.op)
                        continue
                    if w.args["key"] != key:
                        self.fail(
                            "no-phantom",
                            f"{key!r} read {o.value!r}, written to {w.args['key']!r}",
                            o.op,
                            w,
                        )
                    if w.status == "fail":
                        self.fail(
                            "failed-write-invisible",
                            f"{key!r} read {o.value!r} from a write that failed",
                            o.op,
                            w,
                        )
                    if w.invoke_index > o.op.complete_index:
                        self.fail(
                            "no-phantom",
                            f"{key!r} read {o.value!r} before it was written",
                            o.op,
                            w,
                        )
                    self.version_write.setdefault((key, o.version), w)
                if o.from_read and o.exp_ms is not None:
                    self.version_exp[(key, o.version)] = o.exp_ms
                    if o.exp_ms <= _ms(o.op.invoke_time):
                        self.fail(
                            "no-expired-read",
                            f"{key!r} version {o.version} expired at {o.exp_ms} ms, read at "
                            f"{_ms(o.op.invoke_time)} ms",
                            o.op,
                        )
                table = by_shard[self.file_of(key)]
                prior = table.get(o.version)
                if prior is None:
                    table[o.version] = (key, o.value, o.op)
                    continue
                pkey, pvalue, pop = prior
                if pkey != key or (
                    pvalue is not None and o.value is not None and pvalue != o.value
                ):
                    self.fail(
                        "one-value-per-version",
                        f"version {o.version} of {self.file_of(key)} carries {pkey!r}={pvalue!r} "
                        f"and {key!r}={o.value!r}",
                        pop,
                        o.op,
                    )
                elif pvalue is None and o.value is not None:
                    table[o.version] = (key, o.value, o.op)

    def _check_version_order(self) -> None:
        by_file: dict[str, list[Obs]] = defaultdict(list)
        for key in sorted(self.obs):
            by_file[self.file_of(key)].extend(o for o in self.obs[key] if o.version is not None)
        for key in sorted(self.acked):
            f = self.file_of(key)
            for w in self.acked[key]:
                for o in by_file[f]:
                    assert o.version is not None
                    if o.op.precedes(w) and w.result <= o.version:
                        self.fail(
                            "versions-increase",
                            f"{key!r} got version {w.result} after version {o.version} of "
                            f"{o.key!r} was seen on the same shard",
                            o.op,
                            w,
                        )

    def _check_key(self, key: bytes) -> None:
        obs = self.obs[key]
        for o1 in obs:
            for o2 in obs:
                if not o1.op.precedes(o2.op):
                    continue
                if o1.version is not None and o2.version is not None:
                    if o2.version < o1.version and not self.maybe_lost(
                        key, o1.version, o1.op.invoke_index, o2.op.complete_index
                    ):
                        self.fail(
                            "no-stale-read",
                            f"{key!r} was at version {o1.version}, then seen at older version "
                            f"{o2.version}",
                            o1.op,
                            o2.op,
                        )
                elif o1.version is not None:  # seen, then absent
                    if not self._absence_explained(key, o1, o2):
                        self.fail(
                            "no-stale-read",
                            f"{key!r} was at version {o1.version}, then read as absent with no "
                            "delete, expiry or power loss to explain it",
                            o1.op,
                            o2.op,
                        )
                elif o2.version is not None:  # absent, then an older write seen again
                    w = self.version_write.get((key, o2.version))
                    if (
                        w is not None
                        and w.precedes(o1.op)
                        and self.exp_lower(key, o2.version) is None
                        and not self.rolled_back(key, o1.op.invoke_index, o2.op.complete_index)
                    ):
                        self.fail(
                            "no-stale-read",
                            f"{key!r} was absent after version {o2.version} was written, then "
                            f"version {o2.version} came back",
                            w,
                            o1.op,
                            o2.op,
                        )

    def _absence_explained(self, key: bytes, o1: Obs, o2: Obs) -> bool:
        assert o1.version is not None
        lo, hi = o1.op.invoke_index, o2.op.complete_index
        for d in self.deletes[key]:
            if d.complete_index > lo and d.invoke_index < hi:
                return True
        until = _ms(o2.op.complete_time)
        exp = self.exp_lower(key, o1.version)
        if exp is not None and exp <= until:
            return True
        for w in self.ttl_writes[key]:
            if w.complete_index > lo and w.invoke_index < hi:
                bound = _ms(w.invoke_time) + max(1, math.ceil(w.args["ttl"] * 1000))
                if bound <= until:
                    return True
        return self.maybe_lost(key, o1.version, lo, hi)

    def _check_cas(self) -> None:
        for op in self.ops:
            if op.kind != "kv.cas" or op.status != "ok" or not op.args["expect"]:
                continue
            key, expect, version = op.args["key"], op.args["expect"], op.result
            if version <= expect:
                self.fail(
                    "cas-follows-expected",
                    f"{key!r}: compare-and-set expecting {expect} wrote version {version}",
                    op,
                )
            for w in self.acked[key]:
                if w is op or not (expect < w.result < version):
                    continue
                if not self.maybe_lost(key, w.result, w.invoke_index, op.complete_index):
                    self.fail(
                        "cas-follows-expected",
                        f"{key!r}: compare-and-set expecting version {expect} succeeded with "
                        f"version {version}, but version {w.result} was written in between",
                        w,
                        op,
                    )


def _expect_text(expect: int | None) -> str:
    return "ANY" if expect is None else "ABSENT" if expect == 0 else f"version {expect}"


def check_kv(history: History, n_shards: int) -> list[Violation]:
    """Every KV invariant over ``history`` (see the module docstring)."""
    return KVChecker(history, n_shards).check()
