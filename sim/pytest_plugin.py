"""The pytest plugin (entry point ``pytest11``): your app's tests under the simulator.

    @pytest.mark.actorkeep_sim(app=app, seeds=200)
    async def test_counter_keeps_acknowledged_increments(world: sim.World) -> None:
        ...

A marked ``async def`` test that takes the ``world`` fixture runs once per seed, each time in
a fresh ``sim.World`` (seeded scheduler, virtual time, injected faults) that owns the
``trio.run``. The first seed that fails is reported with its replay command, its faults
shrunk to a smaller schedule that still fails (``sim/shrinking.py``) and the history around the
failure (docs/testing.md).

Options: ``--actorkeep-seeds N`` and ``--actorkeep-start S`` (which seeds), ``--actorkeep-replay
SEED`` (that seed only), ``--actorkeep-schedule JSON`` (with ``--actorkeep-replay``: exactly
these faults, as a report printed them).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import pytest

from .fault_schedule import FaultSchedule

if TYPE_CHECKING:
    from .world import World

MARKER = "actorkeep_sim"
_ORIGINAL = pytest.StashKey[Callable[..., Awaitable[None]]]()
_MISUSE = pytest.StashKey[str]()


# -- pytest hooks ---------------------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("actorkeep", "actorkeep simulation (@pytest.mark.actorkeep_sim)")
    group.addoption(
        "--actorkeep-seeds",
        type=int,
        metavar="N",
        help="run each simulated test for N seeds (default: the marker's seeds=)",
    )
    group.addoption(
        "--actorkeep-start", type=int, default=0, metavar="S", help="the first seed (default 0)"
    )
    group.addoption("--actorkeep-replay", type=int, metavar="SEED", help="run only this seed")
    group.addoption(
        "--actorkeep-schedule",
        metavar="JSON",
        help="with --actorkeep-replay: inject exactly these faults (a report prints them)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(app, seeds=100, faults='all', timed=None, span=2.0, shrink=100, "
        "host_options={}, time_limit=86400): run this async test once per seed in a "
        "simulated world (the `world` fixture); docs/testing.md",
    )
    seeds = config.getoption("--actorkeep-seeds")
    if seeds is not None and seeds < 1:
        raise pytest.UsageError(f"--actorkeep-seeds must be at least 1, not {seeds}")
    if config.getoption("--actorkeep-start") < 0:
        raise pytest.UsageError("--actorkeep-start must be a seed >= 0")
    replay = config.getoption("--actorkeep-replay")
    if replay is not None and replay < 0:
        raise pytest.UsageError("--actorkeep-replay must be a seed >= 0")
    text = config.getoption("--actorkeep-schedule")
    if text is not None:
        if replay is None:
            raise pytest.UsageError("--actorkeep-schedule needs --actorkeep-replay SEED")
        try:
            FaultSchedule.from_text(text)
        except ValueError as exc:
            raise pytest.UsageError(f"--actorkeep-schedule: {exc}") from None


@pytest.fixture(name="world")
def _world_fixture(request: pytest.FixtureRequest) -> World:
    """The simulated world of the running seed (only for tests marked actorkeep_sim)."""
    if request.node.get_closest_marker(MARKER) is None:
        pytest.fail(
            "the world fixture is for tests marked @pytest.mark.actorkeep_sim(app=...)",
            pytrace=False,
        )
    # A stand-in: the plugin passes each seed's own world when it calls the test.
    return None  # type: ignore[return-value]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if not isinstance(item, pytest.Function) or item.get_closest_marker(MARKER) is None:
            continue
        item.stash[_ORIGINAL] = item.obj
        if not inspect.iscoroutinefunction(item.obj):
            item.stash[_MISUSE] = "a test marked actorkeep_sim must be an async def"
        elif "world" not in item.fixturenames:
            item.stash[_MISUSE] = "a test marked actorkeep_sim must take the world fixture"


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    marker = pyfuncitem.get_closest_marker(MARKER)
    if marker is None:
        return None
    misuse = pyfuncitem.stash.get(_MISUSE, None)
    if misuse is not None:
        pytest.fail(misuse, pytrace=False)
    from .seed_runs import failure_report, run_one, spec_of  # the runtime, only when needed

    try:
        spec = spec_of(marker)
    except ValueError as exc:
        pytest.fail(f"@pytest.mark.{MARKER}: {exc}", pytrace=False)
    test = pyfuncitem.stash[_ORIGINAL]
    # The test's own arguments, as pytest would pass them (autouse fixtures are not among them).
    params = inspect.signature(test).parameters
    kwargs = {name: value for name, value in pyfuncitem.funcargs.items() if name in params}
    for name, value in kwargs.items():
        if type(value).__name__ == "TrioFixture":
            pytest.fail(
                f"fixture {name!r} is async: a simulated test runs in its own trio.run per "
                "seed; do that setup inside the test",
                pytrace=False,
            )
    config = pyfuncitem.config
    replay = config.getoption("--actorkeep-replay")
    text = config.getoption("--actorkeep-schedule")
    if replay is not None:
        seeds = [replay]
    else:
        start = config.getoption("--actorkeep-start")
        count = config.getoption("--actorkeep-seeds") or spec.seeds
        seeds = list(range(start, start + count))
    schedule = FaultSchedule.from_text(text) if text is not None else None
    for n, seed in enumerate(seeds):
        run = run_one(spec, test, kwargs, seed, schedule)
        if run.error is not None:
            pytest.fail(
                failure_report(pyfuncitem.nodeid, spec, test, kwargs, run, n, schedule),
                pytrace=False,
            )
    return True
