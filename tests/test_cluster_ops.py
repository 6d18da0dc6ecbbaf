"""Operations on a cluster: through any host's admin API, the commands and pages show the hosts,
who holds each partition with its epoch, where an actor lives, and every actor with durable
state in the cluster; each host's metrics say what it holds."""

from __future__ import annotations

import concurrent.futures
import re
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from actorkeep.cluster.partitions import partition_of
from tests.test_cluster_process import TTL, cluster_args, first_answer
from tests.test_ops import admin_url, cli, cli_json
from tests.test_process import COUNTER_APP, http_request, serve

pytestmark = pytest.mark.slow

COUNTERS = 12
FORWARD = {"x-actorkeep-forwarded": "1"}


def host_of(server_log: str) -> str:
    found = re.search(r"internal='?([^\s']+)", server_log)
    assert found is not None
    return found.group(1)


def test_any_host_shows_the_cluster(pg_conninfo: str, tmp_path: Path) -> None:
    args = (*cluster_args(pg_conninfo), "--admin", "127.0.0.1:0")
    with (
        serve(COUNTER_APP, tmp_path / "a", *args) as a,
        serve(COUNTER_APP, tmp_path / "b", *args) as b,
    ):
        time.sleep(TTL * 2)  # both alive: the partitions are shared out
        for i in range(COUNTERS):
            status, _ = first_answer([a, b], f"/counter/c{i}/_rpc/incr_durable", 10, {"by": 1})
            assert status == 200
        urls = [admin_url(tmp_path / "a"), admin_url(tmp_path / "b")]
        ports = [int(u.rpartition(":")[2]) for u in urls]
        views = [cli_json("cluster", "--admin", url) for url in urls]
        internal = {host_of(x.wait_for_line("actorkeep serving")) for x in (a, b)}
        for view in views:
            assert {h["address"] for h in view["hosts"]} == internal
            assert sum(h["partitions"] for h in view["hosts"]) == 16 and view["unowned"] == 0
            assert [x["partition"] for x in view["leases"]] == list(range(16))
            assert all(x["epoch"] >= 1 for x in view["leases"])
        assert [sum(h["this"] for h in v["hosts"]) for v in views] == [1, 1]
        # Every actor of the cluster, from either host, wherever it is served.
        everyone = [f"counter/c{i}" for i in range(COUNTERS)]
        for url in urls:
            listed = cli_json("ls", "counter", "--admin", url)
            assert [x["address"] for x in listed["actors"]] == sorted(everyone)
            page = cli_json("ls", "--prefix", "counter/c1", "--limit", "2", "--admin", url)
            assert [x["address"] for x in page["actors"]] == ["counter/c1", "counter/c10"]
            assert page["next"] == "counter/c10"
        # Any host shows any actor and runs a query on it: the host that holds it reads its
        # copy, another asks that host's admin API (the address each announced).
        assert all(h["admin"] in urls for h in views[0]["hosts"])
        for i in range(4):
            address = f"counter/c{i}"
            answers = [cli_json("show", address, "--admin", url) for url in urls]
            here = [x["cluster"]["here"] for x in answers]
            assert sorted(here) == [False, True]
            owner = answers[here.index(True)]["cluster"]["owner"]
            assert [x["cluster"]["owner"] for x in answers] == [owner, owner]
            assert views[0]["leases"][answers[0]["cluster"]["partition"]]["owner"] == owner
            assert answers[0]["tables"] == answers[1]["tables"]
            rows = [cli_json("sql", address, "SELECT n FROM c", "--admin", u) for u in urls]
            assert [r["rows"] for r in rows] == [[[1]], [[1]]]
        # Two hosts passing requests on to each other at once: neither waits for the other.
        owner_of = {
            f"counter/c{i}": views[0]["leases"][partition_of(f"counter/c{i}", 16)]["owner"]
            for i in range(COUNTERS)
        }
        crossed = [  # for each host, an actor the other holds
            next(a for a, o in owner_of.items() if o != views[k]["host_id"]) for k in (0, 1)
        ]
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            started = time.monotonic()
            shows = list(pool.map(lambda i: cli("show", crossed[i], "--admin", urls[i]), (0, 1)))
        assert [x.returncode for x in shows] == [0, 0] and time.monotonic() - started < 10
        # A request passed on by another host is not passed on again: the owner answers.
        again = http_request(ports[0], "GET", f"/api/actors/{crossed[0]}", headers=FORWARD)
        assert again.status == 404 and b"ask that host's admin API" in again.body
        # rm through either host: the owner deletes all the cluster holds of the actor (its
        # state in PostgreSQL and its working copy); the other passes it on.
        gone = cli_json("rm", "counter/c0", "--admin", urls[0])
        assert gone["deleted"] == "counter/c0" and gone["bytes"] > 0
        for url in urls:
            left = cli_json("ls", "--prefix", "counter/c0", "--admin", url)
            assert left["actors"] == []
        gone = cli_json("rm", "counter/c1", "--admin", urls[1])
        assert gone["deleted"] == "counter/c1"
        missing = cli("rm", "counter/c1", "--admin", urls[0])
        assert missing.returncode == 1 and "no actor counter/c1" in missing.stderr
        status, value = first_answer([a, b], "/counter/c0/_rpc/incr_durable", 10, {"by": 1})
        assert (status, value) == (200, 1)  # a new counter: the old one's 1 is gone
        status, value = first_answer([a, b], "/counter/c2/_rpc/incr_durable", 10, {"by": 1})
        assert (status, value) == (200, 2)  # the others are untouched
        # A backup through any host is the whole cluster, as PostgreSQL holds it.
        copy = tmp_path / "backup"
        made = cli_json("backup", str(copy), "--admin", urls[1])
        assert (made["actors"], made["failed"]) == (COUNTERS - 1, [])  # c1 is gone
        # Each host's metrics say how many partitions it holds.
        held = []
        for url in urls:
            port = int(url.rpartition(":")[2])
            text = http_request(port, "GET", "/metrics").body.decode()
            for family in text_string_to_metric_families(text):
                if family.name == "actorkeep_cluster_partitions_held":
                    held.append(family.samples[0].value)
            assert cli_json("alarms", "--admin", url)["alarms"] == []  # from PostgreSQL's index
            assert http_request(port, "GET", "/alarms").status == 200
            actor_page = http_request(port, "GET", "/actors/counter/c2")  # held here or not
            assert actor_page.status == 200 and b"actorkeep_actor" in actor_page.body
            page_html = http_request(port, "GET", "/cluster").body.decode()
            assert all(h in page_html for h in (views[0]["host_id"], views[1]["host_id"]))
        assert sum(held) == 16 and len(held) == 2
    # On a stopped cluster host's directory the commands write nothing: the actors are in
    # PostgreSQL, the files there are working copies.
    refused = cli("rm", "counter/c2", "--data", str(tmp_path / "a"))
    assert refused.returncode == 1 and "cluster host's working copies" in refused.stderr
    with serve(COUNTER_APP, copy) as restored:  # served by one host
        assert [restored.count(f"counter/c{i}") for i in (0, 2, 3)] == [1, 2, 1]


def test_the_cluster_s_alarms_are_listed_soonest_first_a_page_at_a_time(
    pg_conninfo: str,
) -> None:
    import psycopg

    from actorkeep.cluster.store import create
    from actorkeep.cluster.store_view import StoreView

    create(pg_conninfo, 4)
    entries = [("b/1", 5.0), ("a/2", 5.0), ("a/10", 5.0), ("c/x", 1.0), ("d/late", 99.0)]
    with psycopg.connect(pg_conninfo, autocommit=True) as conn:
        for address, at in entries:
            conn.execute("INSERT INTO actorkeep_alarms VALUES (%s, 0, %s)", (address, at))
    view = StoreView(pg_conninfo, "me", 4)
    assert view.alarms(float("inf"), None, 10) == [
        ("c/x", 1.0),
        ("a/10", 5.0),
        ("a/2", 5.0),
        ("b/1", 5.0),
        ("d/late", 99.0),
    ]  # fmt: skip  (same times in byte order of the address, as on one host)
    first = view.alarms(50.0, None, 2)
    assert first == [("c/x", 1.0), ("a/10", 5.0)]
    rest = view.alarms(50.0, (first[-1][1], first[-1][0]), 10)
    assert rest == [("a/2", 5.0), ("b/1", 5.0)]  # due by 50: not d/late
    view.announce("http://10.0.0.9:8081")
    view.announce("http://10.0.0.9:8082")  # a restart on another port replaces it
    with psycopg.connect(pg_conninfo, autocommit=True) as conn:
        rows = conn.execute("SELECT host_id, url FROM actorkeep_admin").fetchall()
    assert rows == [("me", "http://10.0.0.9:8082")]


@pytest.mark.parametrize(
    ("bound", "advertise", "recorded"),
    [
        ("http://0.0.0.0:8081", "10.0.0.5:7001", ["http://10.0.0.5:8081"]),
        ("http://[::]:8081", "[fd00::5]:7001", ["http://[fd00::5]:8081"]),
        ("http://10.0.0.5:8081", "10.0.0.5:7001", ["http://10.0.0.5:8081"]),
        ("http://127.0.0.1:8081", "127.0.0.1:7001", ["http://127.0.0.1:8081"]),
        ("http://127.0.0.1:8081", "10.0.0.5:7001", []),  # the other machines cannot reach it
    ],
)
def test_a_host_records_an_admin_url_the_others_can_reach(
    bound: str, advertise: str, recorded: list[str]
) -> None:
    import trio

    from actorkeep.ops.cluster_view import ClusterView

    class Store:
        host_id, partitions = "h", 4
        urls: list[str] = []

        def announce(self, url: str) -> None:
            self.urls.append(url)

    store = Store()
    store.urls = []
    trio.run(ClusterView(store, lambda: 0, advertise).announce, bound)  # type: ignore[arg-type]
    assert store.urls == recorded
