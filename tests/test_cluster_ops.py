"""Operations on a cluster: through any host's admin API, the commands and pages show the hosts,
who holds each partition with its epoch, where an actor lives, and every actor with durable
state in the cluster; each host's metrics say what it holds."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.test_cluster_process import TTL, cluster_args, first_answer
from tests.test_ops import admin_url, cli, cli_json
from tests.test_process import COUNTER_APP, http_request, serve

pytestmark = pytest.mark.slow

COUNTERS = 12


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
        # An actor is shown by the host that holds it; the other says which host that is.
        for i in range(COUNTERS):
            address = f"counter/c{i}"
            answers = [cli("show", address, "--admin", url, "--json") for url in urls]
            ok = [n for n, done in enumerate(answers) if done.returncode == 0]
            assert len(ok) == 1, [d.stderr for d in answers]
            where = json.loads(answers[ok[0]].stdout)["cluster"]
            assert where["here"] and where["owner"] == views[ok[0]]["host_id"]
            assert views[0]["leases"][where["partition"]]["owner"] == where["owner"]
            other = answers[1 - ok[0]].stderr
            assert f"held by {where['owner']}" in other and "ask that host's admin API" in other
        # rm: refused by the host that does not hold it, saying which does; done by the owner,
        # for the whole cluster (its state in PostgreSQL and its working copy).
        where = json.loads(cli("show", "counter/c0", "--admin", urls[0], "--json").stdout or "{}")
        owner = 0 if where.get("cluster", {}).get("here") else 1
        refused = cli("rm", "counter/c0", "--admin", urls[1 - owner])
        assert refused.returncode == 1 and "ask that host's admin API" in refused.stderr
        gone = cli_json("rm", "counter/c0", "--admin", urls[owner])
        assert gone["deleted"] == "counter/c0" and gone["bytes"] > 0
        for url in urls:
            left = cli_json("ls", "--prefix", "counter/c0", "--admin", url)
            assert left["actors"] == []
        status, value = first_answer([a, b], "/counter/c0/_rpc/incr_durable", 10, {"by": 1})
        assert (status, value) == (200, 1)  # a new counter: the old one's 1 is gone
        status, value = first_answer([a, b], "/counter/c1/_rpc/incr_durable", 10, {"by": 1})
        assert (status, value) == (200, 2)  # the others are untouched
        # Each host's metrics say how many partitions it holds.
        held = []
        for url in urls:
            port = int(url.rpartition(":")[2])
            text = http_request(port, "GET", "/metrics").body.decode()
            for family in text_string_to_metric_families(text):
                if family.name == "actorkeep_cluster_partitions_held":
                    held.append(family.samples[0].value)
            page_html = http_request(port, "GET", "/cluster").body.decode()
            assert all(h in page_html for h in (views[0]["host_id"], views[1]["host_id"]))
        assert sum(held) == 16 and len(held) == 2
