"""Schedules: many timers on one actor's alarm, cron with time zones, missed runs, retries,
and the actor's own alarm() beside them (docs/schedules.md)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import actorkeep as ak
from actorkeep.runtime.clock import Clock
from actorkeep.schedules import last_cron, next_cron
from actorkeep.testing import open_host

#: A fixed epoch at trio time zero: 2027-01-04 00:00:00 UTC, a Monday.
EPOCH = datetime(2027, 1, 4, tzinfo=UTC).timestamp()

app = ak.App()
runs: list[tuple[str, str, float, float, Any, int]] = []  # (address, key, now, due, payload, retry)
alarms: list[tuple[str, float, float]] = []  # (address, now, scheduled_at)
failing: dict[str, int] = {}  # key -> how many more runs of it raise


@app.actor("timers")
class Timers(ak.Actor):
    async def remind(self, run: ak.ScheduleRun) -> None:
        runs.append((self.address, run.key, self.now(), run.due, run.payload, run.retry_count))
        if failing.get(run.key, 0) > 0:
            failing[run.key] -= 1
            raise RuntimeError(f"{run.key} failed")

    async def alarm(self, info: ak.AlarmInfo) -> None:
        alarms.append((self.address, self.now(), info.scheduled_at))

    @ak.rpc
    async def schedule_(self, **kw: Any) -> str:
        return await self.schedule("remind", kw.pop("payload", None), **kw)

    @ak.rpc
    async def cancel(self, key: str) -> bool:
        return await self.cancel_schedule(key)

    @ak.rpc
    async def listing(self) -> list[list[Any]]:
        return [
            [s.key, s.method, s.payload, s.due, s.cron, s.tz, s.missed] for s in self.schedules()
        ]

    @ak.rpc
    async def set_alarm_(self, at: float) -> None:
        await self.set_alarm(at)

    @ak.rpc
    async def delete_alarm_(self) -> None:
        await self.delete_alarm()

    @ak.rpc
    async def get_alarm_(self) -> float | None:
        return self.get_alarm()

    @ak.rpc
    async def refused(self, **kw: Any) -> str:
        try:
            await self.schedule(kw.pop("method", "remind"), kw.pop("payload", None), **kw)
        except (ValueError, TypeError) as exc:
            return f"{type(exc).__name__}: {exc}"
        return "accepted"

    @ak.rpc
    async def in_transaction(self) -> str:
        with self.sql.transaction():
            try:
                await self.schedule("remind", delay=1)
            except RuntimeError as exc:
                return str(exc)
        return "accepted"


@app.actor("noalarm")
class NoAlarm(ak.Actor):
    """Schedules need no alarm() of the actor's own."""

    async def ping(self, run: ak.ScheduleRun) -> None:
        runs.append((self.address, run.key, self.now(), run.due, run.payload, run.retry_count))

    @ak.rpc
    async def start(self, delay: float) -> str:
        return await self.schedule("ping", delay=delay, key="p")


async def rpc(host: ak.testing.TestHost, address: str, method: str, /, **args: Any) -> Any:
    resp = await host.request("POST", f"/{address}/_rpc/{method}", json=args)
    assert resp.status == 200, resp.body
    return resp.json()


@pytest.fixture(autouse=True)
def _reset() -> None:
    runs.clear()
    alarms.clear()
    failing.clear()


def clock() -> Clock:
    return Clock(anchor=EPOCH)


async def test_one_shot_schedules_fire_on_time_in_order(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir, clock=clock()) as host:
        await rpc(host, "timers/a", "schedule_", delay=30, key="late", payload={"n": 3})
        await rpc(host, "timers/a", "schedule_", delay=10, key="soon", payload=[1, 2])
        await rpc(host, "timers/a", "schedule_", at=EPOCH + 20, key="mid")
        listing = await rpc(host, "timers/a", "listing")
        assert [row[0] for row in listing] == ["soon", "mid", "late"]
        assert listing[0] == ["soon", "remind", [1, 2], EPOCH + 10, None, None, "once"]
        await trio.sleep(100)
        assert [(k, now - EPOCH, p) for _, k, now, _, p, _ in runs] == [
            ("soon", 10, [1, 2]),
            ("mid", 20, None),
            ("late", 30, {"n": 3}),
        ]
        assert all(now == due for _, _, now, due, _, _ in runs)  # on time, never early
        assert await rpc(host, "timers/a", "listing") == []
        assert await rpc(host, "timers/a", "get_alarm_") is None


async def test_same_key_replaces_and_cancel_removes(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir, clock=clock()) as host:
        await rpc(host, "timers/a", "schedule_", delay=10, key="k", payload=1)
        await rpc(host, "timers/a", "schedule_", delay=40, key="k", payload=2)  # later: moved
        await rpc(host, "timers/a", "schedule_", delay=20, key="gone")
        assert await rpc(host, "timers/a", "cancel", key="gone") is True
        assert await rpc(host, "timers/a", "cancel", key="gone") is False
        generated = await rpc(host, "timers/a", "schedule_", delay=50)
        assert generated.startswith("remind-") and generated != "k"
        await trio.sleep(100)
        assert [(k, now - EPOCH, p) for _, k, now, _, p, _ in runs] == [
            ("k", 40, 2),
            (generated, 50, None),
        ]


async def test_the_actor_s_own_alarm_lives_beside_its_schedules(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir, clock=clock()) as host:
        await rpc(host, "timers/a", "set_alarm_", at=EPOCH + 50)  # before any schedule
        await rpc(host, "timers/a", "schedule_", delay=10, key="s10")
        await rpc(host, "timers/a", "schedule_", delay=70, key="s70")
        assert await rpc(host, "timers/a", "get_alarm_") == EPOCH + 50  # its own, not s10
        await rpc(host, "timers/a", "set_alarm_", at=EPOCH + 60)  # moved later
        await trio.sleep(30)
        assert [k for _, k, *_ in runs] == ["s10"] and alarms == []
        await trio.sleep(40)
        assert alarms == [("timers/a", EPOCH + 60, EPOCH + 60)]
        assert await rpc(host, "timers/a", "get_alarm_") is None  # a fired alarm is gone
        await trio.sleep(10)
        assert [k for _, k, *_ in runs] == ["s10", "s70"]
        # delete_alarm removes the actor's alarm only
        await rpc(host, "timers/b", "schedule_", delay=10, key="kept")
        await rpc(host, "timers/b", "set_alarm_", at=EPOCH + 90)
        await rpc(host, "timers/b", "delete_alarm_")
        await trio.sleep(100)
        assert [k for a, k, *_ in runs if a == "timers/b"] == ["kept"]
        assert [a for a, *_ in alarms] == ["timers/a"]


async def test_schedules_survive_a_restart_and_need_no_alarm_method(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir, clock=clock()) as host:
        assert await rpc(host, "noalarm/n", "start", delay=100) == "p"
        await rpc(host, "timers/a", "set_alarm_", at=EPOCH + 120)
        await rpc(host, "timers/a", "schedule_", delay=110, key="x")
    await trio.sleep(50)  # no host runs meanwhile
    async with open_host(app, data_dir, clock=clock()):
        await trio.sleep(100)
    assert [(a, k, now - EPOCH) for a, k, now, *_ in runs] == [
        ("noalarm/n", "p", 100),
        ("timers/a", "x", 110),
    ]
    assert alarms == [("timers/a", EPOCH + 120, EPOCH + 120)]


async def test_cron_every_second_fires_each_second_once(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir, clock=clock()) as host:
        await rpc(host, "timers/a", "schedule_", cron="* * * * * *", key="tick")
        await trio.sleep(300.5)
    dues = [due for *_, due, _, _ in runs]
    assert dues == [EPOCH + i for i in range(1, 301)]
    assert all(now == due for _, _, now, due, _, _ in runs)


async def test_cron_in_a_time_zone(data_dir: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with open_host(app, data_dir, clock=clock()) as host:
        await rpc(host, "timers/a", "schedule_", cron="0 9 * * *", tz="Europe/Riga", key="riga")
        (row,) = await rpc(host, "timers/a", "listing")
        # 09:00 in Riga in January (UTC+2) is 07:00 UTC
        assert row[3] == EPOCH + 7 * 3600 and row[4:6] == ["0 9 * * *", "Europe/Riga"]
        await trio.sleep(3 * 86400)
    assert [due - EPOCH for *_, due, _, _ in runs] == [7 * 3600 + d * 86400 for d in range(3)]


def test_cron_across_daylight_saving_time() -> None:
    # 2027-03-28: Riga moves from UTC+2 to UTC+3 at 03:00 local time.
    before = datetime(2027, 3, 27, tzinfo=UTC).timestamp()
    first = next_cron("0 9 * * *", "Europe/Riga", before)
    assert first is not None
    second = next_cron("0 9 * * *", "Europe/Riga", first)
    assert datetime.fromtimestamp(first, UTC).hour == 7  # 09:00 at UTC+2
    assert second is not None and datetime.fromtimestamp(second, UTC).hour == 6  # at UTC+3
    assert last_cron("0 9 * * *", "Europe/Riga", second) == second
    # New York, 2027-03-14: 02:30 does not exist; it runs when the clocks reach 03:00 (EDT)
    ny = ZoneInfo("America/New_York")
    t = next_cron(
        "30 2 * * *", "America/New_York", datetime(2027, 3, 13, 12, tzinfo=UTC).timestamp()
    )
    assert (
        t is not None and datetime.fromtimestamp(t, ny).isoformat() == "2027-03-14T03:00:00-04:00"
    )
    # 2027-11-07: 01:30 happens twice; it runs once, the first time
    t = datetime(2027, 11, 6, 12, tzinfo=UTC).timestamp()
    times = []
    for _ in range(2):
        t = next_cron("30 1 * * *", "America/New_York", t)
        assert t is not None
        times.append(datetime.fromtimestamp(t, ny).isoformat())
    assert times == ["2027-11-07T01:30:00-04:00", "2027-11-08T01:30:00-05:00"]
    assert last_cron("0 9 * * *", "Europe/Riga", second - 1) == first


@pytest.mark.parametrize(
    ("missed", "expected"),
    [
        # down from minute 2 to minute 10:30: the runs due at 3..10 were missed
        ("once", [1, 2, 10, 11]),  # one run for the latest missed, at once
        ("each", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]),
        ("skip", [1, 2, 11]),
    ],
)
async def test_missed_runs_after_downtime(
    data_dir: Path, autojump_clock: trio.testing.MockClock, missed: str, expected: list[int]
) -> None:
    async with open_host(app, data_dir, clock=clock()) as host:
        await rpc(host, "timers/a", "schedule_", cron="* * * * *", missed=missed, key="m")
        await trio.sleep(150)
    await trio.sleep(480)  # the host is down until 10:30
    async with open_host(app, data_dir, clock=clock()):
        await trio.sleep(60)
    assert [round((due - EPOCH) / 60, 6) for *_, due, _, _ in runs] == expected
    late = [now for _, _, now, due, _, _ in runs if now > due]
    assert all(now == EPOCH + 630 for now in late)  # the catch-up runs ran at the restart


async def test_a_failing_run_is_retried_then_dropped_others_go_on(
    data_dir: Path, autojump_clock: trio.testing.MockClock, capsys: pytest.CaptureFixture[str]
) -> None:
    failing["bad"] = 100
    failing["flaky"] = 1
    async with open_host(app, data_dir, clock=clock()) as host:
        await rpc(host, "timers/a", "schedule_", delay=10, key="bad")
        await rpc(host, "timers/a", "schedule_", delay=500, key="good")
        await rpc(host, "timers/b", "schedule_", delay=10, key="flaky")
        await trio.sleep(1000)
    bad = [(now - EPOCH, retry) for a, k, now, _, _, retry in runs if k == "bad"]
    # the first run and six retries, 2 s doubling, as for the alarm; then dropped
    assert [r for _, r in bad] == [0, 1, 2, 3, 4, 5, 6]
    assert [round(b - a, 6) for (a, _), (b, _) in itertools.pairwise(bad)] == [2, 4, 8, 16, 32, 64]
    assert "scheduled run dropped after its last retry" in capsys.readouterr().out
    assert [(k, now - EPOCH) for _, k, now, *_ in runs if k != "bad"] == [
        ("flaky", 10),
        ("flaky", 12),  # retried once, then done
        ("good", 500),
    ]


async def test_bad_schedules_are_refused(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir, clock=clock()) as host:
        cases: list[tuple[dict[str, Any], str]] = [
            ({}, "exactly one of"),
            ({"delay": 1, "at": EPOCH}, "exactly one of"),
            ({"delay": -1}, "delay must be >= 0"),
            ({"delay": "soon"}, "finite number"),
            ({"cron": "61 * * * *"}, "bad cron expression"),
            ({"cron": "* * *"}, "bad cron expression"),
            ({"cron": "0 9 * * *", "tz": "Mars/Olympus"}, "unknown time zone"),
            ({"delay": 1, "tz": "UTC"}, "tz= goes with cron="),
            ({"delay": 1, "key": ""}, "key must be"),
            ({"delay": 1, "key": "k" * 201}, "key must be"),
            ({"delay": 1, "missed": "later"}, "missed must be"),
            ({"delay": 1, "method": "nothing"}, "TypeError: Timers.nothing must be an async def"),
            ({"delay": 1, "method": "alarm"}, "other than alarm"),
            ({"delay": 1, "method": "__init__"}, "other than alarm"),
            ({"delay": 1, "payload": "x" * 70_000}, "at most 65536"),
        ]
        for kw, message in cases:
            assert message in await rpc(host, "timers/a", "refused", **kw), kw
        assert "inside a transaction" in await rpc(host, "timers/a", "in_transaction")
        assert await rpc(host, "timers/a", "listing") == []
        await trio.sleep(10)
        assert runs == []


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("schedule"), st.sampled_from("abc"), st.integers(0, 50)),
            st.tuples(st.just("cancel"), st.sampled_from("abc"), st.just(0)),
            st.tuples(st.just("alarm"), st.just(""), st.integers(0, 50)),
            st.tuples(st.just("noalarm"), st.just(""), st.just(0)),
            st.tuples(st.just("sleep"), st.just(""), st.integers(1, 40)),
        ),
        max_size=25,
    )
)
def test_model(tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, str, int]]) -> None:
    """Any mix of schedules, cancels and the actor's own alarm fires exactly what a model of
    them says, each once, at its due time."""
    data_dir = tmp_path_factory.mktemp("data")
    runs.clear()
    alarms.clear()

    async def main() -> None:
        due: dict[str, float] = {}  # key -> due; "" for the actor's alarm
        expected: list[tuple[str, float]] = []
        async with open_host(app, data_dir, clock=clock()) as host:

            def now() -> float:
                return EPOCH + trio.current_time()

            for op, key, n in ops:
                # Due times fall a quarter second past the whole seconds the sleeps end on.
                if op == "schedule":
                    await rpc(host, "timers/m", "schedule_", delay=n + 0.25, key=key)
                    due[key] = now() + n + 0.25
                elif op == "cancel":
                    assert await rpc(host, "timers/m", "cancel", key=key) == (key in due)
                    due.pop(key, None)
                elif op == "alarm":
                    await rpc(host, "timers/m", "set_alarm_", at=now() + n + 0.25)
                    due[""] = now() + n + 0.25
                elif op == "noalarm":
                    await rpc(host, "timers/m", "delete_alarm_")
                    due.pop("", None)
                else:
                    until = now() + n
                    await trio.sleep(n)
                    for k, at in list(due.items()):
                        if at < until:
                            expected.append((k, at))
                            del due[k]
                    assert await rpc(host, "timers/m", "get_alarm_") == due.get("")
            await trio.sleep(100)
            expected += sorted(((k, at) for k, at in due.items()), key=lambda kv: (kv[1], kv[0]))
        got = sorted(
            [(k, d) for _, k, _, d, _, _ in runs] + [("", s) for _, _, s in alarms],
            key=lambda kv: (kv[1], kv[0]),
        )
        assert got == sorted(expected, key=lambda kv: (kv[1], kv[0]))
        assert all(now == d for _, _, now, d, _, _ in runs)
        assert all(now == s for _, now, s in alarms)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
