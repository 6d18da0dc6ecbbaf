"""The pytest plugin (sim/pytest_plugin.py), run as a user would: pytest on a test file of an
app, through the ``pytest11`` entry point the package installs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

APP = """
import pytest
import trio

import actorkeep as ak
import sim

app = ak.App()


@app.actor("counter")
class Counter(ak.Actor):
    migrations = ["CREATE TABLE c (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)"]

    @ak.rpc
    async def incr(self) -> int:
        {write}(
            "INSERT INTO c VALUES (0, 1) ON CONFLICT(id) DO UPDATE SET n = n + 1"
        )
        return int(self.sql.exec("SELECT n FROM c").fetchone()[0])

    @ak.rpc
    async def read(self) -> int:
        row = self.sql.exec("SELECT n FROM c").fetchone()
        return 0 if row is None else int(row[0])


async def increments(world: sim.World) -> None:
    async def client(name: str) -> None:
        for _ in range(10):
            await world.invoke(name, "incr", {{}}, lambda: world.rpc("counter/a", "incr"))

    async with trio.open_nursery() as nursery:
        for name in ("c1", "c2", "c3"):
            nursery.start_soon(client, name)
    world.heal()
    await world.invoke("check", "read", {{}}, lambda: world.rpc("counter/a", "read"))
"""

DURABLE = "await self.sql.exec_durable"
PLAIN = "self.sql.exec"  # acknowledged before it is durable: power loss can undo it

CHECKED = """

@pytest.mark.actorkeep_sim(app, seeds={seeds})
async def test_counter(world: sim.World) -> None:
    await increments(world)
    sim.expect_no_violations(sim.check_linearizable(world.history, sim.counter()))
"""


def counter_test(pytester: pytest.Pytester, write: str, seeds: int = 40) -> Path:
    return pytester.makepyfile(test_app=APP.format(write=write) + CHECKED.format(seeds=seeds))


def recorder(pytester: pytest.Pytester, marker: str) -> Path:
    """A test that writes down the seed of each world it gets, and passes."""
    log = pytester.path / "seeds.txt"
    pytester.makepyfile(
        test_seeds=APP.format(write=DURABLE)
        + textwrap.dedent(f"""

        @pytest.mark.actorkeep_sim({marker})
        async def test_record(world: sim.World) -> None:
            await world.invoke("c", "incr", {{}}, lambda: world.rpc("counter/a", "incr"))
            with open({str(log)!r}, "a") as f:
                f.write(f"{{world.seed}}\\n")
        """)
    )
    return log


def seeds_run(log: Path) -> list[int]:
    return [int(line) for line in log.read_text().split()]


def test_a_marked_test_runs_once_per_seed_each_in_its_own_world(
    pytester: pytest.Pytester,
) -> None:
    log = recorder(pytester, "app, seeds=3")
    pytester.runpytest().assert_outcomes(passed=1)
    assert seeds_run(log) == [0, 1, 2]
    log.unlink()
    pytester.runpytest("--actorkeep-seeds", "4", "--actorkeep-start", "7").assert_outcomes(passed=1)
    assert seeds_run(log) == [7, 8, 9, 10]
    log.unlink()
    pytester.runpytest("--actorkeep-replay", "12").assert_outcomes(passed=1)
    assert seeds_run(log) == [12]


def test_it_works_beside_pytest_trio_s_trio_mode(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ntrio_mode = true\n")
    log = recorder(pytester, "app, seeds=2")
    pytester.runpytest().assert_outcomes(passed=1)
    assert seeds_run(log) == [0, 1]


def test_a_correct_app_passes_its_seeds(pytester: pytest.Pytester) -> None:
    counter_test(pytester, DURABLE, seeds=40)
    pytester.runpytest().assert_outcomes(passed=1)


def test_a_lost_write_is_caught_with_its_replay_command_and_a_shrunk_schedule(
    pytester: pytest.Pytester,
) -> None:
    counter_test(pytester, PLAIN, seeds=40)
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    seed = int(re.search(r"seed (\d+) failed \((\d+) seeds passed before it\)", out)[1])  # type: ignore[index]
    assert "linearizable: counter: no order of its" in out
    assert f"replay it: pytest 'test_app.py::test_counter' --actorkeep-replay {seed}\n" in out
    faults = int(re.search(r"its faults: (\d+) fault", out)[1])  # type: ignore[index]
    shrunk = re.search(r"shrunk: (\d+) faults -> (\d+) in (\d+) runs", out)
    assert shrunk is not None and int(shrunk[1]) == faults
    assert 1 <= int(shrunk[2]) < faults
    schedule = re.search(r"--actorkeep-schedule '(\[.*\])'\n", out)
    assert schedule is not None
    assert len(json.loads(schedule[1])) == int(shrunk[2])
    assert re.search(r"^>> +\d+ ", out, re.M)  # the history around the failure, marked
    # The replay command fails the same seed again; so does the shrunk schedule, exactly.
    again = pytester.runpytest("--actorkeep-replay", str(seed))
    again.assert_outcomes(failed=1)
    assert f"seed {seed} failed (0 seeds passed before it)" in again.stdout.str()
    replayed = pytester.runpytest(
        "--actorkeep-replay", str(seed), "--actorkeep-schedule", schedule[1]
    )
    replayed.assert_outcomes(failed=1)
    assert "linearizable: counter" in replayed.stdout.str()
    assert f"its faults: {shrunk[2]} fault" in replayed.stdout.str()


def test_a_test_that_runs_differently_each_time_is_called_out(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_flaky=APP.format(write=DURABLE)
        + textwrap.dedent("""
        RUNS: list[int] = []

        @pytest.mark.actorkeep_sim(app, seeds=1, shrink=0)
        async def test_flaky(world: sim.World) -> None:
            RUNS.append(1)
            for _ in range(len(RUNS)):
                await world.rpc("counter/a", "incr")
            assert False, "fails"
        """)
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    assert "NOT DETERMINISTIC" in result.stdout.str()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "@pytest.mark.actorkeep_sim(app)\ndef test_x(world): pass",
            "a test marked actorkeep_sim must be an async def",
        ),
        (
            "@pytest.mark.actorkeep_sim(app)\nasync def test_x(): pass",
            "a test marked actorkeep_sim must take the world fixture",
        ),
        (
            "@pytest.mark.actorkeep_sim(app, seeds=0)\nasync def test_x(world): pass",
            "seeds= must be an int >= 1, not 0",
        ),
        (
            "@pytest.mark.actorkeep_sim(app, sedes=3)\nasync def test_x(world): pass",
            "unknown arguments ['sedes']",
        ),
        (
            "@pytest.mark.actorkeep_sim(42)\nasync def test_x(world): pass",
            "app= must be an actorkeep.App, not int",
        ),
        (
            "@pytest.mark.actorkeep_sim(app, faults='meteor')\nasync def test_x(world): pass",
            "unknown fault kinds ['meteor']",
        ),
        (
            "@pytest.mark.actorkeep_sim(app, time_limit=0)\nasync def test_x(world): pass",
            "time_limit= must be virtual seconds > 0, not 0",
        ),
        ("def test_x(world): pass", "the world fixture is for tests marked"),
        (
            "@pytest.fixture\nasync def thing():\n    return 1\n\n"
            "@pytest.mark.actorkeep_sim(app)\nasync def test_x(world, thing): pass",
            "fixture 'thing' is async",
        ),
    ],
)
def test_a_misused_marker_says_what_is_wrong(
    pytester: pytest.Pytester, body: str, message: str
) -> None:
    pytester.makeini("[pytest]\ntrio_mode = true\n")
    pytester.makepyfile(test_misuse=APP.format(write=DURABLE) + "\n\n" + body + "\n")
    result = pytester.runpytest()
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) + outcomes.get("errors", 0) == 1  # at setup: an error
    assert message in result.stdout.str()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--actorkeep-seeds", "0"], "--actorkeep-seeds must be at least 1, not 0"),
        (["--actorkeep-start", "-1"], "--actorkeep-start must be a seed >= 0"),
        (["--actorkeep-replay", "-2"], "--actorkeep-replay must be a seed >= 0"),
        (["--actorkeep-schedule", "[]"], "--actorkeep-schedule needs --actorkeep-replay SEED"),
        (
            ["--actorkeep-replay", "1", "--actorkeep-schedule", '[{"kind": "meteor", "at": 1}]'],
            "--actorkeep-schedule: fault 0 of the schedule: unknown fault kind 'meteor'",
        ),
    ],
)
def test_a_bad_option_is_a_usage_error(
    pytester: pytest.Pytester, args: list[str], message: str
) -> None:
    recorder(pytester, "app, seeds=1")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()


def test_the_user_example_is_a_passing_pytest_file(pytester: pytest.Pytester) -> None:
    example = Path(__file__).parent.parent / "examples" / "sim_counter" / "test_sim_counter.py"
    pytester.makepyfile(test_example=example.read_text())
    pytester.runpytest().assert_outcomes(passed=1)


def test_the_plugin_costs_nothing_to_a_run_that_does_not_simulate() -> None:
    # pytest loads it in every run of an environment where actorkeep is installed.
    code = "import sys, sim.pytest_plugin; print(sorted({'actorkeep', 'trio'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_guide_shows_the_example_as_it_is() -> None:
    root = Path(__file__).parent.parent
    example = (root / "examples" / "sim_counter" / "test_sim_counter.py").read_text()
    code = example[example.index("from __future__ import annotations") :]
    assert f"```python\n{code}```" in (root / "docs" / "testing.md").read_text()


CONSUMERS = """
import pytest
import trio

import actorkeep as ak
import queues
import sim

app = ak.App()
app.mount(queues.Queue, "queue", access="internal")


@app.actor("mailer")
class Mailer(ak.Actor):
    migrations = ["CREATE TABLE handled (id TEXT NOT NULL)"]

    @ak.queue.consumer
    async def handle(self, msg: ak.queue.Lease) -> None:
        await self.sql.exec_durable("INSERT INTO handled VALUES (?)", (msg.body.decode(),))

    @ak.rpc
    async def handled(self) -> list[str]:
        return [row[0] for row in self.sql.exec("SELECT id FROM handled")]


@app.actor("once")
class Once(Mailer):
    migrations = ["CREATE TABLE handled (id TEXT PRIMARY KEY)"]

    @ak.queue.consumer
    async def handle(self, msg: ak.queue.Lease) -> None:
        await self.sql.exec_durable(
            "INSERT OR IGNORE INTO handled VALUES (?)", (msg.body.decode(),)
        )


@app.actor("web")
class Web(ak.Actor):
    @ak.rpc
    async def setup_queue(self, consumer: str) -> None:
        await ak.queue.Client("queue/q").configure(ak.queue.Config(consumer=consumer, batch_size=4))

    @ak.rpc
    async def send(self, id: str) -> int:
        return await ak.queue.Client("queue/q").send(id.encode())

    @ak.rpc
    async def pending(self) -> int:
        st = await ak.queue.Client("queue/q").stats()
        return st.ready + st.delayed + st.leased


async def run(world: sim.World, consumer: str) -> None:
    while (
        await world.invoke(
            "w", "setup", {}, lambda: world.rpc("web/w", "setup_queue", consumer=consumer)
        )
    ).status != "ok":
        pass  # its host crashed before the answer: configure again (it is idempotent)
    for i in range(20):
        send = lambda i=i: world.rpc("web/w", "send", id=f"m{i}")  # noqa: E731
        await world.invoke("w", "send", {"id": f"m{i}"}, send)
    world.heal()
    while await world.rpc("web/w", "pending"):
        await trio.sleep(1)
    effects = await world.rpc(consumer, "handled")
    sim.expect_no_violations(sim.exactly_once(world.history, effects, kinds=["send"]))


@pytest.mark.actorkeep_sim(app, seeds=60)
async def test_idempotent_consumer(world: sim.World) -> None:
    await run(world, "once/m")


@pytest.mark.actorkeep_sim(app, seeds=60, shrink=0)
async def test_consumer_that_counts_each_delivery(world: sim.World) -> None:
    await run(world, "mailer/m")
"""


def test_exactly_once_effects_of_a_queue_s_push_consumer(pytester: pytest.Pytester) -> None:
    # Push delivery is at least once: a consumer that records each delivery it gets counts a
    # message twice after a crash between its handling and the ack; one that records by the
    # message's own id does not.
    pytester.makepyfile(test_consumers=CONSUMERS)
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert re.search(r"_ test_consumer_that_counts_each_delivery _+\nseed \d+ failed", out)
    assert re.search(r"exactly-once: 'm\d+' was handled 2 times", out)


def test_a_test_that_waits_for_ever_fails_at_its_time_limit(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_stuck=APP.format(write=DURABLE)
        + textwrap.dedent("""
        @pytest.mark.actorkeep_sim(app, seeds=1, faults="none", time_limit=60)
        async def test_stuck(world: sim.World) -> None:
            while await world.rpc("counter/a", "read") < 1:  # nobody increments it
                await trio.sleep(1)
        """)
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    assert "Stuck: the workload did not end within 60 virtual seconds" in result.stdout.str()


def test_pytest_fail_in_a_marked_test_is_that_seed_s_failure(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_fails=APP.format(write=DURABLE)
        + textwrap.dedent("""
        @pytest.mark.actorkeep_sim(app, seeds=5, shrink=0)
        async def test_fails(world: sim.World) -> None:
            if world.seed == 3:
                pytest.fail("seed three is wrong")
        """)
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "seed 3 failed (3 seeds passed before it)" in out
    assert "seed three is wrong" in out and "--actorkeep-replay 3" in out


def test_a_replay_command_survives_a_quote_in_the_test_id() -> None:
    import shlex

    from sim.seed_runs import _quoted

    for text in ("test_a.py::test[it's]", '[{"kind":"buggify","at":1,"site":"a\'b"}]', ""):
        assert shlex.split(f"pytest {_quoted(text)}") == ["pytest", text]


def test_a_marked_test_gets_its_sync_fixtures(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_fixtures=APP.format(write=DURABLE)
        + textwrap.dedent("""
        from pathlib import Path

        @pytest.fixture
        def answer() -> int:
            return 42

        @pytest.mark.actorkeep_sim(app, seeds=2)
        async def test_uses(world: sim.World, answer: int, tmp_path: Path) -> None:
            assert answer == 42 and tmp_path.is_dir()
        """)
    )
    pytester.runpytest().assert_outcomes(passed=1)
