"""The host's metrics (``GET /metrics`` on the admin listener): what each counts, read back
through prometheus_client's own parser."""

from __future__ import annotations

import contextlib
import http.client
import json
import shutil
import subprocess
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from prometheus_client.parser import text_string_to_metric_families

import actorkeep as ak
from actorkeep.ops.metrics import HostMetrics
from actorkeep.runtime.stats import LATENCY_BUCKETS, Histogram
from actorkeep.testing import open_host
from tests.test_process import Server, free_port, http_request

app = ak.App()


@app.actor("m")
class Metered(ak.Actor):
    @ak.rpc
    async def ok(self) -> int:
        return 1

    @ak.rpc
    async def boom(self) -> None:
        raise ZeroDivisionError("nope")

    @ak.rpc
    async def nap(self, seconds: float) -> None:
        await trio.sleep(seconds)

    @ak.rpc
    async def wait_for(self, target: str) -> str:
        try:
            await self.actors.ref(target, timeout=1).nap(seconds=5)
        except ak.CallTimeout:
            return "timed out"
        return "answered"

    @ak.rpc
    async def bounce(self, target: str) -> str:
        return str(await self.actors.ref(target).back(origin=self.address))

    @ak.rpc
    async def back(self, origin: str) -> str:
        try:
            await self.actors.ref(origin).ok()
        except ak.ReentryError:
            return "refused"
        return "re-entered"

    @ak.rpc
    async def arm(self) -> None:
        await self.set_alarm(self.now() + 1)

    async def alarm(self, info: ak.AlarmInfo) -> None:
        raise RuntimeError("the alarm fails every time")

    @ak.route("GET", "/")
    async def show(self, req: ak.Request) -> ak.Response:
        return ak.Response.json({})


Found = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(metrics: HostMetrics) -> Found:
    out: Found = {}
    for family in text_string_to_metric_families(metrics.text().decode()):
        for sample in family.samples:
            out[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return out


def value(found: Found, name: str, **labels: str) -> float:
    return found[name, tuple(sorted(labels.items()))]


async def test_the_metrics_count_what_the_host_did(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir=tmp_path) as host:
        metrics = HostMetrics(host.host)

        async def rpc(address: str, method: str, **args: Any) -> Any:
            resp = await host.request("POST", f"/{address}/_rpc/{method}", json=args)
            return resp.status, resp.json()

        for _ in range(3):
            assert await rpc("m/a", "ok") == (200, 1)
        assert (await rpc("m/a", "boom"))[0] == 500
        assert (await host.request("GET", "/m/b/")).status == 200
        assert await rpc("m/b", "wait_for", target="m/d") == (200, "timed out")
        assert await rpc("m/g", "bounce", target="m/h") == (200, "refused")
        assert (await rpc("m/f", "arm"))[0] == 200
        early = samples(metrics)
        await trio.sleep(3600)  # the alarm fails, is retried 6 times, then dropped
        found = samples(metrics)

    def events(kind: str, outcome: str) -> float:
        return value(found, "actorkeep_events_total", kind=kind, outcome=outcome, **{"class": "m"})

    # a: 3 ok, 1 boom; b: wait_for; d: nap (it ran to its end); g: bounce; h: back; f: arm
    assert events("rpc", "ok") == 3 + 1 + 1 + 1 + 1 + 1
    assert events("rpc", "error") == 1
    assert events("request", "ok") == 1
    assert events("alarm", "error") == 7 and events("alarm", "ok") == 0
    assert value(found, "actorkeep_alarms_fired_total") == 7
    assert value(found, "actorkeep_alarms_retried_total") == 6
    assert value(found, "actorkeep_alarms_dropped_total") == 1
    assert value(found, "actorkeep_call_timeouts_total") == 1
    assert value(found, "actorkeep_reentry_refused_total") == 1
    assert value(found, "actorkeep_calls_total") == 3  # b -> d, g -> h, h -> g (refused)
    assert value(early, "actorkeep_actor_opens_total") == 6  # a, b, d, f, g, h
    assert value(early, "actorkeep_actors_active") == 6
    # An hour later all are evicted (idle), f after each of the alarm's retries that opened it
    opens = value(found, "actorkeep_actor_opens_total")
    assert value(found, "actorkeep_actors_active") == 0
    assert value(found, "actorkeep_actor_evictions_total") == opens > 6

    def latency(sample: str, kind: str, **labels: str) -> float:
        return value(
            found, f"actorkeep_event_seconds_{sample}", kind=kind, **labels, **{"class": "m"}
        )

    assert latency("count", "rpc") == 8 + 1
    assert latency("count", "request") == 1 and latency("count", "alarm") == 7
    assert latency("bucket", "rpc", le="+Inf") == 9
    # d's nap took 5 s of virtual time and b's wait 1 s: in the buckets that hold them
    assert latency("bucket", "rpc", le="2.5") == 9 - 1
    assert latency("bucket", "rpc", le="0.5") == 9 - 2


def test_a_histogram_puts_each_duration_in_the_first_bucket_that_holds_it() -> None:
    h = Histogram()
    for seconds in (0.0001, 0.00011, 10.0, 11.0):
        h.observe(seconds)
    assert h.counts[0] == 1 and h.counts[1] == 1  # 0.1 ms is "le 0.0001"
    assert h.counts[len(LATENCY_BUCKETS) - 1] == 1 and h.counts[-1] == 1  # 10 s, then +Inf
    assert h.sum == pytest.approx(21.00021)


def test_a_real_prometheus_scrapes_the_admin_listener(tmp_path: Path) -> None:
    """Debian's Prometheus (installed by make test) scrapes ``/metrics`` of a real ``actorkeep
    serve`` and answers a query with what the host counted."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise RuntimeError("Prometheus is missing: apt-get install prometheus (make test does)")
    data = tmp_path / "data"
    server = Server("tests.apps.process_app:app", data, ("--admin", "127.0.0.1:0"))
    prom_port = free_port()
    try:
        for _ in range(5):
            assert server.rpc("/ledger/a/_rpc/incr", {"by": 1}).status == 200
        admin = json.loads((data / "host" / "admin.json").read_text())["url"]
        target = admin.removeprefix("http://")
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s}\n"
            "scrape_configs:\n"
            f"  - {{job_name: actorkeep, static_configs: [{{targets: ['{target}']}}]}}\n"
        )
        with (tmp_path / "prometheus.log").open("wb") as log:
            prom = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                ],
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
            )
        try:
            query = urllib.parse.quote(
                'actorkeep_events_total{class="ledger",kind="rpc",outcome="ok"}'
            )
            deadline = time.monotonic() + 60
            got: list[Any] = []
            while time.monotonic() < deadline and not got:
                time.sleep(0.5)
                with contextlib.suppress(OSError, http.client.HTTPException, ValueError):
                    reply = http_request(prom_port, "GET", f"/api/v1/query?query={query}")
                    got = reply.json()["data"]["result"]
            assert got, (tmp_path / "prometheus.log").read_text()[-2000:]
            assert got[0]["metric"]["kind"] == "rpc" and float(got[0]["value"][1]) == 5
            # The sync threads time each fsync (the new actor's file was synced before it was
            # registered); the inbox and the refusals are there, at nothing.
            port = int(target.rpartition(":")[2])
            text = http_request(port, "GET", "/metrics").body.decode()
            direct = {
                s.name: s.value
                for family in text_string_to_metric_families(text)
                for s in family.samples
            }
            assert direct["actorkeep_sync_seconds_count"] >= 1
            assert direct["actorkeep_sync_seconds_sum"] > 0
            assert direct["actorkeep_inbox_events"] == 0
            assert (
                direct["actorkeep_inbox_full_total"]
                == direct["actorkeep_inflight_refused_total"]
                == 0
            )
        finally:
            prom.terminate()
            prom.wait(timeout=20)
    finally:
        server.close()
