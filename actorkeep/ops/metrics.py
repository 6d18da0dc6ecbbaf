"""The host's metrics in Prometheus's text format (``GET /metrics`` on the admin listener).

A collector reads the host's own counters (``runtime/stats.py``) when Prometheus scrapes, so
the hot path bumps plain numbers and never a metric object. Labels are bounded: by actor class
and event kind, never by actor (docs/operations.md lists every metric).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from ..front.server import HttpServer
from ..runtime.host import Host
from ..runtime.stats import LATENCY_BUCKETS, Histogram
from ..runtime.storage import FileStorage

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class HostCollector(Collector):
    """Every metric of ``host``, and of the app's HTTP server once it is known (``server``)."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.server: HttpServer | None = None

    def collect(self) -> Iterator[Metric]:
        host = self.host
        stats = host.stats
        events = CounterMetricFamily(
            "actorkeep_events",
            "Events run, by actor class, kind (request, rpc, alarm) and outcome (ok, error).",
            labels=["class", "kind", "outcome"],
        )
        latency = HistogramMetricFamily(
            "actorkeep_event_seconds",
            "From an event's start on its actor to its reply, by actor class and kind.",
            labels=["class", "kind"],
        )
        for class_name, of_class in sorted(stats.classes.items()):
            for kind, times in of_class.latency.items():
                failed = of_class.failed[kind]
                events.add_metric([class_name, kind, "ok"], max(times.count - failed, 0))
                events.add_metric([class_name, kind, "error"], failed)
                latency.add_metric([class_name, kind], _buckets(times), times.sum)
        yield events
        yield latency
        activations = list(host.activations)
        yield _gauge("actorkeep_actors_active", "Actors in memory.", len(activations))
        yield _gauge(
            "actorkeep_inbox_events",
            "Events waiting in the inboxes of the actors in memory.",
            sum(len(act.inbox) for act in activations),
        )
        yield _gauge(
            "actorkeep_actors_quarantined",
            "Actors that take no events because their storage is damaged.",
            len(host.quarantined),
        )
        yield _counter(
            "actorkeep_inbox_full",
            "Events refused (503 Overloaded) because their actor's inbox was full.",
            stats.inbox_full,
        )
        yield _counter(
            "actorkeep_inflight_refused",
            "Requests refused (503) because the host's in-flight byte budget was spent.",
            host.inflight.refused,
        )
        yield _counter("actorkeep_actor_opens", "Actors' databases opened.", stats.opens)
        yield _counter("actorkeep_actor_evictions", "Actors taken out of memory.", stats.evictions)
        yield _counter("actorkeep_alarms_fired", "Alarm handlers run.", stats.alarms_fired)
        yield _counter(
            "actorkeep_alarms_retried",
            "Failed alarm handlers set to run again.",
            stats.alarms_retried,
        )
        yield _counter(
            "actorkeep_alarms_dropped",
            "Alarms given up after their last retry.",
            stats.alarms_dropped,
        )
        yield _counter("actorkeep_calls", "Calls between actors.", stats.calls)
        yield _counter(
            "actorkeep_call_timeouts", "Calls whose caller stopped waiting.", stats.call_timeouts
        )
        yield _counter(
            "actorkeep_reentry_refused",
            "Calls refused because their target already waits in the call chain.",
            stats.reentry_refused,
        )
        if isinstance(host.storage, FileStorage) and host.storage.syncer is not None:
            syncs = host.storage.syncer.syncs()
            family = HistogramMetricFamily(
                "actorkeep_sync_seconds",
                "How long each database sync (an fsync of its write-ahead log) took.",
            )
            family.add_metric([], _buckets(syncs), syncs.sum)
            yield family
        server = self.server
        if server is not None:
            yield _gauge(
                "actorkeep_http_connections", "Open client connections.", server.connections
            )
            yield _counter(
                "actorkeep_http_connections_shed",
                "Waiting connections closed to make room for others.",
                server.shed,
            )
            yield _counter(
                "actorkeep_http_connections_refused",
                "New connections refused (503) at the connection cap.",
                server.refused,
            )


def _buckets(times: Histogram) -> Sequence[tuple[str, float]]:
    bounds = [*(repr(b) for b in LATENCY_BUCKETS), "+Inf"]
    out, total = [], 0
    for bound, n in zip(bounds, times.counts, strict=True):
        total += n
        out.append((bound, float(total)))
    return out


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def _counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, value=value)


class HostMetrics:
    """A registry of one host's collector; ``text()`` is what ``/metrics`` answers."""

    def __init__(self, host: Host) -> None:
        self.collector = HostCollector(host)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)

    def text(self) -> bytes:
        return generate_latest(self.registry)
