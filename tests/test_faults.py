"""The host's fault-injection hooks (actorkeep.runtime.faults): what each hook and site does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import actorkeep as ak
import shards
from actorkeep.runtime.faults import SITES
from actorkeep.testing import open_host

app = ak.App()
app.mount(shards.KVShard, "kv", access="internal")
ran: list[tuple[str, str]] = []  # (address, what)
setups: list[str] = []
fired: list[tuple[str, float, float]] = []  # (address, now, scheduled_at)
tasks: list[tuple[object, object]] = []  # (handler task, caller task)


@app.actor("box")
class Box(ak.Actor):
    async def setup(self) -> None:
        setups.append(self.address)

    @ak.rpc
    async def touch(self) -> str:
        ran.append((self.address, "touch"))
        return "touched"

    @ak.rpc
    async def ask(self, to: str) -> Any:
        """Call ``to``'s touch and report what came back (or the error)."""
        try:
            return await self.actors.ref(to).touch()
        except ak.ActorkeepError as exc:
            return type(exc).__name__

    @ak.rpc
    async def inline_here(self) -> None:
        tasks.append((trio.lowlevel.current_task(), None))

    @ak.rpc
    async def call_inline(self, to: str) -> bool:
        await self.actors.ref(to).inline_here()
        handler_task = tasks[-1][0]
        return handler_task is trio.lowlevel.current_task()

    @ak.rpc
    async def set(self, delay: float) -> float:
        at = self.now() + delay
        await self.set_alarm(at)
        return at

    @ak.rpc
    async def kv_list(self) -> Any:
        try:
            page = await ak.kv.Client("kv", shards=4).list()
        except BaseException as exc:  # an ExceptionGroup is what this test guards against
            return type(exc).__name__
        return len(page.entries)

    @ak.rpc
    async def kv_put(self, key: str) -> int:
        return await ak.kv.Client("kv", shards=4).put(key, b"v")

    async def alarm(self, info: ak.AlarmInfo) -> None:
        fired.append((self.address, self.now(), info.scheduled_at))


class Scripted:
    """FaultHooks whose answers the test sets."""

    def __init__(self) -> None:
        self.delay = 0.0
        self.refuse: set[str] = set()
        self.lose: set[str] = set()
        self.alarm_late = 0.0
        self.sites: set[str] = set()
        self.reached: list[str] = []

    async def before_call(self, chain: tuple[str, ...], address: str) -> None:
        if self.delay:
            await trio.sleep(self.delay)
        if address in self.refuse:
            raise ak.Overloaded("refused by the test")

    def after_call(self, chain: tuple[str, ...], address: str) -> None:
        if address in self.lose:
            raise ak.CallTimeout("reply lost by the test")

    def alarm_delay(self, address: str) -> float:
        return self.alarm_late

    def buggify(self, site: str) -> bool:
        self.reached.append(site)
        return site in self.sites


@pytest.fixture(autouse=True)
def _reset() -> None:
    ran.clear()
    setups.clear()
    fired.clear()
    tasks.clear()


async def call(th: ak.testing.TestHost, address: str, method: str, /, **args: Any) -> Any:
    resp = await th.request("POST", f"/{address}/_rpc/{method}", json=args)
    assert resp.status == 200, resp.body
    return resp.json()


async def test_a_refused_call_never_reaches_the_callee(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    hooks = Scripted()
    hooks.refuse.add("box/b")
    async with open_host(app, data_dir, faults=hooks) as th:
        assert await call(th, "box/a", "ask", to="box/b") == "Overloaded"
        assert ran == []
        assert await call(th, "box/a", "ask", to="box/c") == "touched"


async def test_a_lost_reply_comes_after_the_callee_ran(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    hooks = Scripted()
    hooks.lose.add("box/b")
    async with open_host(app, data_dir, faults=hooks) as th:
        assert await call(th, "box/a", "ask", to="box/b") == "CallTimeout"
        assert ran == [("box/b", "touch")]


async def test_a_delayed_call_takes_the_delay(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    hooks = Scripted()
    async with open_host(app, data_dir, faults=hooks) as th:
        hooks.delay = 7.0
        start = trio.current_time()
        assert await call(th, "box/a", "ask", to="box/b") == "touched"
        assert trio.current_time() - start == pytest.approx(7.0)


async def test_calls_from_outside_are_not_hooked(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    hooks = Scripted()
    hooks.refuse.add("box/a")
    async with open_host(app, data_dir, faults=hooks) as th:
        assert await call(th, "box/a", "touch") == "touched"


async def test_kv_list_raises_the_shard_error_itself(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A list fans out to every shard; one refused call raises Overloaded, not a group."""
    hooks = Scripted()
    async with open_host(app, data_dir, faults=hooks) as th:
        assert await call(th, "box/a", "kv_list") == 0
        hooks.refuse.add("kv/shard-2")
        assert await call(th, "box/a", "kv_list") == "Overloaded"


async def test_a_late_alarm_fires_late_never_early(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    hooks = Scripted()
    hooks.alarm_late = 5.0
    async with open_host(app, data_dir, faults=hooks) as th:
        at = await call(th, "box/a", "set", delay=10.0)
        await trio.sleep(14.0)
        assert fired == []
        await trio.sleep(2.0)
        assert [(a, s) for a, _, s in fired] == [("box/a", at)]
        assert fired[0][1] == pytest.approx(at + 5.0)


async def test_without_hooks_buggify_is_false(data_dir: Path) -> None:
    async with open_host(app, data_dir) as th:
        assert th.host.buggify("host.no-inline") is False


async def test_evict_after_event_runs_setup_again(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    hooks = Scripted()
    async with open_host(app, data_dir, faults=hooks) as th:
        await call(th, "box/a", "touch")
        await call(th, "box/a", "touch")
        assert setups == ["box/a"]
        hooks.sites.add("host.evict-after-event")
        await call(th, "box/a", "touch")  # inline on the live instance, then evicted
        assert setups == ["box/a"] and th.host.active_count == 0
        await call(th, "box/a", "touch")  # a new instance, on the worker, evicted again
        await call(th, "box/a", "touch")
        assert setups == ["box/a", "box/a", "box/a"]
        assert "host.evict-after-event" in hooks.reached


async def test_no_inline_runs_the_handler_on_the_worker(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    hooks = Scripted()
    async with open_host(app, data_dir, faults=hooks) as th:
        await call(th, "box/b", "touch")  # box/b is active and idle: the inline path applies
        assert await call(th, "box/a", "call_inline", to="box/b") is True
        hooks.sites.add("host.no-inline")
        assert await call(th, "box/a", "call_inline", to="box/b") is False


async def test_a_failing_alarm_event_is_retried_with_backoff(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    hooks = Scripted()
    hooks.sites.add("host.alarm-event-fails")
    async with open_host(app, data_dir, faults=hooks) as th:
        at = await call(th, "box/a", "set", delay=1.0)
        await trio.sleep(10.0)
        assert fired == []
        # Tried at 1 s, then 2, 4 s later: three tries in ten seconds, not one every 2 s.
        assert hooks.reached.count("host.alarm-event-fails") == 3
        hooks.sites.clear()
        await trio.sleep(3.0)
        assert fired == []  # the next try is 8 s after the third
        await trio.sleep(3.0)
        assert [(a, s) for a, _, s in fired] == [("box/a", at)]


async def test_an_early_wake_never_fires_an_alarm_early(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    hooks = Scripted()
    hooks.sites.add("host.alarm-early-wake")
    async with open_host(app, data_dir, faults=hooks) as th:
        at_b = await call(th, "box/b", "set", delay=50.0)
        at_a = await call(th, "box/a", "set", delay=20.0)
        await trio.sleep(60.0)
        assert "host.alarm-early-wake" in hooks.reached
        assert sorted((a, s) for a, _, s in fired) == [("box/a", at_a), ("box/b", at_b)]
        assert all(now >= scheduled for _, now, scheduled in fired)


async def test_short_reservations_never_reuse_a_version(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    hooks = Scripted()
    hooks.sites.add("kv.short-reservation")
    async with open_host(app, data_dir, faults=hooks) as th:
        versions = [await call(th, "box/a", "kv_put", key="k") for _ in range(7)]
        await th.restart()
        versions += [await call(th, "box/a", "kv_put", key="k") for _ in range(3)]
    assert versions == sorted(set(versions))
    # Blocks of 2: the durable counter moved in small steps, not by 1,000.
    assert versions[-1] < 20


def test_every_site_is_reached_by_the_runtime() -> None:
    root = Path(__file__).resolve().parents[1]
    source = "".join(
        p.read_text()
        for p in [*root.glob("actorkeep/**/*.py"), *root.glob("shards/*.py")]
        if p.name != "faults.py"
    )
    for site in SITES:
        assert f'buggify("{site}")' in source, site
