"""The host's metrics in Prometheus's text format (``GET /metrics`` on the admin listener).

A collector reads the host's own counters (``runtime/stats.py``) when Prometheus scrapes, so
the hot path bumps plain numbers and never a metric object. Labels are bounded: by actor class
and event kind, never by actor (docs/operations.md lists every metric).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

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
        #: The queues' counts as last asked (``Ready.queues()``), before each scrape.
        self.queues: list[dict[str, Any]] = []
        #: In a cluster: how many partitions this host serves now.
        self.cluster_held: Callable[[], int] | None = None

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
        yield from _counted(stats.counted)
        yield _counter(
            "actorkeep_counters_dropped",
            "Counts of actors' counters dropped: the host keeps 10,000 label sets at most.",
            stats.counted_dropped,
        )
        yield from _queue_gauges(self.queues)
        if self.cluster_held is not None:
            yield _gauge(
                "actorkeep_cluster_partitions_held",
                "Partitions this host holds the lease of and serves.",
                self.cluster_held(),
            )
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


_QUEUE_COUNTERS = {
    "queue.sent": "Messages sent, by queue.",
    "queue.deliveries": "Messages leased, by a worker or for push delivery, by queue.",
    "queue.acked": "Messages acknowledged, by queue.",
    "queue.retries": "Messages set to be delivered again after a failure, by queue.",
    "queue.dead_letters": "Messages moved to the dead letters, by queue.",
    "queue.redriven": "Dead letters sent back to their queue, by queue.",
    "queue.cancelled": "Waiting messages cancelled, by queue.",
    "queue.delivery_failures": "Push deliveries that failed (each retries its batch), by queue.",
}
_KV_COUNTERS = {
    "kv.ops": "KV operations by shard class and kind (get, list, put, cas, delete).",
    "kv.conflicts": "KV writes refused because their expectation failed, by class and kind.",
}


def _counted(counted: dict[tuple[str, str, str], int]) -> Iterator[Metric]:
    """The counters of ``Actor.count_metric``: the queues' and KV shards' under names of their
    own, the rest as ``actorkeep_actor_counter``."""
    families: dict[str, CounterMetricFamily] = {}
    for name, doc in _QUEUE_COUNTERS.items():
        metric = "actorkeep_" + name.replace(".", "_")
        families[name] = CounterMetricFamily(metric, doc, labels=["queue"])
    for name, doc in _KV_COUNTERS.items():
        metric = "actorkeep_" + name.replace(".", "_")
        families[name] = CounterMetricFamily(metric, doc, labels=["class", "op"])
    other = CounterMetricFamily(
        "actorkeep_actor_counter",
        "Counters actors count (self.count_metric), by class, counter and label.",
        labels=["class", "counter", "label"],
    )
    for (class_name, counter, label), n in sorted(counted.items()):
        family = families.get(counter)
        if family is None:
            other.add_metric([class_name, counter, label], n)
        elif counter in _QUEUE_COUNTERS:
            family.add_metric([label], n)
        else:
            family.add_metric([class_name, label], n)
    yield from families.values()
    yield other


def _queue_gauges(queues: list[dict[str, Any]]) -> Iterator[Metric]:
    messages = GaugeMetricFamily(
        "actorkeep_queue_messages",
        "Messages by queue and state (ready, delayed, leased, dead), asked at the scrape.",
        labels=["queue", "state"],
    )
    oldest = GaugeMetricFamily(
        "actorkeep_queue_oldest_ready_seconds",
        "Seconds since the oldest ready message of each queue was sent (0: none ready).",
        labels=["queue"],
    )
    for q in queues:
        if "error" in q:
            continue
        for state in ("ready", "delayed", "leased", "dead"):
            messages.add_metric([q["queue"], state], q[state])
        oldest.add_metric([q["queue"]], q["oldest_ready_age"] or 0.0)
    yield messages
    yield oldest


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
