"""``ak.testing``: the host clock follows trio's clock across hosts (docs/reference.md §9)."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

import actorkeep as ak
from actorkeep.runtime.clock import Clock
from actorkeep.testing import open_host

app = ak.App()


@app.actor("c")
class C(ak.Actor):
    @ak.rpc
    async def clock(self) -> float:
        return self.now()


async def test_epoch_anchor_is_fixed_once_per_run(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        first = (await host.request("POST", "/c/a/_rpc/clock")).json()
    await trio.sleep(500)  # no host open
    async with open_host(app, data_dir) as host:
        second = (await host.request("POST", "/c/a/_rpc/clock")).json()
        await host.restart()
        await trio.sleep(5)
        third = (await host.request("POST", "/c/a/_rpc/clock")).json()
    assert second - first == 500
    assert third - second == 5


async def test_fixed_anchor_for_simulation(autojump_clock: trio.testing.MockClock) -> None:
    clock = Clock(anchor=1_000_000.0)
    assert clock.now() == 1_000_000.0 + trio.current_time()
    at = 1_000_123.456
    deadline = clock.trio_time(at)
    assert clock.anchor + deadline >= at
    await trio.sleep_until(deadline)
    assert clock.now() >= at


@given(
    st.floats(min_value=0, max_value=4e9, allow_nan=False),
    st.floats(min_value=-1e9, max_value=4e9, allow_nan=False),
)
def test_trio_time_is_never_early(anchor: float, at: float) -> None:
    clock = Clock(anchor=anchor)
    t = clock.trio_time(at)
    assert anchor + t >= at
