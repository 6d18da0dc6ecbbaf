"""The KV workload: concurrent clients doing gets, puts, CAS, deletes, TTL puts and lists.

Each client process is an actor ``sim-kv-client/<process>`` that uses ``ak.kv.Client``; the
world calls its ``op`` method and records each call. Every written value is unique
(``<process>.<n>``), so a value read names the write it came from.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio

import actorkeep as ak
import shards

from ..history import Status
from ..world import World

KV_CLASS = "kv"
CLIENT_CLASS = "sim-kv-client"
KEYS = [b"a", b"b", b"c", b"ab", b"d/1", b"d/2"]


class KVClientActor(ak.Actor):
    """Runs one ``ak.kv`` operation per call and returns a plain, msgpack-able outcome."""

    @ak.rpc
    async def op(self, name: str, args: dict[str, Any]) -> list[Any]:
        kv = ak.kv.Client(KV_CLASS, shards=self.options["shards"])
        try:
            if name == "get":
                e = await kv.get_fresh(args["key"])
                return ["ok", None if e is None else [e.value, e.version, _ms(e.expires_at)]]
            if name == "put":
                v = await kv.put(args["key"], args["value"], args["ttl"], args["local"])
                return ["ok", v]
            if name == "cas":
                v = await kv.compare_and_set(args["key"], _expect(args["expect"]), args["value"])
                return ["ok", v]
            if name == "delete":
                return ["ok", await kv.delete(args["key"])]
            if name == "delete_if":
                return ["ok", await kv.delete_if(args["key"], _expect(args["expect"]))]
            if name == "list":
                page = await kv.list(args["prefix"], None, args["limit"])
                entries = [[e.key, e.value, e.version, _ms(e.expires_at)] for e in page.entries]
                return ["ok", entries, page.cursor]
        except ak.kv.Conflict as exc:
            return ["conflict", exc.current_version]
        except ak.Overloaded as exc:  # refused before a shard saw it: nothing happened
            return ["refused", str(exc)]
        except ak.CallTimeout as exc:  # a lost reply: it may or may not have happened
            return ["lost", str(exc)]
        raise ValueError(f"unknown op {name!r}")


def _ms(expires_at: float | None) -> int | None:
    return None if expires_at is None else round(expires_at * 1000)


def _expect(expect: Any) -> Any:
    """On the wire: None = ANY, 0 = ABSENT, n = version n (as the shard protocol)."""
    if expect is None:
        return ak.kv.ANY
    if expect == 0:
        return ak.kv.ABSENT
    return int(expect)


def make_app(n_shards: int, shard_cls: type[ak.Actor] = shards.KVShard) -> ak.App:
    """The KV shards and the client actors."""
    app = ak.App()
    app.mount(shard_cls, KV_CLASS, access="internal")
    app.mount(KVClientActor, CLIENT_CLASS, shards=n_shards)
    return app


def classify(reply: Any) -> tuple[Status, Any]:
    """``["ok", ...]`` is ok; ``["conflict", v]`` and ``["refused", why]`` are definite
    failures (nothing written); ``["lost", why]`` (a lost reply) is unknown."""
    if reply[0] == "conflict":
        return "fail", {"conflict": reply[1]}
    if reply[0] == "refused":
        return "fail", {"refused": reply[1]}
    if reply[0] == "lost":
        return "unknown", {"lost": reply[1]}
    return "ok", reply[1] if len(reply) == 2 else reply[1:]


@dataclass
class KVPlan:
    """A run's shape, drawn from the seed."""

    shards: int
    processes: int
    ops_per_process: int
    keys: list[bytes]
    think: list[float]
    ttls: list[float]


def draw_plan(rng: random.Random) -> KVPlan:
    return KVPlan(
        shards=rng.choice([1, 2, 3, 4]),
        processes=rng.randint(2, 5),
        ops_per_process=rng.randint(10, 40),
        keys=rng.sample(KEYS, rng.randint(2, len(KEYS))),
        think=rng.choice([[0.0], [0.0, 0.001, 0.01], [0.0, 0.05, 0.3]]),
        ttls=rng.choice([[0.01, 0.2], [0.5, 2.0]]),
    )


async def kv_op(world: World, process: str, name: str, args: dict[str, Any]) -> Any:
    """Run one KV operation as client ``process`` and record it; returns the op."""
    address = f"{CLIENT_CLASS}/{process}"
    return await world.invoke(
        process,
        f"kv.{name}",
        args,
        lambda: world.rpc(address, "op", timeout=None, name=name, args=args),
        classify=classify,
    )


async def kv_client(world: World, process: str, plan: KVPlan, rng: random.Random) -> None:
    """One client: a sequence of operations with think time, CAS on versions it has seen."""
    seen: dict[bytes, list[int]] = {}  # versions this client saw per key, in order
    for n in range(plan.ops_per_process):
        await trio.sleep(rng.choice(plan.think))
        key = rng.choice(plan.keys)
        value = f"{process}.{n}".encode()
        kind = rng.choices(
            ["get", "put", "cas", "delete", "delete_if", "list"], [25, 22, 25, 8, 8, 12]
        )[0]
        args: dict[str, Any]
        if kind == "get":
            args = {"key": key}
        elif kind == "put":
            ttl = rng.choice(plan.ttls) if rng.random() < 0.2 else None
            args = {"key": key, "value": value, "ttl": ttl, "local": rng.random() < 0.35}
        elif kind in ("cas", "delete_if"):
            versions = seen.get(key, [])
            r = rng.random()
            if versions and r < 0.6:
                expect: int | None = versions[-1]
            elif len(versions) > 1 and r < 0.8:
                expect = rng.choice(versions[:-1])  # stale: must lose
            elif kind == "delete_if" and r < 0.9:
                expect = None  # ANY
            else:
                expect = 0  # ABSENT
            args = {"key": key, "expect": expect}
            if kind == "cas":
                args["value"] = value
        elif kind == "delete":
            args = {"key": key}
        else:
            args = {"prefix": rng.choice([b"", key[:1]]), "limit": 100}
        op = await kv_op(world, process, kind, args)
        _learn(seen, op.kind, op.args, op.status, op.result)


def _learn(
    seen: dict[bytes, list[int]], kind: str, args: dict[str, Any], status: str, result: Any
) -> None:
    def note(key: bytes, version: int | None) -> None:
        if version is not None:
            seen.setdefault(key, []).append(version)

    if status == "ok":
        if kind == "kv.get" and result is not None:
            note(args["key"], result[1])
        elif kind in ("kv.put", "kv.cas"):
            note(args["key"], result)
        elif kind == "kv.list":
            for key, _, version, _ in result[0]:
                note(key, version)
    elif status == "fail" and "conflict" in result:
        note(args["key"], result["conflict"])


async def kv_final_reads(world: World, plan: KVPlan) -> None:
    """After the faults: every key and a full list must answer (liveness)."""
    await world.wait_up()
    for key in sorted(plan.keys):
        await kv_op(world, "final", "get", {"key": key})
    await kv_op(world, "final", "list", {"prefix": b"", "limit": 100})


def run_kv_workload(
    world: World,
    plan: KVPlan,
    rng_for: Callable[[str], random.Random],
    fault_count: int,
    power_p: float,
) -> Callable[[World], Any]:
    """The ``main`` of a KV scenario for ``World.run``."""

    async def main(w: World) -> None:
        async with trio.open_nursery() as nursery:
            for i in range(plan.processes):
                nursery.start_soon(kv_client, w, f"c{i}", plan, rng_for(f"client/c{i}"))
            if fault_count:
                span = plan.ops_per_process * (sum(plan.think) / len(plan.think) + 0.005) + 0.05
                nursery.start_soon(
                    w.timed_faults, rng_for("timed-faults"), fault_count, span, power_p
                )
        w.heal()
        await kv_final_reads(w, plan)

    return main
