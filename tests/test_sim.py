"""The simulator: determinism, the world's faults, and checkers that catch planted bugs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import trio
import trio._core._run as trio_run

import actorkeep as ak
import shards
from actorkeep.wire import kv as kv_wire
from sim import World, run_seed
from sim.__main__ import main as sim_main
from sim.check import check_errors
from sim.determinism import seeded_scheduler
from sim.faults import ALL_FAULTS, Faults
from sim.history import History, Status
from sim.kv.checker import check_kv
from sim.kv.workload import kv_op, make_app
from sim.storage import SimDatabase

ROOT = Path(__file__).resolve().parent.parent


def _hash_in_subprocess(seed: int, hashseed: str) -> str:
    env = {**os.environ, "PYTHONHASHSEED": hashseed, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-m", "sim", "hash", str(seed)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return out.stdout.strip()


# -- determinism ----------------------------------------------------------------------------
def test_same_seed_same_trace_hash() -> None:
    a, b = run_seed("kv", 11), run_seed("kv", 11)
    assert a.trace_hash == b.trace_hash
    assert [str(v) for v in a.violations] == [str(v) for v in b.violations]
    assert run_seed("kv", 12).trace_hash != a.trace_hash


def test_trace_hash_does_not_depend_on_pythonhashseed() -> None:
    here = run_seed("kv", 3).trace_hash
    assert _hash_in_subprocess(3, "1") == here
    assert _hash_in_subprocess(3, "987654") == here


def test_the_scheduler_flags_are_restored_after_a_run() -> None:
    flag = trio_run._ALLOW_DETERMINISTIC_SCHEDULING
    state = trio_run._r.getstate()
    run_seed("kv", 1)
    assert flag == trio_run._ALLOW_DETERMINISTIC_SCHEDULING
    assert trio_run._r.getstate() == state


def _schedule(seed: int) -> list[int]:
    """The order in which 20 tasks, all runnable at once, get their second step."""
    order: list[int] = []

    async def task(i: int) -> None:
        await trio.lowlevel.checkpoint()
        order.append(i)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(task, i)

    with seeded_scheduler(seed):
        trio.run(main)
    return order


def test_the_seed_decides_trio_s_schedule() -> None:
    """The private hooks the simulator sets still steer trio's run queue: the same seed gives
    the same order, other seeds other orders. If a trio release changes the hooks, this fails
    (and pyproject.toml caps trio below the next release for that reason)."""
    assert _schedule(1) == _schedule(1)
    assert len({tuple(_schedule(seed)) for seed in range(8)}) > 1


def test_missing_trio_internals_fail_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(trio_run, "_ALLOW_DETERMINISTIC_SCHEDULING")
    with pytest.raises(RuntimeError, match="cannot make its scheduler deterministic"):
        run_seed("kv", 1)


# -- the world ------------------------------------------------------------------------------
def test_crash_between_the_durable_commit_and_the_reply_is_unknown_and_kept() -> None:
    """A crash right after the fsync of a put: the caller learns nothing, the write survives."""
    world = World(make_app(1), seed=0)
    ops = []

    def crash_after_the_row_is_synced(db: SimDatabase) -> None:
        if db.key != "actors/kv/shard-0" or world.crashes:
            return
        if db.conn.execute("SELECT count(*) FROM actorkeep_kv").fetchone()[0]:
            world.crash(restart_after=0.0)

    world.storage.on_sync = crash_after_the_row_is_synced

    async def main(w: World) -> None:
        args = {"key": b"k", "value": b"v1", "ttl": None, "local": False}
        ops.append(await kv_op(w, "c0", "put", args))
        await w.wait_up()
        ops.append(await kv_op(w, "c0", "get", {"key": b"k"}))

    world.run(main)
    put, get = ops
    assert put.status == "unknown" and put.incarnation == 1
    assert [f.kind for f in world.history.faults][:2] == ["crash", "restart"]
    assert get.status == "ok" and get.result[0] == b"v1" and get.incarnation == 2


def test_power_loss_drops_a_local_write_and_the_checker_allows_it() -> None:
    world = World(make_app(1), seed=0, faults=Faults(rollback_p=1.0))
    ops = []

    async def main(w: World) -> None:
        ops.append(
            await kv_op(w, "c0", "put", {"key": b"k", "value": b"d", "ttl": None, "local": False})
        )
        ops.append(
            await kv_op(w, "c0", "put", {"key": b"k", "value": b"l", "ttl": None, "local": True})
        )
        assert w.crash(power_loss=True)
        await w.restart()
        ops.append(await kv_op(w, "c0", "get", {"key": b"k"}))
        ops.append(
            await kv_op(w, "c0", "put", {"key": b"k", "value": b"n", "ttl": None, "local": False})
        )

    world.run(main)
    _, local, get, after = ops
    assert get.result[0] == b"d"  # the local write is gone, the durable one is not
    assert after.result > local.result  # its version is never handed out again
    assert check_kv(world.history, 1) == []
    # The same history with the local write marked durable is a stale read.
    local.args["local"] = False
    assert any(v.invariant == "no-stale-read" for v in check_kv(world.history, 1))


def test_users_can_run_their_own_app() -> None:
    app = ak.App()

    @app.actor("counter")
    class Counter(ak.Actor):
        async def setup(self) -> None:
            self.sql.exec("CREATE TABLE IF NOT EXISTS c (id INTEGER PRIMARY KEY, n INTEGER)")

        @ak.rpc
        async def incr(self) -> int:
            self.sql.exec("INSERT INTO c VALUES (0, 1) ON CONFLICT(id) DO UPDATE SET n = n + 1")
            await self.sql.sync()
            return int(self.sql.exec("SELECT n FROM c").fetchone()[0])

    async def main(w: World) -> list[int]:
        got = [await w.rpc("counter/a", "incr") for _ in range(3)]
        w.crash()
        await w.restart()
        got.append(await w.rpc("counter/a", "incr"))
        resp = await w.request("POST", "/counter/a/_rpc/incr", json={})
        got.append(resp.json())
        return got

    assert World(app, seed=1).run(main) == [1, 2, 3, 4, 5]


# -- the checkers can fail ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("bug", "invariants"),
    [
        ("reuse-versions", {"one-value-per-version", "versions-increase"}),
        ("blind-cas", {"cas-follows-expected", "no-stale-read"}),
        # A lost acknowledged put: a read after it sees the older value, and no order of the
        # operations explains the history (the exhaustive check), whichever the seed shows.
        ("lazy-durable", {"no-stale-read", "linearizable"}),
    ],
)
def test_a_planted_bug_is_reported_with_its_seed(
    bug: str, invariants: set[str], capsys: pytest.CaptureFixture[str]
) -> None:
    for seed in range(60):
        result = run_seed("kv", seed, bug)
        if result.violations:
            break
    else:
        pytest.fail(f"60 seeds did not catch {bug}")
    assert {v.invariant for v in result.violations} & invariants
    assert sim_main(["--seeds", "1", "--start", str(seed), "--bug", bug]) == 1
    out = capsys.readouterr().out
    assert f"kv seed {seed}: FAILED" in out
    assert f"replay: python -m sim replay {seed} --scenario kv --bug {bug}" in out
    assert sim_main(["replay", str(seed), "--bug", bug]) == 1
    assert "VIOLATION" in capsys.readouterr().out


def test_an_error_while_the_host_is_up_is_a_violation() -> None:
    class Broken(shards.KVShard):
        @kv_wire.DELETE.handler
        async def delete(self, frame: dict[str, object]) -> dict[str, object]:
            raise RuntimeError("boom")

    async def main(w: World) -> None:
        await kv_op(w, "c0", "delete", {"key": b"k"})

    world = World(make_app(1, Broken), seed=0)
    world.run(main)
    (v,) = check_errors(world.history)
    assert v.invariant == "no-error-while-up"


def test_a_phantom_and_a_visible_failed_write_are_reported() -> None:
    h = History()
    w = h.invoke("c0", "kv.cas", {"key": b"k", "expect": 7, "value": b"x"}, 1, 0.0)
    h.complete(w, "fail", {"conflict": None}, 0.0)
    r = h.invoke("c1", "kv.get", {"key": b"k"}, 1, 0.0)
    h.complete(r, "ok", [b"x", 3, None], 0.0)
    r2 = h.invoke("c1", "kv.get", {"key": b"k"}, 1, 0.0)
    h.complete(r2, "ok", [b"nobody", 4, None], 0.0)
    found = {v.invariant for v in check_kv(h, 1)}
    assert {"failed-write-invisible", "no-phantom"} <= found


# -- the sweep ------------------------------------------------------------------------------
def test_a_sweep_is_clean_and_fast(capsys: pytest.CaptureFixture[str]) -> None:
    started = time.perf_counter()
    assert sim_main(["--seeds", "40", "--start", "1000"]) == 0
    elapsed = time.perf_counter() - started
    out = capsys.readouterr().out
    assert "40 seeds (1000..1039), 0 failed" in out
    assert elapsed < 40 * 300 / 200  # 200 seeds must take well under 5 minutes


async def test_a_world_can_run_inside_a_mock_clock_run(
    autojump_clock: object,
) -> None:
    from examples.sim_counter.test_sim_counter import app

    async def scenario(w: World) -> int:
        await w.rpc("counter/a", "incr")
        w.crash(power_loss=True)
        await w.restart()
        return int(await w.rpc("counter/a", "incr"))

    assert await World(app, seed=4).arun(scenario) == 2


def _history(steps: list[tuple[str, str, dict[str, Any], Status, Any]]) -> History:
    history = History()
    t = 1.0
    for process, kind, args, status, result in steps:
        op = history.invoke(process, kind, args, 1, t)
        history.complete(op, status, result, t + 0.001)
        t += 0.002
    return history


def test_a_delete_that_deleted_nothing_does_not_explain_an_absence() -> None:
    """put acked durably at v1, then delete answers False, then get finds nothing: the
    acknowledged write was lost, and the delete must not vouch for it."""
    put = {"key": b"a", "value": b"c0.0", "ttl": None, "local": False}
    lost = _history(
        [
            ("c0", "kv.put", put, "ok", 1),
            ("c1", "kv.delete", {"key": b"a"}, "ok", False),
            ("c1", "kv.get", {"key": b"a"}, "ok", None),
        ]
    )
    assert [v.invariant for v in check_kv(lost, 1)] == ["no-stale-read"]
    deleted = _history(
        [
            ("c0", "kv.put", put, "ok", 1),
            ("c1", "kv.delete", {"key": b"a"}, "ok", True),
            ("c1", "kv.get", {"key": b"a"}, "ok", None),
        ]
    )
    assert check_kv(deleted, 1) == []


def test_a_quarantine_in_a_simulation_is_reported_as_false_damage() -> None:
    """The simulator never damages a file, so a quarantine means the host mistook what a crash
    or power loss left for damage. Plant one (a registered shard's file removed behind the
    host's back) and the seed fails with no-false-damage."""
    from sim.runner import seed_result

    world = World(make_app(2), 5)

    async def main(w: World) -> None:
        put = ak.codec.pack(
            {"key": b"a", "value": b"1", "expect": None, "ttl": None, "local": False}
        )
        await w.call_as("app/x", "kv/shard-0", "POST", kv_wire.PUT.path, put)
        await trio.sleep(1)  # registered
        await w.stop()
        del w.storage.files["actors/kv/shard-0"]
        await w.start()
        get = ak.codec.pack({"key": b"a"})
        with pytest.raises(ak.Quarantined):
            await w.call_as("app/x", "kv/shard-0", "POST", kv_wire.GET.path, get)

    world.run(main)
    result = seed_result(5, world, [], 0, time.perf_counter(), {})
    assert [v.invariant for v in result.violations] == ["no-false-damage"]
    assert "kv/shard-0 was quarantined: its database file is missing" in str(result.violations[0])


@pytest.mark.parametrize(
    ("scenario", "within", "faults", "invariants"),
    [
        ("kv", 60, ALL_FAULTS, {"no-stale-read", "linearizable"}),
        ("queues", 60, ALL_FAULTS, {"no-lost-message", "no-phantom", "attempts-increase"}),
        (
            # Power loss is what undoes an early reply; the alarm workload has few gated
            # writes (a third of its seeds none at all), so it runs with that fault alone.
            "alarms",
            200,
            frozenset({"power", "fsync"}),
            {
                "alarm-at-least-once",
                "alarm-liveness",
                "alarm-replaced-never-fires",
                "alarm-timely",
            },
        ),
    ],
)
def test_an_output_gate_that_releases_early_is_caught_by_every_checker(
    scenario: str,
    within: int,
    faults: frozenset[str],
    invariants: set[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The planted early-reply gate (sim/bugs.py) answers gated writes before their fsync:
    the scenario's own checker sees acknowledged writes undone by power loss."""
    for seed in range(within):
        result = run_seed(scenario, seed, "early-reply", faults)
        if result.violations:
            break
    else:
        pytest.fail(f"{within} seeds of {scenario} did not catch early-reply")
    assert {v.invariant for v in result.violations} & invariants
    assert run_seed(scenario, seed, None, faults).ok  # the same seed, the real gate: clean
    argv = ["--seeds", "1", "--start", str(seed), "--scenario", scenario, "--bug", "early-reply"]
    assert sim_main([*argv, "--faults", ",".join(sorted(faults))]) == 1
    replay = next(ln for ln in capsys.readouterr().out.splitlines() if "replay:" in ln)
    assert f"replay {seed} --scenario {scenario}" in replay and "--bug early-reply" in replay


def test_the_sweep_s_help_names_the_one_seed_commands() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "sim", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for command in ("replay SEED", "hash SEED", "selfcheck SEED"):
        assert f"python -m sim {command}" in out


def test_a_world_heals_its_own_copy_of_the_faults() -> None:
    from examples.sim_counter.test_sim_counter import app

    faults = Faults(op_crash_p=0.5, crash_after_sync_p=0.1)
    world = World(app, seed=1, faults=faults)
    world.heal()
    assert (world.faults.op_crash_p, world.faults.crash_after_sync_p) == (0.0, 0.0)
    assert (faults.op_crash_p, faults.crash_after_sync_p) == (0.5, 0.1)  # for the next world
