"""The example apps work as their docstrings and the README say."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from actorkeep.testing import open_host
from examples.counter.app import app as counter_app
from examples.jobs.app import app as jobs_app


async def test_counter(data_dir: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with open_host(counter_app, data_dir) as host:
        for expected in (2, 4):
            resp = await host.request("POST", "/counter/a/_rpc/incr", json={"by": 2})
            assert resp.json() == expected
        assert (await host.request("POST", "/counter/a/_rpc/incr_durable", json={})).json() == 5
        await host.restart()
        assert (await host.request("GET", "/counter/a/")).json() == {"name": "a", "n": 5}


async def test_jobs(data_dir: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with open_host(jobs_app, data_dir) as host:
        # An event before the endpoint is set waits (RetryLater) instead of failing.
        resp = await host.request(
            "POST", "/api/main/events", json={"type": "signup", "user": "ada"}
        )
        assert (resp.status, resp.json()) == (202, {"job": 1})
        await trio.sleep(5)
        assert (await host.request("GET", "/deliverer/main/deliveries")).json() == []
        resp = await host.request("PUT", "/api/main/settings/endpoint", body=b"https://e.test/h")
        assert resp.status == 200
        assert (await host.request("GET", "/api/main/settings/endpoint")).json()["value"] == (
            "https://e.test/h"
        )
        await trio.sleep(40)
        (delivery,) = (await host.request("GET", "/deliverer/main/deliveries")).json()
        assert delivery["job"] == 1 and delivery["endpoint"] == "https://e.test/h"
        assert delivery["body"] == {"type": "signup", "user": "ada"}
        # A job whose delivery keeps failing is retried with backoff, then dead-lettered.
        await host.request("POST", "/api/main/events", json={"type": "x", "fail": True})
        # The pull worker counts the words of report jobs.
        await host.request("POST", "/api/main/reports", body=b"one two three")
        await trio.sleep(600)
        stats = (await host.request("GET", "/api/main/stats")).json()
        assert stats["webhooks"]["dead"] == 1 and stats["webhooks"]["ready"] == 0
        assert stats["reports"] == {"ready": 0, "delayed": 0, "leased": 0, "dead": 0}
        assert (await host.request("GET", "/worker/main/results")).json() == [
            {"job": 1, "words": 3}
        ]
        # Deliveries, the KV and the queues refuse outside requests.
        for path in (
            "/deliverer/main/actorkeep-queue/v1/deliver",
            "/kv/shard-0/actorkeep-kv/v2/get",
            "/queue/webhooks/actorkeep-queue/v1/stats",
        ):
            assert (await host.request("POST", path)).status == 403
        # Everything survives a restart; the worker's alarm keeps polling.
        await host.restart()
        await host.request("POST", "/api/main/reports", body=b"four five")
        await trio.sleep(5)
        results = (await host.request("GET", "/worker/main/results")).json()
        assert results == [{"job": 1, "words": 3}, {"job": 2, "words": 2}]


async def test_jobs_answers_client_mistakes_with_400(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(jobs_app, data_dir, debug=False) as host:
        long_name = "n" * 2100  # the KV key "settings/<name>" is over 2 KiB
        cases = [
            ("PUT", f"/api/main/settings/{long_name}", b"v", "limit is 2048"),
            ("GET", f"/api/main/settings/{long_name}", b"", "limit is 2048"),
            ("PUT", "/api/main/settings/endpoint", b"\xff\xfe", "UTF-8"),
            ("POST", "/api/main/events", b"{not json", "Expecting"),
            ("POST", "/api/main/events", b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
            # Valid JSON under 1 MiB that is over 1 MiB once encoded for the queue.
            ("POST", "/api/main/events", '["{}"]'.format("é" * 250_000).encode(), "1048576"),
        ]
        for method, path, body, message in cases:
            resp = await host.request(method, path, body=body)
            assert resp.status == 400, (path[:40], resp.json())
            assert message in resp.json()["message"], resp.json()
        resp = await host.request("PUT", "/api/main/settings/endpoint", body=b"https://e.test/h")
        assert resp.json() == {"name": "endpoint", "version": 1}
