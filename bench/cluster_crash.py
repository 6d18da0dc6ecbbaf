"""The crash suite on a cluster: three ``actorkeep serve --cluster`` hosts over one PostgreSQL,
the jobs example under mixed load, one host killed with SIGKILL at a random moment per cycle.

The app is the crash suite's, with a deliverer whose records are durable (a plain write dies
with its host in a cluster, as with power loss on one host). Each cycle drives the load of
``bench/crash.py`` (durable KV puts, compare-and-set counters,
webhook sends pushed to the deliverer) through one surviving host, which forwards what it does
not own; kills another host while requests are in flight; waits until the load has been
answered again for what the killed host owned (its partitions taken over); then starts the
killed host again on its old data directory (stale working copies that must not be trusted).
After the last cycle, sending nothing, it waits until the webhook queue is empty (the queue's
alarm, now on whichever host owns it, must deliver), then reads every actor the checks look at
as PostgreSQL holds it and runs the crash suite's checks: every acknowledged write is there or
superseded, no version names two values, no counter lost or gained an increment, every
acknowledged send delivered or dead-lettered exactly once. A 500 or 503 answer during a
failover counts as an unanswered request (the call may have applied).

    python bench/cluster_crash.py [--quick] [--cycles 10] [--seed N]

It starts its own PostgreSQL under a temporary directory (tests/pg.py).
``tests/test_cluster_failover.py`` runs ``run()`` with one cycle.
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _HERE:
    sys.path[0] = os.path.dirname(_HERE)

import argparse
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from actorkeep.address import actor_path
from actorkeep.cluster import ClusterStore
from actorkeep.cluster.replica import restore
from bench.crash import (
    LOAD_TIMEOUT,
    SHARDS,
    Inconsistent,
    Ledger,
    Load,
    Snapshot,
    _request,
    check_all,
    read_snapshot,
)
from tests.test_process import Server

APP = "tests.apps.crash_app:cluster_app"
TTL, MARGIN = 1.5, 0.5
PARTITIONS = 64
HOSTS = 3
KILL_AFTER = (0.2, 1.5)
TAKEOVER_ACKS = 30  # answers after the kill, some of them for the killed host's actors
DRAIN_TIMEOUT = 60.0
#: The actors the checks read (bench/crash.py's ``read_snapshot``).
CHECKED = [*(("kv", f"shard-{i}") for i in range(SHARDS)), ("queue", "webhooks"),
           ("deliverer", "main")]  # fmt: skip

Log = Callable[[str], None]


def cluster_args(conninfo: str) -> tuple[str, ...]:
    return (
        "--cluster", conninfo, "--partitions", str(PARTITIONS),
        "--lease-ttl", str(TTL), "--lease-margin", str(MARGIN),
    )  # fmt: skip


def owners(conninfo: str) -> dict[int, str]:
    """``{partition: owner}`` of the leases not expired by PostgreSQL's clock."""
    import psycopg

    with psycopg.connect(conninfo) as conn:
        rows = conn.execute(
            "SELECT partition, owner FROM actorkeep_leases "
            "WHERE owner IS NOT NULL AND expires_at > clock_timestamp()"
        ).fetchall()
    return {int(p): str(o) for p, o in rows}


def host_id(conninfo: str, server: Server) -> str:
    """The cluster's name for ``server``'s host (found by the internal address it logged)."""
    import re

    import psycopg

    line = server.wait_for_line("actorkeep serving")
    found = re.search(r"internal='?([^\s']+)", line)
    assert found, line
    with psycopg.connect(conninfo) as conn:
        row = conn.execute(
            "SELECT host_id FROM actorkeep_hosts WHERE address = %s", (found.group(1),)
        ).fetchone()
    assert row is not None, found.group(1)
    return str(row[0])


def shared_out(now: dict[int, str], hosts: int, partitions: int = PARTITIONS) -> bool:
    """Whether every partition has an owner and ``hosts`` hosts hold their shares (none above
    it: no more partitions to hand over while a load runs)."""
    held: dict[str, int] = {}
    for owner in now.values():
        held[owner] = held.get(owner, 0) + 1
    share = -(-partitions // hosts)
    return len(now) == partitions and len(held) == hosts and max(held.values()) <= share


def wait_settled(conninfo: str, hosts: int, deadline: float = 30.0) -> None:
    """Until every partition has an owner and ``hosts`` hosts hold their shares."""
    end = time.monotonic() + deadline
    while True:
        now = owners(conninfo)
        if shared_out(now, hosts):
            return
        if time.monotonic() > end:
            raise Inconsistent("start", [f"partitions not shared out: {len(now)} owned"])
        time.sleep(0.05)


def snapshot(conninfo: str, into: Path) -> Snapshot:
    """The checked actors as PostgreSQL holds them, written out as files and read."""
    shutil.rmtree(into, ignore_errors=True)
    store = ClusterStore(conninfo, "checker", clock=time.monotonic)
    try:
        for class_name, name in CHECKED:
            image = restore(store, f"{class_name}/{name}")
            if image:
                path = actor_path(into / "actors", class_name, name)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(image)
    finally:
        store.close()
    return read_snapshot(into)


@dataclass
class Report:
    seed: int
    cycles: int = 0
    acks: int = 0
    unanswered: int = 0
    taken_s: list[float] = field(default_factory=list)  # kill to its partitions all taken
    takeover_s: list[float] = field(default_factory=list)  # then TAKEOVER_ACKS answers
    drain_s: float = 0.0

    def summary(self) -> str:
        taken = ", ".join(f"{t:.2f}" for t in self.taken_s)
        took = ", ".join(f"{t:.2f}" for t in self.takeover_s)
        return (
            f"seed {self.seed}: {self.cycles} kill -9 cycles on {HOSTS} hosts; verified "
            f"{self.acks} acknowledged writes in PostgreSQL; {self.unanswered} requests cut off "
            f"or answered 500/503; the killed host's partitions all taken over in [{taken}] s, "
            f"{TAKEOVER_ACKS} answers more in [{took}] s; queue drained in {self.drain_s:.2f} s "
            "after the load stopped"
        )


def run(conninfo: str, root: Path, cycles: int, seed: int, log: Log = print) -> Report:
    """``cycles`` kills of one of three hosts under load; ``Inconsistent`` at a problem."""
    rng = random.Random(seed)
    ledger = Ledger()
    report = Report(seed)
    args = cluster_args(conninfo)
    servers = [Server(APP, root / f"h{i}", args) for i in range(HOSTS)]
    try:
        wait_settled(conninfo, HOSTS)
        key, endpoint = b"settings/endpoint", b"https://hooks.example/crash"
        ledger.put_tried[key] = {endpoint}
        reply = _request(servers[0], "PUT", "/api/main/settings/endpoint", raw=endpoint)
        ledger.put_acked[key] = {endpoint: reply["version"]}
        for cycle in range(cycles):
            victim = rng.randrange(HOSTS)
            front = servers[(victim + 1) % HOSTS]
            with Load(front.port, ledger, rng, cycle, unknown_ok=True) as load:
                if not load.enough.wait(LOAD_TIMEOUT):
                    few = f"only {load.answered} answers in {LOAD_TIMEOUT} s"
                    raise Inconsistent(f"cycle {cycle}", [few, *ledger.errors])
                victim_id = host_id(conninfo, servers[victim])
                time.sleep(rng.uniform(*KILL_AFTER))
                servers[victim].kill()
                killed_at = time.monotonic()
                while victim_id in owners(conninfo).values() or len(owners(conninfo)) < PARTITIONS:
                    if time.monotonic() - killed_at > LOAD_TIMEOUT:
                        raise Inconsistent(f"cycle {cycle}", ["its partitions were not taken"])
                    time.sleep(0.02)
                taken_at, before = time.monotonic(), load.answered
                report.taken_s.append(taken_at - killed_at)
                while load.answered < before + TAKEOVER_ACKS:
                    if time.monotonic() - taken_at > LOAD_TIMEOUT:
                        raise Inconsistent(f"cycle {cycle}", ["no answers after the takeover"])
                    time.sleep(0.01)
                report.takeover_s.append(time.monotonic() - taken_at)
            if ledger.errors:
                raise Inconsistent(f"cycle {cycle}", ledger.errors)
            servers[victim].close()
            servers[victim] = Server(APP, root / f"h{victim}", args)
            report.cycles += 1
            log(
                f"cycle {cycle + 1}/{cycles}: killed host {victim}; its partitions taken "
                f"{report.taken_s[-1]:.2f} s after; {ledger.acks} acknowledged so far"
            )
        started = time.monotonic()
        while (snap := snapshot(conninfo, root / "check")).queued:
            if time.monotonic() - started > DRAIN_TIMEOUT:
                left = sorted(snap.queued)[:10]
                raise Inconsistent("drain", [f"{len(snap.queued)} still queued: {left}"])
            time.sleep(0.25)
        report.drain_s = time.monotonic() - started
        problems = check_all(ledger, snap, settled=True)
        if problems:
            raise Inconsistent("after the queue drained", problems)
    finally:
        for server in servers:
            server.close()
    report.acks = ledger.acks
    report.unanswered = ledger.unanswered
    return report


def main() -> None:
    from tests.conftest import fresh_database
    from tests.pg import running_server

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=10, help="kill -9 cycles (default 10)")
    parser.add_argument("--quick", action="store_true", help="one cycle (smoke test)")
    parser.add_argument("--seed", type=int, default=None, help="default: a random one")
    args = parser.parse_args()
    if args.quick:
        args.cycles = 1
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    print(f"cluster crash suite: seed {seed}, {args.cycles} cycles", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="actorkeep-cluster-crash-"))
    pg_root = Path(tempfile.mkdtemp(prefix="actorkeep-pg-"))  # its own: PostgreSQL's user owns it
    try:
        with running_server(pg_root) as pg, fresh_database(pg) as conninfo:
            report = run(conninfo, tmp, args.cycles, seed, lambda s: print(s, flush=True))
    except Inconsistent as exc:
        print(f"FAILED (seed {seed}, kept in {tmp}): {exc}", flush=True)
        raise SystemExit(1) from None
    finally:
        shutil.rmtree(pg_root, ignore_errors=True)
    shutil.rmtree(tmp, ignore_errors=True)
    print(report.summary())


if __name__ == "__main__":
    main()
