"""Operations on the ready classes: a queue's counts, dead letters, messages, redrive and
cancel, and KV reads, through the admin API (as the host's operator, past ``allow=``) and on a
stopped data directory; what an operator may not do."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

import actorkeep as ak
import queues
import shards
from actorkeep.ops import inspect
from actorkeep.ops.admin import AdminFront
from actorkeep.ops.inspect import InspectError
from actorkeep.ops.source import SourceError, open_source
from actorkeep.testing import TestHost, open_host

app = ak.App()
# Both answer only the producer: not outside requests, not other classes.
app.mount(
    queues.Queue,
    "queue",
    allow=["producer"],
    configs={"jobs": ak.queue.Config(max_attempts=1, visibility=1.0)},
    recurring={"features": [queues.Recurring("nightly", "0 3 * * *", b"report")]},
)
app.mount(shards.KVShard, "kv", access="internal", allow=["producer"])
jobs = ak.queue.Client("queue/jobs")
store = ak.kv.Client("kv", shards=4)


@app.actor("producer")
class Producer(ak.Actor):
    @ak.rpc
    async def send(
        self,
        bodies: list[str],
        keys: list[str | None] | None = None,
        groups: list[str | None] | None = None,
    ) -> list[int]:
        return await jobs.send_batch([b.encode() for b in bodies], keys=keys, groups=groups)

    @ak.rpc
    async def lease(self, n: int, visibility: float = 1.0, worker: str | None = None) -> list[int]:
        return [x.id for x in await jobs.lease(n, visibility=visibility, worker=worker)]

    @ak.rpc
    async def features(self) -> list[int]:
        """queue/features: a keyed message remembered after its ack, two of a group (one
        leased by w-7), one failed by w-7, one expiring; its one recurring send."""
        q = ak.queue.Client("queue/features")
        keyed = await q.send(b"k", key="order-1", remember=3600.0)
        (lease,) = await q.lease(1, visibility=60.0)
        await q.ack(lease.id, lease.attempt)
        first = await q.send(b"g1", group="user-7")
        second = await q.send(b"g2", group="user-7", max_attempts=9)
        doomed = await q.send(b"x", key="order-2")
        late = await q.send(b"late", expires=3600.0)
        leases = await q.lease(10, visibility=600.0, worker="w-7")
        assert sorted(x.id for x in leases) == [first, doomed, late]
        await q.fail(doomed, 1, "card declined")
        return [keyed, first, second, doomed, late]

    @ak.rpc
    async def put(self, items: dict[str, str]) -> None:
        for key, value in items.items():
            await store.put(key, value.encode())

    @ak.rpc
    async def claim(self, key: str) -> bool:
        self.count_metric("claims", label="asked")
        try:
            await store.compare_and_set(key, ak.kv.ABSENT, b"mine")
        except ak.kv.Conflict:
            return False
        return True


@app.actor("stranger")
class Stranger(ak.Actor):
    @ak.rpc
    async def peek(self) -> int:
        return (await jobs.stats()).ready


async def rpc(host: TestHost, address: str, method: str, **args: Any) -> Any:
    resp = await host.request("POST", f"/{address}/_rpc/{method}", json=args)
    assert resp.status == 200, resp.body
    return resp.json()


class Admin:
    def __init__(self, host: TestHost, data: Path) -> None:
        self.front = AdminFront(host.host, data, None)

    async def ask(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        path, _, query = path.partition("?")
        raw = b"" if body is None else json.dumps(body).encode()
        resp = await self.front.handle(method, path, query, [], raw)
        return resp.status, json.loads(resp.body)

    async def ok(self, method: str, path: str, body: Any = None) -> Any:
        status, answer = await self.ask(method, path, body)
        assert status == 200, answer
        return answer


async def fill(host: TestHost) -> list[int]:
    """Five messages: two leased and let run out on their last attempt (dead letters), one
    leased and held, two ready."""
    ids = await rpc(host, "producer/p", "send", bodies=["a", "b", "c", "d", "e"])
    assert await rpc(host, "producer/p", "lease", n=2) == ids[:2]
    await trio.sleep(1.5)
    assert await rpc(host, "producer/p", "lease", n=1) == ids[2:3]
    await rpc(host, "producer/p", "put", items={"user/1": "ann", "user/2": "bob", "team/1": "x"})
    return list(ids)


async def test_queue_operations_run_as_the_operator(tmp_path: Path) -> None:
    async with open_host(app, data_dir=tmp_path) as host:
        ids = await fill(host)
        admin = Admin(host, tmp_path)
        # The queue refuses other callers; the operator passes.
        assert (await host.request("POST", "/stranger/s/_rpc/peek", json={})).status == 500
        stats = await admin.ok("GET", "/api/queues/queue/jobs")
        assert (stats["ready"], stats["leased"], stats["dead"]) == (2, 1, 2)
        assert stats["oldest_ready_age"] is not None
        listed = await admin.ok("GET", "/api/queues")
        assert [q["queue"] for q in listed["queues"]] == ["queue/jobs"]
        dead = await admin.ok("GET", "/api/queues/queue/jobs/dead?limit=1")
        assert [d["id"] for d in dead["items"]] == ids[:1] and dead["next"] == ids[0]
        assert dead["items"][0]["body"] == {"text": "a"} and dead["items"][0]["reason"]
        rest = await admin.ok("GET", f"/api/queues/queue/jobs/dead?after={ids[0]}")
        assert [d["id"] for d in rest["items"]] == ids[1:2] and rest["next"] is None
        got = await admin.ok("GET", f"/api/queues/queue/jobs/messages/{ids[2]}")
        assert got["message"]["state"] == "leased" and got["message"]["body"] == {"text": "c"}
        assert (await admin.ok("GET", f"/api/queues/queue/jobs/messages/{ids[0]}"))["message"][
            "state"
        ] == "dead"
        redriven = await admin.ok("POST", "/api/queues/queue/jobs/redrive", {"ids": [ids[0]]})
        assert redriven["redriven"] == 1
        cancelled = await admin.ok("POST", "/api/queues/queue/jobs/cancel", {"id": ids[3]})
        assert cancelled["cancelled"]
        after = await admin.ok("GET", "/api/queues/queue/jobs")
        assert (after["ready"], after["leased"], after["dead"]) == (2, 1, 1)
        assert await rpc(host, "producer/p", "lease", n=5) == [
            ids[4],
            ids[4] + 1,
        ]  # redriven: a new id
        everything = await admin.ok("POST", "/api/queues/queue/jobs/redrive", {"ids": None})
        assert everything["redriven"] == 1


async def test_bad_operator_requests_are_refused_and_create_nothing(tmp_path: Path) -> None:
    async with open_host(app, data_dir=tmp_path) as host:
        await fill(host)
        admin = Admin(host, tmp_path)
        before = sorted(p.name for p in (tmp_path / "actors").rglob("*.sqlite"))
        for method, path, body, status in [
            ("GET", "/api/queues/queue/nope", None, 404),  # would create a queue
            ("GET", "/api/queues/producer/p", None, 404),  # not a queue class
            ("GET", "/api/queues/queue/jobs/messages/0", None, 400),
            ("GET", "/api/queues/queue/jobs/messages/x", None, 400),
            ("GET", "/api/queues/queue/jobs/messages/999", None, 404),
            ("POST", "/api/queues/queue/jobs/redrive", None, 400),  # all must be asked for
            ("POST", "/api/queues/queue/jobs/redrive", {"ids": "all"}, 400),
            ("POST", "/api/queues/queue/jobs/redrive", {"ids": [-1]}, 400),
            ("POST", "/api/queues/queue/jobs/cancel", {"id": "1"}, 400),
            ("GET", "/api/queues/queue/jobs/redrive", None, 405),
            ("GET", "/api/queues/queue/jobs/dead?limit=x", None, 400),
            ("GET", "/api/kv/producer?prefix=u", None, 404),
            ("GET", "/api/kv/kv?shards=0", None, 400),
            ("GET", "/api/kv/kv/entry?key=" + "k" * 3000, None, 400),
            ("POST", "/api/kv/kv", None, 405),
        ]:
            found, answer = await admin.ask(method, path, body)
            assert found == status, (path, answer)
        after = sorted(p.name for p in (tmp_path / "actors").rglob("*.sqlite"))
        assert after == before


async def test_kv_reads_merge_the_shards(tmp_path: Path) -> None:
    async with open_host(app, data_dir=tmp_path) as host:
        await fill(host)
        admin = Admin(host, tmp_path)
        page = await admin.ok("GET", "/api/kv/kv?shards=4&limit=2")
        assert [e["key"]["text"] for e in page["entries"]] == ["team/1", "user/1"]
        assert page["next"] == "user/1"
        rest = await admin.ok("GET", "/api/kv/kv?shards=4&after=user/1")
        assert [e["key"]["text"] for e in rest["entries"]] == ["user/2"] and rest["next"] is None
        users = await admin.ok("GET", "/api/kv/kv?shards=4&prefix=user/")
        assert [(e["key"]["text"], e["value"]["text"]) for e in users["entries"]] == [
            ("user/1", "ann"),
            ("user/2", "bob"),
        ]
        got = await admin.ok("GET", "/api/kv/kv/entry?shards=4&key=user/2")
        assert got["entry"]["value"] == {"text": "bob"} and got["entry"]["version"] >= 1
        none = await admin.ok("GET", "/api/kv/kv/entry?shards=4&key=user/9")
        assert none["entry"] is None
        # With a shard count other than the app's, the keys are looked for on other shards.
        wrong = await admin.ok("GET", "/api/kv/kv?shards=16")
        assert len(wrong["entries"]) <= 3
    # Stopped: the same answers from the files.
    with open_source(tmp_path, None, None) as source:
        assert source.kv_list("kv", 4, "", None, 2) == page
        assert source.kv_list("kv", 4, "", "user/1", 100) == rest
        assert source.kv_get("kv", 4, "user/2") == got
        assert source.kv_get("kv", 4, "user/9") == none


async def test_a_stopped_queue_reads_the_same_and_refuses_writes(tmp_path: Path) -> None:
    async with open_host(app, data_dir=tmp_path) as host:
        ids = await fill(host)
        admin = Admin(host, tmp_path)
        stats = await admin.ok("GET", "/api/queues/queue/jobs")
        dead = await admin.ok("GET", "/api/queues/queue/jobs/dead")
        got = await admin.ok("GET", f"/api/queues/queue/jobs/messages/{ids[1]}")
        ready_one = await admin.ok("GET", f"/api/queues/queue/jobs/messages/{ids[4]}")
    with open_source(tmp_path, None, None) as source:
        offline = source.queue_stats("queue/jobs")
        assert {k: offline[k] for k in ("ready", "leased", "dead")} == {
            k: stats[k] for k in ("ready", "leased", "dead")
        }
        assert source.queue_dead("queue/jobs", None, 100) == dead
        assert source.queue_get("queue/jobs", ids[1]) == got
        assert source.queue_get("queue/jobs", ids[4])["message"]["state"] == "ready"
        assert ready_one["message"]["state"] == "ready"
        with pytest.raises(SourceError, match="own events"):
            source.queue_redrive("queue/jobs", None)
        with pytest.raises(SourceError, match="own events"):
            source.queue_cancel("queue/jobs", ids[4])
        with pytest.raises(InspectError, match="not a queue"):
            source.queue_stats("producer/p")
        with pytest.raises(InspectError, match="no queue"):
            source.queue_stats("queue/nope")


async def test_keys_groups_workers_and_schedules_show_online_and_offline(tmp_path: Path) -> None:
    async with open_host(app, data_dir=tmp_path) as host:
        keyed, first, second, doomed, late = await rpc(host, "producer/p", "features")
        admin = Admin(host, tmp_path)
        path = "/api/queues/queue/features"
        assert (await admin.ask("GET", f"{path}/messages/{keyed}"))[0] == 404  # acked
        stats = await admin.ok("GET", path)
        # keys: order-1 remembered; groups: user-7; the recurring send
        assert (stats["keys"], stats["groups"], stats["schedules"]) == (1, 1, 1)
        assert (stats["ready"], stats["delayed"], stats["leased"], stats["dead"]) == (0, 1, 2, 1)
        held = (await admin.ok("GET", f"{path}/messages/{first}"))["message"]
        assert (held["state"], held["group"], held["worker"]) == ("leased", "user-7", "w-7")
        waiting = (await admin.ok("GET", f"{path}/messages/{second}"))["message"]
        assert (waiting["state"], waiting["max_attempts"]) == ("delayed", 9)  # behind its head
        expiring = (await admin.ok("GET", f"{path}/messages/{late}"))["message"]
        assert expiring["expires_at"] is not None and expiring["max_attempts"] == 5
        dead = await admin.ok("GET", f"{path}/dead")
        (letter,) = dead["items"]
        assert (letter["id"], letter["key"], letter["worker"]) == (doomed, "order-2", "w-7")
        online = {i: await admin.ok("GET", f"{path}/messages/{i}") for i in (first, second, doomed)}
    with open_source(tmp_path, None, None) as source:
        assert source.queue_stats("queue/features") == stats | {"oldest_ready_age": None}
        assert source.queue_dead("queue/features", None, 100) == dead
        for i, answer in online.items():
            offline = source.queue_get("queue/features", i)
            if i == first:  # the mount's max_attempts is not in the file: only the message's own
                assert offline["message"].pop("max_attempts") is None
                answer["message"].pop("max_attempts")
            assert offline == answer
    # the command line says it in words
    from tests.test_ops import cli

    shown = cli("queue", "stats", "queue/features", "--data", str(tmp_path))
    assert "keys: 1   groups: 1   recurring sends: 1" in shown.stdout
    letters = cli("queue", "dead", "queue/features", "--data", str(tmp_path))
    assert "WORKER" in letters.stdout and "w-7" in letters.stdout
    message = cli("queue", "get", "queue/features", str(second), "--data", str(tmp_path))
    assert "user-7" in message.stdout and "max_attempts 9" in " ".join(message.stdout.split())


async def test_a_stopped_queue_of_the_first_version_reads_offline(tmp_path: Path) -> None:
    """A queue file no host has upgraded yet (no keys, groups or workers) reads as it is."""
    import sqlite3

    async with open_host(app, data_dir=tmp_path):
        pass  # a data directory
    path = inspect.database_path(tmp_path / "actors", "queue/old")
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path)
    conn.executescript(
        """CREATE TABLE actorkeep_queue (id INTEGER PRIMARY KEY AUTOINCREMENT, body BLOB NOT NULL,
        enqueued_at REAL NOT NULL, visible_at REAL NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
        last_error TEXT, priority INTEGER NOT NULL DEFAULT 0, leased INTEGER NOT NULL DEFAULT 0);
        CREATE TABLE actorkeep_queue_dead (id INTEGER PRIMARY KEY, body BLOB NOT NULL,
        enqueued_at REAL NOT NULL, attempts INTEGER NOT NULL, failed_at REAL NOT NULL,
        reason TEXT NOT NULL, priority INTEGER NOT NULL DEFAULT 0);
        INSERT INTO actorkeep_queue (body, enqueued_at, visible_at) VALUES (x'6f6c64', 0, 0);
        INSERT INTO actorkeep_queue_dead VALUES (7, x'64', 0, 5, 1, 'max attempts exceeded', 0);"""
    )
    conn.commit()
    conn.close()
    with open_source(tmp_path, None, None) as source:
        stats = source.queue_stats("queue/old")
        assert (stats["ready"], stats["dead"], stats["keys"], stats["groups"]) == (1, 1, 0, 0)
        message = source.queue_get("queue/old", 1)["message"]
        assert (message["state"], message["key"], message["worker"]) == ("ready", None, None)
        (letter,) = source.queue_dead("queue/old", None, 10)["items"]
        assert (letter["id"], letter["group"], letter["worker"]) == (7, None, None)


def test_no_app_may_mount_the_operators_class() -> None:
    with pytest.raises(ValueError, match="operator"):
        ak.App().mount(queues.Queue, "actorkeep")


def test_the_queue_and_kv_commands(tmp_path: Path) -> None:
    """``actorkeep queue ...`` and ``actorkeep kv ...`` against a served app, then on its
    stopped directory."""
    import signal
    import time

    from tests.test_ops import cli, cli_json
    from tests.test_process import Server

    data = tmp_path / "data"
    server = Server("tests.test_ops_ready:app", data, ("--admin", "127.0.0.1:0"))
    try:

        def call(method: str, **args: Any) -> Any:
            resp = server.rpc(f"/producer/p/_rpc/{method}", args)
            assert resp.status == 200
            return json.loads(resp.body)

        ids = call("send", bodies=["a", "b", "c"])
        call("lease", n=1)
        time.sleep(1.2)  # the lease runs out on its one attempt
        call("put", items={"user/1": "ann", "user/2": "bob"})
        stats = cli_json("queue", "stats", "queue/jobs", "--data", str(data))
        assert (stats["ready"], stats["dead"]) == (2, 1)
        human = cli("queue", "dead", "queue/jobs", "--data", str(data))
        assert human.returncode == 0 and "max attempts exceeded" in human.stdout
        got = cli_json("queue", "get", "queue/jobs", str(ids[1]), "--data", str(data))
        assert got["message"]["state"] == "ready"
        refused = cli("queue", "redrive", "queue/jobs", "--data", str(data))
        assert refused.returncode == 1 and "--all" in refused.stderr
        redrove = cli("queue", "redrive", "queue/jobs", "--all", "--data", str(data))
        assert redrove.returncode == 0 and "redrove 1 dead letters" in redrove.stdout
        cancelled = cli("queue", "cancel", "queue/jobs", str(ids[2]), "--data", str(data))
        assert cancelled.returncode == 0 and "cancelled" in cancelled.stdout
        keys = cli("kv", "list", "kv", "--shards", "4", "--data", str(data))
        assert keys.returncode == 0 and "user/1" in keys.stdout and "bob" in keys.stdout
        entry = cli_json("kv", "get", "kv", "user/2", "--shards", "4", "--data", str(data))
        assert entry["entry"]["value"] == {"text": "bob"}
        assert server.stop(signal.SIGTERM) == 0
    finally:
        server.close()
    offline = cli_json("queue", "stats", "queue/jobs", "--data", str(data))
    assert (offline["ready"], offline["dead"]) == (2, 0)  # b, and a redriven; c cancelled
    no = cli("queue", "redrive", "queue/jobs", "--all", "--data", str(data))
    assert no.returncode == 1 and "give --app MODULE:APP" in no.stderr
    assert cli_json("kv", "get", "kv", "user/2", "--shards", "4", "--data", str(data)) == entry
    # With the app, the writes run on the stopped directory as the queue's own events.
    with_app = ("--app", "tests.test_ops_ready:app", "--data", str(data))
    gone = cli_json("queue", "cancel", "queue/jobs", str(ids[1]), *with_app)
    assert gone == {"queue": "queue/jobs", "id": ids[1], "cancelled": True}
    after = cli_json("queue", "stats", "queue/jobs", "--data", str(data))
    assert (after["ready"], after["dead"]) == (1, 0)
    nowhere = cli("queue", "cancel", "queue/nowhere", "1", *with_app)
    assert nowhere.returncode == 1 and "no queue queue/nowhere" in nowhere.stderr
    assert "Traceback" not in nowhere.stderr
    assert not inspect.database_path(data / "actors", "queue/nowhere").exists()


async def test_the_metrics_count_queues_and_kv(tmp_path: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    async with open_host(app, data_dir=tmp_path) as host:
        ids = await fill(host)
        admin = Admin(host, tmp_path)
        assert (await admin.ok("POST", "/api/queues/queue/jobs/cancel", {"id": ids[4]}))[
            "cancelled"
        ]
        await admin.ok("POST", "/api/queues/queue/jobs/redrive", {"ids": [ids[0]]})
        assert await rpc(host, "producer/p", "claim", key="user/1") is False
        assert await rpc(host, "producer/p", "claim", key="user/7") is True
        status, _ = await Admin(host, tmp_path).ask("GET", "/api/queues")
        resp = await Admin(host, tmp_path).front.handle("GET", "/metrics", "", [], b"")
    assert resp.status == 200 and status == 200
    found = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(resp.body.decode())
        for s in family.samples
    }

    def value(name: str, **labels: str) -> float:
        return found[name, tuple(sorted(labels.items()))]

    q = {"queue": "queue/jobs"}
    assert value("actorkeep_queue_messages", state="ready", **q) == 2  # d, and a redriven
    assert value("actorkeep_queue_messages", state="leased", **q) == 1
    assert value("actorkeep_queue_messages", state="dead", **q) == 1
    assert value("actorkeep_queue_messages", state="delayed", **q) == 0
    assert value("actorkeep_queue_oldest_ready_seconds", **q) > 0
    assert value("actorkeep_queue_sent_total", **q) == 5
    assert value("actorkeep_queue_deliveries_total", **q) == 3
    assert value("actorkeep_queue_dead_letters_total", **q) == 2
    assert value("actorkeep_queue_cancelled_total", **q) == 1
    assert value("actorkeep_queue_redriven_total", **q) == 1
    kv = {"class": "kv"}
    assert value("actorkeep_kv_ops_total", op="put", **kv) == 3
    assert value("actorkeep_kv_ops_total", op="cas", **kv) == 2
    assert value("actorkeep_kv_conflicts_total", op="cas", **kv) == 1
    assert (
        value(
            "actorkeep_actor_counter_total",
            counter="claims",
            label="asked",
            **{"class": "producer"},
        )
        == 2
    )


def test_counters_are_checked_and_bounded() -> None:
    from actorkeep.runtime.stats import MAX_COUNTED, HostStats

    stats = HostStats()
    for i in range(MAX_COUNTED + 5):
        stats.count("c", "n", str(i), 1)
    stats.count("c", "n", "0", 2)  # a kept label still counts
    assert len(stats.counted) == MAX_COUNTED and stats.counted_dropped == 5
    assert stats.counted["c", "n", "0"] == 3
    actor = Producer()
    for bad in ("", "Upper", "1x", "x" * 64, "with space"):
        with pytest.raises(ValueError, match="counter name"):
            actor.count_metric(bad)
    with pytest.raises(ValueError, match="label"):
        actor.count_metric("ok", label="x" * 201)
    with pytest.raises(ValueError, match="only grows"):
        actor.count_metric("ok", -1)
