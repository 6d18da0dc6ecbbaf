"""Linearizability of your own actors' operations against a model (docs/simulation.md).

Record operations with ``world.invoke(process, kind, args, action)``, then
``check_linearizable(world.history, model)``: the exhaustive search of ``sim/linearizability.py``
looks for an order of the operations that respects real time and in which a sequential
``model`` gives every acknowledged operation the result it got.

A model is a step function ``step(state, kind, args) -> (new state, result)`` with an initial
state (states must be hashable). ``ANY`` as the result means "do not compare" (a write whose
reply says nothing). Ready models: ``register``, ``counter``, ``cas_map``; build others with
``Model``. ``partition`` splits the history into independent objects (a map's keys), each
searched alone, as linearizability allows.

How outcomes count: an ``ok`` operation took effect once, between its invocation and its
completion, with the recorded result; a ``fail`` one took no effect; an ``unknown`` one (its
host crashed, or it raised) took effect or not, with any result, but not after its host
incarnation ended. Acknowledged means durable: the models have no power loss, so an app that
acknowledges a write that power loss then undoes fails the check, as it should.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from .check import Violation
from .history import NEVER, History, Op
from .linearizability import candidates, search

S = TypeVar("S", bound=Hashable)
INVARIANT = "linearizable"
_STOPS = ("crash", "power-loss", "stop")


class _Any:
    def __repr__(self) -> str:
        return "ANY"


#: A model's result that matches whatever the operation returned.
ANY: Any = _Any()

Step = Callable[[Any, str, dict[str, Any]], tuple[Any, Any]]


@dataclass(frozen=True)
class Model(Generic[S]):
    """A sequential specification: ``step(state, kind, args) -> (state, result)`` from
    ``initial``; ``kinds``: the operation kinds it checks (None: every operation of the
    history); ``partition(op)``: the independent object an operation acts on (None: one)."""

    name: str
    initial: S
    step: Step
    kinds: Collection[str] | None = None
    partition: Callable[[Op], Hashable] | None = None


def register(initial: Hashable = None) -> Model[Hashable]:
    """One value: ``write {value}`` (result ANY), ``read {}`` -> the value."""

    def step(state: Hashable, kind: str, args: dict[str, Any]) -> tuple[Hashable, Any]:
        if kind == "write":
            return args["value"], ANY
        if kind == "read":
            return state, state
        raise ValueError(f"the register model has no operation {kind!r}")

    return Model("register", initial, step, ("write", "read"))


def counter(initial: int = 0) -> Model[int]:
    """An integer: ``incr {by=1}`` -> the new value, ``add {by=1}`` (result ANY),
    ``read {}`` -> the value."""

    def step(state: int, kind: str, args: dict[str, Any]) -> tuple[int, Any]:
        if kind in ("incr", "add"):
            new = state + int(args.get("by", 1))
            return new, new if kind == "incr" else ANY
        if kind == "read":
            return state, state
        raise ValueError(f"the counter model has no operation {kind!r}")

    return Model("counter", initial, step, ("incr", "add", "read"))


def cas_map() -> Model[Hashable]:
    """Keys to values, each key on its own: ``put {key, value}`` (result ANY), ``get {key}``
    -> the value or None, ``cas {key, expect, value}`` -> True after writing ``value`` if the
    key held ``expect`` (None: absent), else False; ``delete {key}`` (result ANY)."""

    def step(state: Hashable, kind: str, args: dict[str, Any]) -> tuple[Hashable, Any]:
        if kind == "put":
            return args["value"], ANY
        if kind == "get":
            return state, state
        if kind == "cas":
            if state == args["expect"]:
                return args["value"], True
            return state, False
        if kind == "delete":
            return None, ANY
        raise ValueError(f"the CAS map model has no operation {kind!r}")

    return Model("cas-map", None, step, ("put", "get", "cas", "delete"), lambda op: op.args["key"])


@dataclass(slots=True)
class _Step:
    op: Op
    inv: float
    comp: float
    deadline: float
    definite: bool


@dataclass
class Linearizability:
    """The outcome of ``check``: violations, and what the search did."""

    violations: list[Violation] = field(default_factory=list)
    objects: int = 0
    operations: int = 0
    configurations: int = 0


class TooBig(Exception):
    """The search gave up: the history of one object is too large or too concurrent."""


def check_linearizable(
    history: History,
    model: Model[Any],
    *,
    kinds: Collection[str] | None = None,
    limit: int = 1_000_000,
) -> list[Violation]:
    """The violations of linearizability of ``history``'s operations (of ``kinds``, else the
    model's) against ``model``; ``TooBig`` if the search of one object passes ``limit``
    configurations."""
    return check(history, model, kinds=kinds, limit=limit).violations


def check(
    history: History,
    model: Model[Any],
    *,
    kinds: Collection[str] | None = None,
    limit: int = 1_000_000,
) -> Linearizability:
    """``check_linearizable`` with what the search did."""
    wanted = kinds if kinds is not None else model.kinds
    stops: dict[int, float] = {}
    for f in history.faults:
        host = f.detail.get("host")
        if f.kind in _STOPS and isinstance(host, int):
            stops.setdefault(host, f.index)
    objects: dict[Hashable, list[_Step]] = defaultdict(list)
    for op in history.ops:
        if (wanted is not None and op.kind not in wanted) or op.status == "fail":
            continue
        definite = op.status == "ok"
        comp = op.complete_index if definite else NEVER
        deadline = NEVER if definite else stops.get(op.incarnation, NEVER)
        key = model.partition(op) if model.partition is not None else None
        objects[key].append(_Step(op, op.invoke_index, comp, deadline, definite))
    out = Linearizability()
    for key, steps in sorted(objects.items(), key=lambda kv: repr(kv[0])):
        steps.sort(key=lambda s: s.inv)
        out.objects += 1
        out.operations += len(steps)

        def transitions(i: int, state: Any, steps: list[_Step] = steps) -> Iterable[Any]:
            s = steps[i]
            new, result = model.step(state, s.op.kind, s.op.args)
            if s.definite and result is not ANY and result != s.op.result:
                return ()
            return (new,)

        found = search(steps, model.initial, transitions, limit)
        out.configurations += found.configurations
        if found.gave_up:
            raise TooBig(
                f"{model.name}{_of(key, model)}: the search passed {limit:,} configurations "
                f"over {len(steps)} operations; check fewer or less concurrent operations"
            )
        if not found.found:
            out.violations.append(_violation(model, key, steps, found.done, found.state))
    return out


def _of(key: Hashable, model: Model[Any]) -> str:
    return f" {key!r}" if model.partition is not None else ""


def _violation(
    model: Model[Any], key: Hashable, steps: list[_Step], done: int, state: Any
) -> Violation:
    known = [i for i, s in enumerate(steps) if s.definite]
    placed = sum(1 for i in known if done >> i & 1)
    stuck = [steps[i].op for i in candidates(steps, done, len(steps)) if steps[i].definite]
    told = ", ".join(f"#{op.id} {op.kind} {op.args} -> {op.result!r}" for op in stuck)
    return Violation(
        INVARIANT,
        f"{model.name}{_of(key, model)}: no order of its {len(steps)} operations fits the "
        f"model: at most {placed} of the {len(known)} acknowledged ones can be ordered, "
        f"leaving the state {state!r}, and none of {told or 'the others'} can come next",
        tuple(sorted({op.id for op in stuck} or {s.op.id for s in steps})),
    )
