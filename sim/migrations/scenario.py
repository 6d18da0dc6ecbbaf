"""The migrations scenario: clients write to ledgers and read them while the app is deployed
twice (``World.deploy``), each deploy adding migrations, under crashes and power loss; then
every ledger is read (``app`` says what the versions migrate, ``checker`` what is checked).

The second deploy's conversion fails half-way on a ledger that took a refund: its events fail
naming the migration, and it stays at its version until the third deploy fixes the migration.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import asdict, dataclass
from typing import Any

import trio

from actorkeep.errors import RemoteError

from ..faults import FaultDraw
from ..history import History, Op, Status
from ..runner import Scenario, Setup
from ..world import World
from .app import LEDGER, REFUND_REFUSED, Recorder, make_apps
from .bugs import MIGRATION_BUGS
from .checker import check_migrations

CLIENTS = 2
#: After the heal: time for restarts to end before the final reads.
SETTLE = 5.0
#: Final reads of a ledger before giving up on it (``migrations-once`` reports it).
FINAL_TRIES = 20


@dataclass(frozen=True)
class MigrationPlan:
    ledgers: int
    refunds: int  # ledgers that take refunds (negative amounts) before the second version
    ops: int  # operations of each client in each of the three versions
    reads: float  # the share of them that read
    gap: float  # the most virtual seconds between a client's operations


def draw_plan(rng: random.Random) -> MigrationPlan:
    ledgers = rng.randint(3, 7)
    return MigrationPlan(
        ledgers=ledgers,
        refunds=rng.randint(0, 2),
        ops=rng.randint(3, 8),
        reads=rng.choice((0.3, 0.5)),
        gap=rng.choice((0.2, 1.0)),
    )


@dataclass
class Refused:
    """An event failed because the second version's conversion refused a refund."""

    message: str


def _classify(reply: Any) -> tuple[Status, Any]:
    if isinstance(reply, Refused):
        return "fail", reply.message
    return "ok", reply


async def _call(w: World, address: str, method: str, **args: Any) -> Any:
    try:
        return await w.rpc(address, method, timeout=None, **args)
    except RemoteError as exc:
        if exc.error == "MigrationError" and REFUND_REFUSED in exc.message:
            return Refused(exc.message)
        raise


def workload(plan: MigrationPlan, recorder: Recorder, draw: FaultDraw, apps: list[Any]) -> Any:
    ledgers = [f"{LEDGER}/l{i}" for i in range(plan.ledgers)]
    refunding = set(ledgers[: plan.refunds])
    ids = itertools.count()

    async def client(w: World, version: int, c: int) -> None:
        rng = w.rng(f"client/{version}/{c}")
        for _ in range(plan.ops):
            await trio.sleep(rng.uniform(0.0, plan.gap))
            address = rng.choice(ledgers)
            if rng.random() < plan.reads:
                await op(w, f"c{c}", "mig.read", address, "read")
                continue
            key, dollars = f"w{next(ids)}", rng.randint(1, 100)
            if address in refunding and version == 0 and rng.random() < 0.5:
                dollars = -dollars
            await op(w, f"c{c}", "mig.add", address, "add", id=key, dollars=dollars)

    async def op(w: World, process: str, kind: str, address: str, method: str, **args: Any) -> Op:
        return await w.invoke(
            process,
            kind,
            {"address": address, **args},
            lambda: _call(w, address, method, **args),
            classify=_classify,
        )

    async def main(w: World) -> None:
        recorder.world = w
        span = 3 * plan.ops * plan.gap
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                w.timed_faults, w.rng("timed-faults"), draw.timed, span, draw.power_p
            )
            for version, app in enumerate(apps):
                if version:  # deployed, and each ledger looked at, as an operator would
                    await w.deploy(app)
                    for address in ledgers:
                        await op(w, "deploy", "mig.read", address, "read")
                async with trio.open_nursery() as clients:
                    for c in range(CLIENTS):
                        clients.start_soon(client, w, version, c)
        w.heal()
        await w.wait_up()
        await trio.sleep(SETTLE)
        for address in ledgers:
            for _ in range(FINAL_TRIES):
                if (await op(w, "final", "mig.final", address, "read")).status == "ok":
                    break
                await trio.sleep(0.5)

    return main


def setup(plan: MigrationPlan, planted: Any, draw: FaultDraw) -> Setup:
    recorder = Recorder()
    apps = make_apps(recorder)

    def ops(history: History) -> int:
        return len(history.ops) + len(history.observations)

    return Setup(
        app=apps[0],
        workload=lambda world: workload(plan, recorder, draw, apps),
        check=check_migrations,
        ops=ops,
        summary=asdict(plan),
        host_options={} if planted is None else {"migrator": planted},
    )


MIGRATIONS = Scenario("migrations", "migrations-scenario", MIGRATION_BUGS, draw_plan, setup)
