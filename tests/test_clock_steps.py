"""Host time and a wall clock that steps (decision 0012): forward it follows, back it holds.

Each test gives the host a wall clock of its own (``Clock(wall=...)``: virtual time plus a
shift the test moves), so a step of a day takes no time at all under the MockClock.
"""

from __future__ import annotations

from pathlib import Path

import structlog
import trio
import trio.testing

import actorkeep as ak
from actorkeep.runtime.clock import Clock
from actorkeep.testing import open_host

BASE = 1_800_000_000.0
DAY = 86_400.0
fired: list[tuple[str, float]] = []

app = ak.App()


@app.actor("timer")
class Timer(ak.Actor):
    @ak.rpc
    async def arm(self, delay: float) -> float:
        at = self.now() + delay
        await self.set_alarm(at)
        return at

    @ak.rpc
    async def now_is(self) -> float:
        return self.now()

    async def alarm(self, info: ak.AlarmInfo) -> None:
        fired.append((self.address, self.now()))


class SteppingWall:
    """A wall clock: virtual time plus ``shift`` seconds."""

    def __init__(self, shift: float = 0.0) -> None:
        self.shift = shift

    def __call__(self) -> float:
        return BASE + trio.current_time() + self.shift


async def arm(host: ak.testing.TestHost, address: str, delay: float) -> float:
    at: float = (await host.request("POST", f"/{address}/_rpc/arm", json={"delay": delay})).json()
    return at


async def test_a_forward_step_is_followed_at_once(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    fired.clear()
    wall = SteppingWall()
    with structlog.testing.capture_logs() as logs:
        async with open_host(app, data_dir, clock=Clock(wall=wall)) as host:
            at = await arm(host, "timer/a", 3600)
            await trio.sleep(62)  # between two checks (they come every 5 s)
            assert fired == []
            wall.shift += DAY  # someone sets the machine's clock a day ahead
            await trio.sleep(6)  # the next check sees it once: not yet followed
            assert fired == []
            await trio.sleep(5)  # the one after confirms it
            assert [a for a, _ in fired] == ["timer/a"] and fired[0][1] >= at
            assert abs(host.host.clock.now() - wall()) < 1.0
    (step,) = [e for e in logs if e["event"].startswith("the wall clock jumped ahead")]
    assert step["seconds"] > DAY - 1


async def test_a_backward_step_never_moves_host_time_back(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    fired.clear()
    wall = SteppingWall()
    with structlog.testing.capture_logs() as logs:
        async with open_host(app, data_dir, clock=Clock(wall=wall)) as host:
            before = host.host.clock.now()
            wall.shift -= 25 * 3600
            await trio.sleep(6)
            assert host.host.clock.now() >= before + 6  # it went on, at its own pace
            at = await arm(host, "timer/b", 5)
            await trio.sleep(6)
            assert fired and fired[0][0] == "timer/b" and fired[0][1] >= at  # 5 s, not 25 h
            await trio.sleep(1200)
    behind = [e for e in logs if e["event"].startswith("the wall clock is behind host time")]
    assert 2 <= len(behind) <= 3  # at once, then once per 10 minutes: not every 5 s


async def test_a_wrong_wall_clock_corrected_within_seconds_moves_nothing(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    fired.clear()
    wall = SteppingWall()
    async with open_host(app, data_dir, clock=Clock(wall=wall)) as host:
        await arm(host, "timer/week", 7 * DAY)
        await trio.sleep(4)
        wall.shift += 365 * DAY  # a year ahead for a few seconds ...
        await trio.sleep(3)  # ... seen by one check only
        wall.shift -= 365 * DAY
        await trio.sleep(30)
        assert fired == []
        assert abs(host.host.clock.now() - wall()) < 1.0


def test_a_restart_with_the_wall_clock_behind_starts_where_the_last_run_ended(
    tmp_path: Path,
) -> None:
    fired.clear()
    data = tmp_path / "data"

    async def first() -> float:
        async with open_host(app, data, clock=Clock(wall=SteppingWall())) as host:
            await trio.sleep(100)
            return host.host.clock.now()

    async def second() -> tuple[float, float]:
        async with open_host(app, data, clock=Clock(wall=SteppingWall(-25 * 3600))) as host:
            started = host.host.clock.now()
            at = await arm(host, "timer/c", 5)
            await trio.sleep(6)
            return started, at

    ended = trio.run(first, clock=trio.testing.MockClock(autojump_threshold=0))
    with structlog.testing.capture_logs() as logs:
        started, at = trio.run(second, clock=trio.testing.MockClock(autojump_threshold=0))
    assert started >= ended  # not 25 h back
    assert [a for a, _ in fired] == ["timer/c"] and fired[0][1] >= at
    assert any(e["event"].startswith("the wall clock is behind the last time") for e in logs)


async def test_virtual_time_and_the_simulator_are_not_checked_against_the_wall(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    assert not Clock(anchor=BASE).follows_wall
    async with open_host(app, data_dir) as host:
        assert not host.host.clock.follows_wall  # a MockClock runs ahead of the wall on purpose
        start = host.host.clock.now()
        await trio.sleep(DAY)
        assert host.host.clock.now() >= start + DAY


def test_the_cli_shows_and_forgets_the_latest_host_time(tmp_path: Path) -> None:
    """After the wall clock was wrong ahead long enough to be followed, host time stays ahead
    across restarts; ``actorkeep clock --reset`` forgets it."""
    import subprocess
    import sys

    data = tmp_path / "data"

    async def ahead() -> None:
        wall = SteppingWall(30 * DAY)
        async with open_host(app, data, clock=Clock(wall=wall)):
            await trio.sleep(1)

    trio.run(ahead, clock=trio.testing.MockClock(autojump_threshold=0))

    def cli(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "actorkeep", "clock", "--data", str(data), *args],
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stdout

    assert "from the wall clock now" in cli()
    assert "forgot the latest host time" in cli("--reset")
    assert cli() == "no host time recorded: the next start follows the wall clock\n"


def test_serving_imports_neither_trio_testing_nor_pytest() -> None:
    """``trio.testing`` imports pytest where it is installed: about 70 ms at every
    start of ``actorkeep serve``. The host tells a MockClock without importing it, and a run on
    trio's own clock follows the wall."""
    import subprocess
    import sys

    code = (
        "import sys, trio, actorkeep.cli\n"
        "from actorkeep.runtime.clock import Clock, on_mock_clock\n"
        "async def main():\n"
        "    assert not on_mock_clock() and Clock().follows_wall\n"
        "trio.run(main)\n"
        "print(sorted(m for m in ('trio.testing', 'pytest') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
