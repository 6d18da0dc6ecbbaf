"""A seed fixes everything: trio's scheduler, virtual time, and every random stream."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any

import trio


def sub_rng(seed: int, name: str) -> random.Random:
    """An independent random stream for one component (str seeds do not depend on
    PYTHONHASHSEED)."""
    return random.Random(f"{seed}/{name}")


def _trio_run_module() -> Any:
    import trio._core._run as run_module

    if not hasattr(run_module, "_ALLOW_DETERMINISTIC_SCHEDULING") or not isinstance(
        getattr(run_module, "_r", None), random.Random
    ):
        raise RuntimeError(
            f"trio {trio.__version__} has no trio._core._run._ALLOW_DETERMINISTIC_SCHEDULING / "
            "_r: the simulator cannot make its scheduler deterministic. Pin a trio version that "
            "has them (0.25 to 0.35 do) or port sim/determinism.py."
        )
    return run_module


@contextlib.contextmanager
def seeded_scheduler(seed: int) -> Iterator[None]:
    """Make trio's run queue order a function of ``seed`` for the duration of the block.

    trio shuffles each batch of runnable tasks with its module RNG ``_r`` once they are sorted
    by creation order when ``_ALLOW_DETERMINISTIC_SCHEDULING`` is set (its Hypothesis hook). We
    set the flag, seed ``_r``, and restore both afterwards.
    """
    run_module = _trio_run_module()
    flag = run_module._ALLOW_DETERMINISTIC_SCHEDULING
    state = run_module._r.getstate()
    run_module._ALLOW_DETERMINISTIC_SCHEDULING = True
    run_module._r.seed(f"{seed}/trio-scheduler")
    try:
        yield
    finally:
        run_module._ALLOW_DETERMINISTIC_SCHEDULING = flag
        run_module._r.setstate(state)


@contextlib.contextmanager
def quiet_logs() -> Iterator[None]:
    """Drop the runtime's structlog output (a crashed host logs every fenced event)."""
    import structlog

    old = structlog.get_config()

    def drop(*_: Any) -> Any:
        raise structlog.DropEvent

    structlog.configure(processors=[drop])
    try:
        yield
    finally:
        structlog.configure(**old)


class StepCounter(trio.abc.Instrument):
    """Counts task steps: part of the trace hash, so a scheduling difference shows."""

    def __init__(self) -> None:
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps += 1
