"""The exhaustive linearizability search (Wing & Gong, with Lowe's memo of configurations),
shared by the KV checker (``sim/kv/exhaustive.py``) and the checkers of users' own models
(``sim/models.py``).

The history is a list of steps, each with the history indexes of its invocation and its
completion (``NEVER`` for an operation whose outcome is unknown). The search looks for an order
of the steps that respects real time (a step that completed before another was invoked comes
first) in which each step can take effect, in the state the steps before it left, according to
``transitions``. Every definite step must be placed; an unknown one may be placed (it took
effect) or not (it never did), but not after its ``deadline``: once a step invoked after the
deadline is placed, the unknown steps it rules out are dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

S = TypeVar("S", bound=Hashable)


class Placeable(Protocol):
    """What the search needs of a step."""

    @property
    def inv(self) -> float: ...

    @property
    def comp(self) -> float: ...

    @property
    def deadline(self) -> float: ...

    @property
    def definite(self) -> bool: ...


@dataclass(frozen=True)
class Search(Generic[S]):
    """What the search found: ``found`` an order placing every definite step, or not; the
    deepest point it reached (``done``, a bit per step placed, and the ``state`` there); how
    many (placed, state) configurations it visited; ``gave_up`` when it hit ``limit``."""

    found: bool
    done: int
    state: S
    configurations: int
    gave_up: bool = False


def search(
    steps: Sequence[Placeable],
    initial: S,
    transitions: Callable[[int, S], Iterable[S]],
    limit: int | None = None,
) -> Search[S]:
    """Depth-first over (steps placed, state), placing a step no unplaced definite step
    precedes, until every definite step is placed. ``transitions(i, state)``: the states
    step ``i`` may leave when it takes effect in ``state`` (none: it cannot). ``limit``:
    give up after visiting that many configurations."""
    n = len(steps)
    definite = sum(1 << i for i, s in enumerate(steps) if s.definite)
    # Placing step i drops the unknown steps that had to take effect before it.
    drops = [
        sum(1 << j for j, u in enumerate(steps) if not u.definite and u.deadline <= s.inv)
        for s in steps
    ]
    start = (0, initial)
    seen = {start}
    stack = [start]
    best = start
    while stack:
        done, state = stack.pop()
        if done & definite == definite:
            return Search(True, done, state, len(seen))
        if (done & definite).bit_count() > (best[0] & definite).bit_count():
            best = (done, state)
        for i in candidates(steps, done, n):
            placed = done | 1 << i | drops[i]
            for after in transitions(i, state):
                nxt = (placed, after)
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        if limit is not None and len(seen) > limit:
            return Search(False, best[0], best[1], len(seen), gave_up=True)
    return Search(False, best[0], best[1], len(seen))


def candidates(steps: Sequence[Placeable], done: int, n: int) -> list[int]:
    """The steps not yet placed that no unplaced definite step precedes in real time."""
    out: list[int] = []
    first_comp = float("inf")
    i = (~done & (done + 1)).bit_length() - 1  # the first step not placed
    while i < n:
        s = steps[i]
        if s.inv > first_comp:
            break  # this and every later step were invoked after an unplaced step completed
        if not done >> i & 1:
            out.append(i)
            if s.definite and s.comp < first_comp:
                first_comp = s.comp
        i += 1
    return out
