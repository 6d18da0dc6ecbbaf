"""The cluster through its actors (decisions 0016 and 0017): ``actorkeep serve --cluster``
processes over a real PostgreSQL primary with a synchronous standby, both started for the run
(every commit waits for the standby to have it, as in production).

1. ``raw``: PostgreSQL's own single-row insert with the epoch check (``INSERT ... SELECT ...
   WHERE`` the lease row has the epoch), autocommit, one writer, from this process: p50 latency
   and writes/s, that is one durable write per round trip.
2. ``put``: on a 3-host cluster of this module's app, ``driver/d`` does durable KV puts one at
   a time to ``kv/shard-0`` (the shard may be on another host: then the put is forwarded),
   timed inside the actor. Target (the cluster issue): p50 within 2x of ``raw``'s.
3. ``callers``: the same driver runs 32 tasks doing durable puts to that one shard at once
   (group commit and the output gates). Target: at least 5x ``raw``'s writes/s. Also printed:
   the machine's CPU time per put (every process: the hosts, PostgreSQL, its standby; from
   ``/proc/stat``) and the rate that CPU cost allows on all of the machine's cores, which
   bounds what any batching can reach here; the CPU time per put of the shard's host's event
   loop (its main thread, from ``/proc``: one thread, so it bounds the rate on its own, however
   many cores); and puts per PostgreSQL transaction (from ``pg_stat_database``, lease renewals
   included: a lower bound). ``cores busy`` is the rate times the CPU per put: how much of the
   machine the phase kept busy (about 1 when the stages of a put wait for each other in turn).
4. ``mixed``: the crash suite's mixed load (``bench/crash.py``: durable KV puts, compare-and-set
   counters, queue sends pushed to a consumer), 18 client threads over HTTP spread over the
   hosts, on a 1-host and on a 3-host cluster, each on a fresh database: answered requests/s,
   and what each answered request cost PostgreSQL (transactions committed, WAL bytes; lease
   renewals included). This machine has 2 cores for PostgreSQL, the hosts and the client: it
   is a measure of cost, not of scale-out.

Every side runs once per round, rounds interleave, min/median/max are printed.

    python bench/cluster_actors.py [--quick] [--rounds N]
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _HERE:
    sys.path[0] = os.path.dirname(_HERE)  # bench/queue.py would shadow the stdlib's queue

import argparse
import contextlib
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from itertools import count
from pathlib import Path
from typing import Any

import psycopg
import trio

import actorkeep as ak
import shards
from bench.driver import spread
from tests.pg import Server as PgServer
from tests.pg import multi_host, running_pair
from tests.test_process import Server, http_request

BENCH_TMP = Path(__file__).resolve().parent.parent / ".bench-tmp"
APP = "bench.cluster_actors:app"
MIXED_APP = "tests.apps.crash_app:cluster_app"
CALLERS = 32
MIXED_THREADS = 18
PARTITIONS = 64
VALUE = b"v" * 100

app = ak.App()
app.mount(shards.KVShard, "kv", access="internal")
kv = ak.kv.Client("kv", shards=1)


@app.actor("driver")
class Driver(ak.Actor):
    """Durable writes, timed here (no HTTP in the figures)."""

    async def setup(self) -> None:
        self.sql.exec("CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY, v BLOB)")

    @ak.rpc
    async def own_writes(self, seconds: float) -> list[float]:
        """Seconds of each durable write of this actor's own database, one at a time."""
        lat: list[float] = []
        end = time.perf_counter() + seconds
        i = 0
        while time.perf_counter() < end:
            start = time.perf_counter()
            await self.sql.exec_durable("INSERT OR REPLACE INTO t VALUES (?, ?)", (i % 64, VALUE))
            lat.append(time.perf_counter() - start)
            i += 1
        return lat

    @ak.rpc
    async def one_by_one(self, seconds: float) -> list[float]:
        """Seconds of each durable KV put, one at a time, for ``seconds``."""
        lat: list[float] = []
        end = time.perf_counter() + seconds
        i = 0
        while time.perf_counter() < end:
            start = time.perf_counter()
            await kv.put(f"one-{i % 64}", VALUE)
            lat.append(time.perf_counter() - start)
            i += 1
        return lat

    @ak.rpc
    async def callers(self, callers: int, seconds: float) -> float:
        """Durable puts per second of ``callers`` tasks at once, for ``seconds``."""
        done = 0

        async def caller(c: int) -> None:
            nonlocal done
            while time.perf_counter() < end:
                await kv.put(f"caller-{c}", VALUE)
                done += 1

        start = time.perf_counter()
        end = start + seconds
        async with trio.open_nursery() as nursery:
            for c in range(callers):
                nursery.start_soon(caller, c)
        return done / (time.perf_counter() - start)


def drivers(conninfo: str, servers: list[Server]) -> tuple[str, str, Server]:
    """A driver on the host of ``kv/shard-0``, one on another host, and that shard's host."""
    from actorkeep.cluster.partitions import partition_of
    from bench.cluster_crash import host_id, owners

    table = owners(conninfo)
    ids = [host_id(conninfo, s) for s in servers]
    shard_host = table[partition_of("kv/shard-0", PARTITIONS)]
    local = forwarded = None
    for i in range(10_000):
        owner = table[partition_of(f"driver/d{i}", PARTITIONS)]
        if owner == shard_host and local is None:
            local = f"driver/d{i}"
        if owner != shard_host and forwarded is None:
            forwarded = f"driver/d{i}"
    assert local is not None and forwarded is not None
    return local, forwarded, servers[ids.index(shard_host)]


def raw(conninfo: str, seconds: float, seqs: count[int]) -> tuple[float, float]:
    """[writes/s, p50 ms] of single-row inserts with the epoch check, autocommit."""
    lat = []
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS raw_leases (partition int PRIMARY KEY, epoch bigint)"
        )
        conn.execute("INSERT INTO raw_leases VALUES (0, 1) ON CONFLICT DO NOTHING")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS raw_frames (address text, seq bigint, partition int, "
            "epoch bigint, data bytea, PRIMARY KEY (address, seq))"
        )
        page = bytes(range(256)) * 16  # what one durable put ships: a page of frames
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            start = time.perf_counter()
            cur = conn.execute(
                "INSERT INTO raw_frames SELECT %s, %s, 0, 1, %b WHERE EXISTS "
                "(SELECT 1 FROM raw_leases WHERE partition = 0 AND epoch = 1)",
                ("raw/r", next(seqs), page),
            )
            assert cur.rowcount == 1
            lat.append(time.perf_counter() - start)
    return len(lat) / sum(lat), statistics.median(lat) * 1e3


def busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy (all cores, all processes) since boot."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def loop_seconds(pid: int) -> float:
    """CPU seconds the main thread of process ``pid`` (a host's event loop) has used."""
    with open(f"/proc/{pid}/task/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cluster_args(conninfo: str) -> tuple[str, ...]:
    return ("--cluster", conninfo, "--partitions", str(PARTITIONS))


@contextlib.contextmanager
def cluster(app_spec: str, conninfo: str, root: Path, hosts: int) -> Iterator[list[Server]]:
    """``hosts`` hosts, until each holds its share of the partitions."""
    from bench.cluster_crash import owners, shared_out

    servers: list[Server] = []
    root.mkdir(parents=True, exist_ok=True)
    try:
        for i in range(hosts):
            servers.append(Server(app_spec, root / f"h{i}", cluster_args(conninfo)))
        end = time.monotonic() + 30
        while True:
            if shared_out(owners(conninfo), hosts, PARTITIONS):
                break
            assert time.monotonic() < end, "the partitions were not shared out"
            time.sleep(0.05)
        yield servers
    except BaseException:
        for server in servers:
            tail = "\n".join(server.stderr().splitlines()[-30:])
            print(f"--- the end of {server.log.name}:\n{tail}", file=sys.stderr)
        raise
    finally:
        for server in servers:
            server.close()


def rpc(server: Server, path: str, args: dict[str, Any]) -> Any:
    reply = server.rpc(path, args)
    assert reply.status == 200, reply
    return reply.json()


def pg_counters(primary: PgServer, dbname: str) -> tuple[int, int]:
    """[transactions committed in ``dbname``, WAL position in bytes] now."""
    [(commits,)] = primary.sql(
        f"SELECT xact_commit FROM pg_stat_database WHERE datname = '{dbname}'"
    )
    [(lsn,)] = primary.sql("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
    return int(commits), int(lsn)


def mixed(
    primary: PgServer, standby: PgServer, root: Path, hosts: int, seconds: float, seed: int
) -> tuple[float, float, float]:
    """[answered/s, commits per answer, WAL bytes per answer] of the mixed load."""
    from bench.crash import Ledger, Load

    dbname = f"mixed{hosts}_{seed}"
    primary.sql(f"CREATE DATABASE {dbname}")
    primary.sql("SELECT pg_stat_clear_snapshot()")
    conninfo = multi_host(primary, standby, dbname=dbname)
    try:
        with cluster(MIXED_APP, conninfo, root / dbname, hosts) as servers:
            ledger = Ledger()
            endpoint = b"https://hooks.example/bench"
            ledger.put_tried[b"settings/endpoint"] = {endpoint}
            reply = http_request(servers[0].port, "PUT", "/api/main/settings/endpoint", endpoint)
            assert reply.status == 200, reply
            ports = [s.port for s in servers]
            with Load(ports, ledger, random.Random(seed), 0, threads=MIXED_THREADS) as load:
                assert load.enough.wait(30), ledger.errors
                time.sleep(1.0)  # warm
                time.sleep(0.5)  # stats reach pg_stat_database within its flush interval
                c0, w0 = pg_counters(primary, dbname)
                a0, t0 = load.answered, time.perf_counter()
                time.sleep(seconds)
                a1, t1 = load.answered, time.perf_counter()
                time.sleep(0.6)
                c1, w1 = pg_counters(primary, dbname)
            assert not ledger.errors, ledger.errors[:5]
    finally:
        primary.sql(f"DROP DATABASE {dbname} WITH (FORCE)")
    answers = a1 - a0
    return answers / (t1 - t0), (c1 - c0) / answers, (w1 - w0) / answers


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a tiny run (smoke test)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 3)")
    args = parser.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 3)
    seconds = 1.0 if args.quick else 4.0
    results: dict[str, list[float]] = {
        k: []
        for k in (
            "raw/s", "raw p50 ms", "own write p50 ms", "put local p50 ms",
            "put forwarded p50 ms", "callers local/s", "callers forwarded/s",
            "callers local CPU us/put", "callers forwarded CPU us/put",
            "callers local loop us/put", "callers forwarded loop us/put",
            "callers local puts/commit", "callers forwarded puts/commit",
            "1 host answers/s", "3 hosts answers/s",
            "1 host commits/answer", "3 hosts commits/answer",
            "1 host WAL B/answer", "3 hosts WAL B/answer",
        )
    }  # fmt: skip
    BENCH_TMP.mkdir(exist_ok=True)
    root = Path(tempfile.mkdtemp(dir=BENCH_TMP, prefix="cluster-"))
    pg_roots = [Path(tempfile.mkdtemp(dir=BENCH_TMP, prefix="pg-")) for _ in range(2)]
    seqs = count(1)
    try:
        with running_pair(*pg_roots) as (primary, standby):
            primary.sql("CREATE DATABASE actors")
            conninfo = multi_host(primary, standby, dbname="actors")
            with cluster(APP, conninfo, root / "actors", 3) as servers:
                local, forwarded, front = drivers(conninfo, servers)
                for driver in (local, forwarded):
                    rpc(front, f"/{driver}/_rpc/one_by_one", {"seconds": 0.5})  # warm
                for _ in range(rounds):
                    rate, p50 = raw(conninfo, seconds, seqs)
                    results["raw/s"].append(rate)
                    results["raw p50 ms"].append(p50)
                    lat = rpc(front, f"/{local}/_rpc/own_writes", {"seconds": seconds})
                    results["own write p50 ms"].append(statistics.median(lat) * 1e3)
                    for driver, where in ((local, "local"), (forwarded, "forwarded")):
                        lat = rpc(front, f"/{driver}/_rpc/one_by_one", {"seconds": seconds})
                        results[f"put {where} p50 ms"].append(statistics.median(lat) * 1e3)
                        asked = {"callers": CALLERS, "seconds": seconds}
                        time.sleep(0.6)  # stats reach pg_stat_database within its flush interval
                        c0, _ = pg_counters(primary, "actors")
                        busy, loop = busy_seconds(), loop_seconds(front.proc.pid)
                        per_s = rpc(front, f"/{driver}/_rpc/callers", asked)
                        busy = busy_seconds() - busy
                        loop = loop_seconds(front.proc.pid) - loop
                        time.sleep(0.6)
                        c1, _ = pg_counters(primary, "actors")
                        results[f"callers {where}/s"].append(per_s)
                        # lease renewals and the rpc's own commits included: a bound
                        results[f"callers {where} puts/commit"].append(
                            per_s * seconds / max(1, c1 - c0)
                        )
                        # the rpc's call and answer are outside the puts' seconds: a bound
                        results[f"callers {where} CPU us/put"].append(
                            busy / (per_s * seconds) * 1e6
                        )
                        results[f"callers {where} loop us/put"].append(
                            loop / (per_s * seconds) * 1e6
                        )
            for r in range(rounds):
                for hosts in (1, 3):
                    rate, commits, wal = mixed(primary, standby, root, hosts, seconds, r)
                    label = "1 host" if hosts == 1 else "3 hosts"
                    results[f"{label} answers/s"].append(rate)
                    results[f"{label} commits/answer"].append(commits)
                    results[f"{label} WAL B/answer"].append(wal)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        for pg_root in pg_roots:
            shutil.rmtree(pg_root, ignore_errors=True)
        with contextlib.suppress(OSError):
            BENCH_TMP.rmdir()
    print(
        f"cluster through actors: {rounds} rounds of {seconds:g} s a side, PostgreSQL with a "
        f"synchronous standby ({os.cpu_count()} cores for everything)"
    )
    for k, v in results.items():
        print(f"  {k:24} {spread(v, 2)}")
    verdict = {True: "met", False: "MISSED"}

    def ratios(top: str, bottom: str) -> list[float]:
        return [t / b for t, b in zip(results[top], results[bottom], strict=True)]

    latency = ratios("own write p50 ms", "raw p50 ms")
    ok = statistics.median(latency) <= 2.0
    target = f"target <= 2x, {verdict[ok]}"
    print(f"an actor's durable write: p50 / raw p50 {spread(latency, 2)}x ({target})")
    for where in ("local", "forwarded"):
        lat = ratios(f"put {where} p50 ms", "raw p50 ms")
        print(f"a durable KV put, shard {where}: p50 / raw p50 {spread(lat, 2)}x")
    for where in ("local", "forwarded"):
        up = ratios(f"callers {where}/s", "raw/s")
        ok = statistics.median(up) >= 5.0
        print(
            f"{CALLERS} callers {'on' if where == 'local' else 'forwarded to'} the shard's host: "
            f"rate / raw rate {spread(up, 2)}x (target >= 5x, {verdict[ok]})"
        )
        cores = os.cpu_count() or 1
        bound = [
            cores * 1e6 / cpu / r
            for cpu, r in zip(results[f"callers {where} CPU us/put"], results["raw/s"], strict=True)
        ]
        print(
            f"  the machine's CPU per put allows at most {spread(bound, 2)}x the raw rate on its "
            f"{cores} cores"
        )
        loop_bound = [
            1e6 / us / r
            for us, r in zip(results[f"callers {where} loop us/put"], results["raw/s"], strict=True)
        ]
        print(
            f"  the shard's host's event loop (one thread) per put allows at most "
            f"{spread(loop_bound, 2)}x"
        )
        cores_busy = [
            rate * cpu / 1e6
            for rate, cpu in zip(
                results[f"callers {where}/s"], results[f"callers {where} CPU us/put"], strict=True
            )
        ]
        print(f"  cores busy on average (rate x CPU per put): {spread(cores_busy, 2)} of {cores}")
    scale = ratios("3 hosts answers/s", "1 host answers/s")
    print(f"mixed load, 3 hosts / 1 host answers/s: {spread(scale, 2)}x (a cost measure here)")


if __name__ == "__main__":
    main()
