"""A cluster host cut off from PostgreSQL but not from its clients, with a real network
partition: the host runs in a network namespace of its own, with one veth link to PostgreSQL and
another to the clients and the other hosts; the test takes the first link down.

While cut off the host answers only with what the owners give it: for its own partitions it
stops on its clock (503) and the other hosts take them over; for the others' it forwards. After
the link is back it rejoins. Every answer it gives is the acknowledged count, never one from
before the cut, and nothing acknowledged is lost."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from actorkeep.cluster.partitions import partition_of
from bench.cluster_crash import shared_out
from tests.pg import Server as PgServer
from tests.pg import pg_bin
from tests.test_process import COUNTER_APP, Server

pytestmark = pytest.mark.slow

TTL, MARGIN = 1.5, 0.5
PARTITIONS = 16
COUNTERS = 24
PG_NET, HOST_NET = "10.77.1", "10.77.2"  # the link to PostgreSQL; to the clients and hosts


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


@pytest.fixture
def netns() -> Iterator[str]:
    """A network namespace with two veth links to this one (``.1`` here, ``.2`` there)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 for a network namespace")
    tag = uuid.uuid4().hex[:6]
    ns = f"ak{tag}"
    sh("ip", "netns", "add", ns)
    try:
        for net, link in ((PG_NET, f"akp{tag}"), (HOST_NET, f"akh{tag}")):
            sh("ip", "link", "add", f"{link}a", "type", "veth", "peer", "name", f"{link}b")
            sh("ip", "link", "set", f"{link}b", "netns", ns)
            sh("ip", "addr", "add", f"{net}.1/24", "dev", f"{link}a")
            sh("ip", "link", "set", f"{link}a", "up")
            sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{net}.2/24", "dev", f"{link}b")
            sh("ip", "netns", "exec", ns, "ip", "link", "set", f"{link}b", "up")
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        yield tag
    finally:
        for link in (f"akp{tag}a", f"akh{tag}a"):
            subprocess.run(["ip", "link", "del", link], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@pytest.fixture
def tcp_postgres() -> Iterator[PgServer]:
    """A PostgreSQL server on the Unix socket and on ``PG_NET.1`` (started after the link)."""
    bindir = pg_bin()
    assert bindir is not None
    root = Path(tempfile.mkdtemp(prefix="actorkeep-pg-"))
    server = PgServer(root, bindir, listen=f"{PG_NET}.1")
    try:
        server.start()
        server.sql("CREATE DATABASE cut")
        yield server
    finally:
        server.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)


def owners(pg: PgServer) -> dict[int, str]:
    rows = pg.sql(
        "SELECT l.partition, h.address FROM actorkeep_leases l "
        "JOIN actorkeep_hosts h ON h.host_id = l.owner WHERE l.expires_at > clock_timestamp()",
        dbname="cut",
    )
    return {int(p): str(a) for p, a in rows}


def test_a_host_cut_off_from_postgres_serves_nothing_stale(
    netns: str, tcp_postgres: PgServer, tmp_path: Path
) -> None:
    pg = tcp_postgres
    lease = (
        "--partitions", str(PARTITIONS), "--lease-ttl", str(TTL), "--lease-margin", str(MARGIN),
    )  # fmt: skip
    here = ("--cluster", pg.conninfo.replace("dbname=postgres", "dbname=cut"), *lease)
    cut_off_conninfo = f"host={PG_NET}.1 port={pg.port} user=postgres dbname=cut"
    hosts = [
        Server(COUNTER_APP, tmp_path / f"h{i}", (*here, "--internal", f"{HOST_NET}.1:0"))
        for i in range(2)
    ]
    cut = Server(
        COUNTER_APP,
        tmp_path / "cut",
        ("--cluster", cut_off_conninfo, *lease, "--internal", f"{HOST_NET}.2:0"),
        address=f"{HOST_NET}.2",
        prefix=("ip", "netns", "exec", f"ak{netns}"),
    )
    everyone = [*hosts, cut]
    try:
        end = time.monotonic() + 20
        while not shared_out(table := owners(pg), 3, PARTITIONS):  # no handover left to run
            assert time.monotonic() < end, table
            time.sleep(0.05)
        cut_address = next(a for a in table.values() if a.startswith(f"{HOST_NET}.2:"))
        names = [f"c{i}" for i in range(COUNTERS)]
        its_own = {
            n for n in names if table[partition_of(f"counter/{n}", PARTITIONS)] == cut_address
        }
        assert its_own and its_own != set(names), its_own
        acked = {}
        for i, n in enumerate(names):  # through every host, the cut-off one too (it forwards)
            reply = everyone[i % 3].rpc(f"/counter/{n}/_rpc/incr_durable", {"by": 1})
            assert reply.status == 200, reply
            acked[n] = reply.json()
        for n in names:  # and read back in memory on the owners
            assert cut.get(f"/counter/{n}/").json()["n"] == acked[n]

        sh("ip", "link", "set", f"akp{netns}a", "down")  # the cut
        cut_at = time.monotonic()
        forwarded, refused, wrong = 0, 0, []
        moved: set[str] = set()
        sample = iter(sorted(its_own) * 1000)
        while time.monotonic() - cut_at < 4 * TTL:
            for n in its_own - moved:  # taken over by another host, and written there
                reply = hosts[0].rpc(f"/counter/{n}/_rpc/incr_durable", {"by": 1})
                if reply.status == 200:
                    acked[n] = reply.json()
                    moved.add(n)
            # Reads through the cut-off host: every other host's counters, and one of its own
            # a round (for those it tries a while to find an owner before it answers 503: it
            # cannot read who owns them now).
            for n in [*(n for n in names if n not in its_own), next(sample)]:
                reply = cut.get(f"/counter/{n}/", timeout=15)
                if reply.status == 200:
                    if reply.json()["n"] != acked[n]:
                        wrong.append((n, reply.json()["n"], acked[n]))
                    if n not in its_own:
                        forwarded += 1
                else:
                    assert reply.status == 503, reply
                    refused += 1
            time.sleep(0.05)
        assert wrong == [], wrong  # never a count from before the cut
        assert moved == its_own  # every partition it held was taken over and written
        assert forwarded > 0  # cut off from PostgreSQL, not from the clients: it forwards
        print(f"cut off: {forwarded} answers forwarded, {refused} refused (503)")

        sh("ip", "link", "set", f"akp{netns}a", "up")  # healed: it rejoins
        end = time.monotonic() + 30
        while len(set(owners(pg).values())) < 3:
            assert time.monotonic() < end, "the cut-off host did not rejoin"
            time.sleep(0.1)
        for n in names:
            for server in everyone:
                reply = server.get(f"/counter/{n}/", timeout=15)
                assert (reply.status, reply.json()["n"]) == (200, acked[n]), (n, server.address)
    finally:
        for server in everyone:
            server.close()
