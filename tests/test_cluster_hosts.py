"""Three ``actorkeep serve --cluster`` processes over one real PostgreSQL, serving
``tests/apps/cluster_app.py``: every host answers for every actor (it forwards what it does not
own to the owner, one hop), and the contract holds for calls between actors on different hosts:
the caller the host vouches for, re-entry refused at once, access rules, KV CAS and versions,
push delivery from a queue to a consumer on another host, alarms."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest

from actorkeep.cluster.partitions import partition_of
from tests.test_process import Server, serve

pytestmark = pytest.mark.slow

APP = "tests.apps.cluster_app:app"
PARTITIONS = 16
TTL, MARGIN = 1.5, 0.5


def cluster_args(conninfo: str) -> tuple[str, ...]:
    return (
        "--cluster", conninfo, "--partitions", str(PARTITIONS),
        "--lease-ttl", str(TTL), "--lease-margin", str(MARGIN),
    )  # fmt: skip


def owners(conninfo: str) -> dict[int, str]:
    """``{partition: internal address of its owner}`` as PostgreSQL has it now."""
    import psycopg

    with psycopg.connect(conninfo) as conn:
        rows = conn.execute(
            "SELECT l.partition, h.address FROM actorkeep_leases l "
            "JOIN actorkeep_hosts h ON h.host_id = l.owner WHERE l.expires_at > clock_timestamp()"
        ).fetchall()
    return {int(p): str(a) for p, a in rows}


def internal_address(server: Server) -> str:
    line = server.wait_for_line("actorkeep serving")
    found = re.search(r"internal='?([^\s']+)", line)
    assert found, line
    return found.group(1)


class Cluster:
    def __init__(self, conninfo: str, servers: list[Server]) -> None:
        self.conninfo = conninfo
        self.servers = servers
        self.internal = [internal_address(s) for s in servers]

    def settle(self, deadline: float = 20.0) -> dict[int, str]:
        """Wait until every partition has an owner, each host holds its share, and nothing
        moved for two lease ticks; the owners."""
        end = time.monotonic() + deadline
        last: dict[int, str] = {}
        since = time.monotonic()
        while time.monotonic() < end:
            now = owners(self.conninfo)
            if now != last:
                last, since = now, time.monotonic()
            elif (
                len(now) == PARTITIONS
                and set(now.values()) == set(self.internal)
                and time.monotonic() - since > 2 * TTL / 3
            ):
                return now
            time.sleep(0.05)
        raise AssertionError(f"the partitions did not settle: {last}")

    def host_of(self, address: str) -> int:
        """Which server owns ``address`` now."""
        return self.internal.index(self.settle()[partition_of(address, PARTITIONS)])

    def name_on(self, class_name: str, host: int, avoid: tuple[str, ...] = ()) -> str:
        """A name of ``class_name`` whose actor ``host`` owns."""
        table = self.settle()
        for i in range(1000):
            name = f"n{i}"
            address = f"{class_name}/{name}"
            if (
                address not in avoid
                and table[partition_of(address, PARTITIONS)] == (self.internal[host])
            ):
                return name
        raise AssertionError(f"no {class_name} name on host {host}")

    def rpc(self, via: int, address: str, method: str, **args: Any) -> Any:
        reply = self.servers[via].rpc(f"/{address}/_rpc/{method}", args)
        assert reply.status == 200, (address, method, reply.status, reply.body)
        return reply.json()


@pytest.fixture(scope="module")
def cluster(pg_module_conninfo: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("cluster")
    args = cluster_args(pg_module_conninfo)
    with ExitStack() as stack:
        servers = [stack.enter_context(serve(APP, root / f"h{i}", *args)) for i in range(3)]
        c = Cluster(pg_module_conninfo, servers)
        c.settle()
        yield c


def test_every_host_answers_for_every_actor(cluster: Cluster) -> None:
    names = [f"c{i}" for i in range(12)]
    on = {cluster.host_of(f"counter/{n}") for n in names}
    assert on == {0, 1, 2}, on  # the counters are spread over the three hosts
    for round_ in range(1, 4):
        for i, n in enumerate(names):
            assert cluster.rpc((i + round_) % 3, f"counter/{n}", "incr_durable", by=1) == round_
    for via in range(3):
        for n in names:
            reply = cluster.servers[via].get(f"/counter/{n}/")
            assert (reply.status, reply.json()) == (200, {"name": n, "n": 3}), (via, n)


def test_the_caller_is_vouched_for_across_hosts(cluster: Cluster) -> None:
    relay = cluster.name_on("relay", 0)
    echo = cluster.name_on("echo", 1)
    vault = cluster.name_on("vault", 2)
    for via in range(3):
        got = cluster.rpc(via, f"relay/{relay}", "ask", target=f"echo/{echo}")
        assert got == {
            "status": 200,
            "body": {
                "caller": f"relay/{relay}",
                "reserved": ["x-actorkeep-caller"],
                "x-other": None,
            },
        }
        got = cluster.rpc(via, f"relay/{relay}", "ask", target=f"vault/{vault}")
        assert got["status"] == 200 and got["body"]["caller"] == f"relay/{relay}"
        # From outside: the forged header is stripped at the front, and vault is internal.
        forged = {"X-Actorkeep-Caller": f"relay/{relay}"}
        reply = cluster.servers[via].get(f"/echo/{echo}/whoami", forged)
        assert (reply.status, reply.json()["caller"]) == (200, None)
        reply = cluster.servers[via].get(f"/vault/{vault}/whoami", forged)
        assert reply.status == 403, reply


def test_reentry_across_hosts_is_refused_at_once(cluster: Cluster) -> None:
    a = cluster.name_on("ping", 0)
    b = cluster.name_on("ping", 1, avoid=(f"ping/{a}",))
    start = time.monotonic()
    got = cluster.rpc(2, f"ping/{a}", "bounce", target=f"ping/{b}")
    took = time.monotonic() - start
    assert got["refused"] == 508, got
    assert f"ping/{a}" in got["message"]
    assert took < 1.0, took  # at once, not after a timeout


def test_kv_cas_and_versions_across_hosts(cluster: Cluster) -> None:
    users = [cluster.name_on("kvuser", h) for h in range(3)]
    shards = {cluster.host_of(f"kv/{i}") for i in range(4)}
    print("the four shards are on hosts", shards)
    keys = [f"key-{i}" for i in range(8)]
    versions = {}
    for i, key in enumerate(keys):
        user = f"kvuser/{users[i % 3]}"
        first = cluster.rpc(i % 3, user, "put", key=key, value="a")["version"]
        second = cluster.rpc(i % 3, user, "put", key=key, value="b", version=first)["version"]
        assert second > first  # a shard's versions grow, never reused
        assert cluster.rpc(i % 3, user, "put", key=key, value="c", version=first) == {
            "conflict": second
        }
        versions[key] = second
    for i, key in enumerate(keys):
        other = f"kvuser/{users[(i + 1) % 3]}"
        got = cluster.rpc((i + 2) % 3, other, "get", key=key)
        assert got == {"value": "b", "version": versions[key]}


def test_push_delivery_to_a_consumer_on_another_host(cluster: Cluster) -> None:
    producer = f"producer/{cluster.name_on('producer', 0)}"
    queue = f"queue/{cluster.name_on('queue', 1)}"
    worker = f"worker/{cluster.name_on('worker', 2)}"
    cluster.rpc(1, producer, "start", queue=queue, consumer=worker)
    tags = [f"t{i}" for i in range(30)]
    for i in range(0, 30, 5):
        ids = cluster.rpc(i % 3, producer, "send", queue=queue, tags=tags[i : i + 5])
        assert len(ids) == 5
    end = time.monotonic() + 20
    while (got := cluster.rpc(0, worker, "handled")) != tags:
        assert time.monotonic() < end, got
        time.sleep(0.1)


def test_queue_leases_across_hosts(cluster: Cluster) -> None:
    """Pull consumers on two hosts lease from a queue on the third: each message to one of
    them, a stale ack refused, an unacknowledged lease given again (attempt 2) once it
    expires."""
    producer = f"producer/{cluster.name_on('producer', 0)}"
    queue = f"queue/{cluster.name_on('queue', 1, avoid=('queue/' + cluster.name_on('queue', 1),))}"
    pullers = [f"puller/{cluster.name_on('puller', h)}" for h in (0, 2)]
    ids = cluster.rpc(1, producer, "send", queue=queue, tags=["a", "b", "c", "d"])
    first = cluster.rpc(2, pullers[0], "lease", queue=queue, max=2, visibility=30.0)
    second = cluster.rpc(0, pullers[1], "lease", queue=queue, max=2, visibility=1.0)
    assert sorted(m[0] for m in first + second) == ids and all(m[1] == 1 for m in first)
    for m in first:
        assert cluster.rpc(1, pullers[0], "ack", queue=queue, id=m[0], attempt=m[1]) is True
        assert cluster.rpc(2, pullers[1], "ack", queue=queue, id=m[0], attempt=m[1]) is False
    time.sleep(1.2)  # the second puller's leases expire: given again
    again = cluster.rpc(1, pullers[0], "lease", queue=queue, max=10, visibility=30.0)
    assert sorted((m[0], m[1]) for m in again) == sorted((m[0], 2) for m in second)
    stale = second[0]
    assert cluster.rpc(0, pullers[1], "ack", queue=queue, id=stale[0], attempt=1) is False


def test_alarms_fire_on_a_cluster_host(cluster: Cluster) -> None:
    name = cluster.name_on("alarmer", 1)
    armed = cluster.rpc(0, f"alarmer/{name}", "arm", delay=0.3)
    end = time.monotonic() + 10
    while not (shown := cluster.servers[2].get(f"/alarmer/{name}/").json())["fired"]:
        assert time.monotonic() < end, shown
        time.sleep(0.05)
    assert shown["fired"][0]["scheduled_at"] == armed["at"]
