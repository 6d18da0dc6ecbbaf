"""Failover in the cluster (decision 0016): two ``actorkeep serve --cluster`` processes over a
real PostgreSQL started for the run, with the default lease settings. Each round kills one host
with kill -9, at once after it answered a durable increment of a counter it owns (by
PostgreSQL's lease table), and times how long until the other host answers that counter (its
first successful event there: the other host forwards to the owner, and waits for one), with
the acknowledged count. The killed host is then started again (a new incarnation) before the
next round. Target (the cluster issue): median under 5 s over 20 kills.

    python bench/cluster_failover.py [--quick] [--kills N]
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _HERE:
    sys.path[0] = os.path.dirname(_HERE)  # bench/queue.py would shadow the stdlib's queue

import argparse
import contextlib
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from actorkeep.cluster.keeper import LeaseSettings
from actorkeep.cluster.partitions import partition_of
from bench.cluster_crash import host_id, owners
from bench.driver import spread
from tests.pg import running_server
from tests.test_process import COUNTER_APP, Server

BENCH_TMP = Path(__file__).resolve().parent.parent / ".bench-tmp"
COUNTERS = 32


def served_by(conninfo: str, server: Server, counters: int) -> list[int]:
    """The counters ``server`` owns now (as PostgreSQL has the leases)."""
    me, table = host_id(conninfo, server), owners(conninfo)
    return [i for i in range(counters) if table.get(partition_of(f"counter/c{i}", 64)) == me]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a tiny run (smoke test)")
    parser.add_argument("--kills", type=int, default=None, help="kills (default 20)")
    args = parser.parse_args(argv)
    kills = args.kills or (2 if args.quick else 20)
    settle = LeaseSettings().ttl + 1.0  # both alive and each with its share
    BENCH_TMP.mkdir(exist_ok=True)
    root = Path(tempfile.mkdtemp(dir=BENCH_TMP, prefix="failover-"))
    pg_root = Path(tempfile.mkdtemp(dir=BENCH_TMP, prefix="pg-"))  # the server's user owns it
    times: list[float] = []
    try:
        with running_server(pg_root) as pg:
            cluster = ("--cluster", pg.conninfo, "--partitions", "64")
            hosts = [Server(COUNTER_APP, root / f"h{k}", cluster) for k in (0, 1)]
            try:
                time.sleep(settle)
                for kill in range(kills):
                    victim, other = hosts[kill % 2], hosts[1 - kill % 2]
                    # A restarted host gets its share within about three ticks of the
                    # leases; a slow machine may need a little longer than ``settle``.
                    deadline = time.monotonic() + 15
                    while not (mine := served_by(pg.conninfo, victim, COUNTERS)):
                        assert time.monotonic() < deadline, "the victim serves no counter"
                        time.sleep(0.2)
                    path = f"/counter/c{mine[0]}"
                    reply = victim.rpc(f"{path}/_rpc/incr_durable", {"by": 1})
                    assert reply.status == 200, reply
                    acked = reply.json()
                    victim.kill()
                    start = time.monotonic()
                    # The other host forwards to the owner, and waits for one while there is
                    # none (503 after a while): its first 200 is the new owner's first event.
                    while (reply := other.get(f"{path}/", timeout=30)).status == 503:
                        assert time.monotonic() - start < 30, "no failover within 30 s"
                        time.sleep(0.01)
                    took = time.monotonic() - start
                    assert reply.status == 200 and reply.json()["n"] == acked, reply
                    times.append(took)
                    print(f"  kill {kill + 1}: {took:.2f} s", flush=True)
                    hosts[kill % 2] = Server(COUNTER_APP, victim.data, cluster)
                    time.sleep(settle)
            finally:
                for host in hosts:
                    host.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(pg_root, ignore_errors=True)
        with contextlib.suppress(OSError):
            BENCH_TMP.rmdir()
    med = statistics.median(times)
    print(
        f"failover, kill -9 to the other host's first answer, {kills} kills "
        f"(lease {LeaseSettings().ttl:g} s, margin {LeaseSettings().margin:g} s): "
        f"{spread(times, 2)} s (target median < 5 s, {'met' if med < 5 else 'MISSED'})"
    )


if __name__ == "__main__":
    main()
