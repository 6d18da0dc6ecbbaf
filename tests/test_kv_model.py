"""The KV against a model dictionary with versions, and compare-and-set races
(docs/reference.md §7)."""

from __future__ import annotations

import math
import shutil
import tempfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import trio
import trio.lowlevel
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import actorkeep as ak
from actorkeep.runtime.clock import Clock
from actorkeep.testing import open_host

from .kvutil import kvop, make_app

KEYS = [b"a", b"b", b"ab", b"c/1", b"c/2"]


@dataclass
class Op:
    user: str
    name: str
    key: bytes
    value: bytes
    expect: str  # "ANY", "ABSENT", "LAST" (last version seen for the key), "STALE"
    ttl: float | None
    wait: float


ops = st.builds(
    Op,
    user=st.sampled_from(["u1", "u2", "u3"]),
    name=st.sampled_from(["get", "put", "cas", "delete", "delete_if", "list"]),
    key=st.sampled_from(KEYS),
    value=st.binary(max_size=3),
    expect=st.sampled_from(["ANY", "ABSENT", "LAST", "STALE"]),
    ttl=st.one_of(st.none(), st.sampled_from([1.0, 5.0])),
    wait=st.sampled_from([0.0, 0.0, 0.5, 2.0]),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ops, min_size=1, max_size=30))
def test_kv_matches_a_model(program: list[Op]) -> None:
    data = Path(tempfile.mkdtemp())

    async def main() -> None:
        model: dict[bytes, tuple[bytes, int, float | None]] = {}  # key -> value, version, expiry
        last_version: dict[bytes, int] = {}
        stale_version: dict[bytes, int] = {}
        shard_versions: dict[str, list[int]] = {}  # versions come from each shard's counter
        placement = ak.kv.Client("kv", shards=4)
        # A fixed epoch anchor: the same example always meets the same millisecond rounding.
        async with open_host(make_app(), data, clock=Clock(anchor=1_700_000_000.0)) as host:
            clock = host.host.clock

            def live(key: bytes) -> tuple[bytes, int, float | None] | None:
                e = model.get(key)  # expiry in whole milliseconds, as the shard keeps it
                if e is None or (
                    e[2] is not None and e[2] <= math.floor(clock.now() * 1000) / 1000
                ):
                    return None
                return e

            for op in program:
                await trio.sleep(op.wait)
                current = live(op.key)
                expect: Any = {
                    "LAST": last_version.get(op.key, 1),
                    "STALE": stale_version.get(op.key, 1),
                }.get(op.expect, op.expect)
                want_ok = (
                    expect == "ANY"
                    or (expect == "ABSENT" and current is None)
                    or (current is not None and expect == current[1])
                )
                if op.name == "get":
                    got = await kvop(host, op.user, "get", key=op.key)
                    assert got[1] == (None if current is None else [op.key, *current])
                elif op.name in ("put", "cas"):
                    args: dict[str, Any] = {"key": op.key, "value": op.value}
                    if op.name == "cas":
                        args["expect"] = expect
                    else:
                        args["ttl"] = op.ttl
                        want_ok = True
                    got = await kvop(host, op.user, op.name, **args)
                    if want_ok:
                        assert got[0] == "ok", (op, got)
                        version = got[1]
                        seen = shard_versions.setdefault(placement.address_of(op.key), [])
                        assert all(version > v for v in seen)  # increasing, never reused
                        seen.append(version)
                        if op.key in last_version:
                            stale_version[op.key] = last_version[op.key]
                        last_version[op.key] = version
                        ttl = op.ttl if op.name == "put" else None
                        expiry = (
                            None
                            if ttl is None
                            else (math.floor(clock.now() * 1000) + math.ceil(ttl * 1000)) / 1000
                        )
                        model[op.key] = (op.value, version, expiry)
                    else:
                        assert got == ["Conflict", None if current is None else current[1]]
                elif op.name in ("delete", "delete_if"):
                    if op.name == "delete":
                        got = await kvop(host, op.user, "delete", key=op.key)
                        want_ok = True
                    else:
                        got = await kvop(host, op.user, "delete_if", key=op.key, expect=expect)
                    if want_ok:
                        assert got == ["ok", current is not None]
                        model.pop(op.key, None)
                    else:
                        assert got == ["Conflict", None if current is None else current[1]]
                else:
                    got = await kvop(host, op.user, "list", prefix=op.key[:1], limit=2)
                    expected = sorted(
                        [k, e[0], e[1]]
                        for k in model
                        if k.startswith(op.key[:1]) and (e := live(k)) is not None
                    )
                    assert got[1] == expected[:2]
                    assert (got[2] is None) == (len(expected) <= 2)

    try:
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    finally:
        shutil.rmtree(data)


async def test_concurrent_compare_and_set_increments(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Several actors race read-modify-CAS on one counter: no increment is lost or doubled."""
    app = make_app()
    kv = ak.kv.Client("kv", shards=4)
    wins: list[tuple[str, int, int]] = []
    conflicts = 0

    class Incrementer(ak.Actor):
        @ak.rpc
        async def run(self, times: int) -> None:
            nonlocal conflicts
            done = 0
            while done < times:
                entry = await kv.get_fresh(b"counter")
                n = 0 if entry is None else int(entry.value)
                expect = ak.kv.ABSENT if entry is None else entry.version
                try:
                    version = await kv.compare_and_set(b"counter", expect, b"%d" % (n + 1))
                except ak.kv.Conflict:
                    conflicts += 1
                    await trio.lowlevel.checkpoint()
                    continue
                wins.append((self.address, n + 1, version))
                done += 1

    app.mount(Incrementer, "inc")
    async with open_host(app, data_dir) as host:
        async with trio.open_nursery() as nursery:
            for i in range(6):
                nursery.start_soon(
                    partial(host.request, "POST", f"/inc/i{i}/_rpc/run", json={"times": 15})
                )
        final = await kvop(host, "u", "get", key=b"counter")
    assert int(final[1][1]) == 90
    assert sorted(n for _, n, _ in wins) == list(range(1, 91))  # each value won exactly once
    versions = [v for *_, v in sorted(wins, key=lambda w: w[1])]
    assert versions == sorted(versions) and len(set(versions)) == 90
    assert conflicts > 0  # the actors really raced
