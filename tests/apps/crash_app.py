"""The jobs example as the crash suite serves it (``bench/crash.py``, ``tests/test_crash.py``).

Every class of ``examples/jobs/app.py`` is mounted unchanged under its own name, with two
differences that the suite needs and the example should not carry:

- ``queue/webhooks`` gets short timings (3 s visibility, 0.2 s backoff base), so that messages
  in flight at a kill -9 come back within seconds and failing jobs die within seconds; the
  example's 30 s visibility would make a 3-cycle run take minutes. ``Api`` is subclassed only
  to configure those timings in its ``setup``.
- ``tally/<name>``: KV counters incremented by compare-and-set, the one KV use the example has
  none of. The KV ``allow`` list names it next to ``api`` and ``deliverer``.

The deliverer's ``GET /deliverer/main/deliveries`` (and its ``deliveries`` table) is what the
suite reads to see what was delivered; dead letters are read from the queue's file.
``cluster_app`` is the same app with a deliverer whose records are durable (the cluster crash
suite, ``bench/cluster_crash.py``).
"""

from __future__ import annotations

import dataclasses
import json

import actorkeep as ak
import queues
import shards
from examples.jobs import app as jobs

FAST_WEBHOOKS = dataclasses.replace(
    jobs.WEBHOOKS, visibility=3.0, backoff_base=0.2, backoff_max=2.0
)
MAX_CAS_TRIES = 1000

counters = ak.kv.Client("kv", shards=4)  # the example's shard count: the same four files


class Api(jobs.Api):
    """The example's front; only the webhook queue's timings differ."""

    async def setup(self) -> None:
        await jobs.webhooks.configure(FAST_WEBHOOKS)
        await self.actors.call("worker/main", "POST", "/start")


class DurableDeliverer(jobs.Deliverer):
    """The example's deliverer, but what it records is durable before its ack leaves: the
    cluster crash suite's (``bench/cluster_crash.py``). The example records with a plain
    write, which a host's death takes with it in a cluster, as power loss does on one host."""

    @ak.queue.consumer(queues=["queue/webhooks"])
    async def deliver(self, message: ak.queue.Lease) -> ak.queue.RetryLater | None:
        endpoint = await jobs.settings.get("settings/endpoint")
        if endpoint is None:
            return ak.queue.RetryLater(30.0)
        if json.loads(message.body).get("fail"):
            raise RuntimeError("the endpoint answered 500")
        self.post(endpoint.value.decode(), message)
        await self.sql.sync()
        return None


class Tally(ak.Actor):
    """Counters kept in the KV: read, then compare-and-set ``n + 1``; retried on conflict."""

    @ak.rpc
    async def bump(self, key: str) -> list[int]:
        """Add one to the counter ``key``; answer ``[new value, its version]``."""
        for _ in range(MAX_CAS_TRIES):
            entry = await counters.get_fresh(key)
            n = 0 if entry is None else int(entry.value)
            expect = ak.kv.ABSENT if entry is None else entry.version
            try:
                version = await counters.compare_and_set(key, expect, str(n + 1).encode())
            except ak.kv.Conflict:
                continue  # another tally got there first: read again
            return [n + 1, version]
        raise RuntimeError(f"{key}: {MAX_CAS_TRIES} compare-and-set conflicts in a row")

    @ak.rpc
    async def read(self, key: str) -> list[int] | None:
        """``[value, version]`` of the counter ``key``, or None if it was never bumped."""
        entry = await counters.get_fresh(key)
        return None if entry is None else [int(entry.value), entry.version]


def build(deliverer: type[ak.Actor]) -> ak.App:
    """The app, with ``deliverer`` as the webhook queue's consumer."""
    built = ak.App()
    built.mount(shards.KVShard, "kv", access="internal", allow=["api", "deliverer", "tally"])
    built.mount(queues.Queue, "queue", access="internal", allow=["api", "worker"])
    built.mount(Api, "api")
    built.mount(deliverer, "deliverer")
    built.mount(jobs.Worker, "worker")
    built.mount(Tally, "tally")
    return built


app = build(jobs.Deliverer)
#: For a cluster: the deliverer's records durable (``DurableDeliverer``).
cluster_app = build(DurableDeliverer)
