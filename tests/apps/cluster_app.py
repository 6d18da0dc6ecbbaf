"""The app ``tests/test_cluster_hosts.py`` serves on three cluster hosts.

- ``counter``: the example counter, with ``count_after(seconds)``, a slow read, and
  ``incr_after(seconds)``, a slow durable increment.
- ``echo``, ``vault`` (internal) and ``relay``: as in ``process_app`` (the caller the host
  vouched for, a forged caller header).
- ``ping``: ``bounce(target)`` calls ``target``'s ``back(origin)``, which calls ``origin`` back:
  the re-entry the host refuses at once (``back`` answers what it met).
- ``kvuser``: KV puts, CAS and gets on four shards.
- ``producer``, ``worker``: sends to a push queue whose consumer, a ``worker``, records every
  message it is handed, durably.
- ``puller``: leases and acks messages of a queue (pull).
- ``alarmer``: as in ``process_app``.
"""

from __future__ import annotations

from typing import Any

import trio

import actorkeep as ak
import queues
import shards
from examples.counter.app import Counter as ExampleCounter
from tests.apps.process_app import Alarmer, Echo, Relay


class Counter(ExampleCounter):
    """The example counter, and a read that takes a while."""

    @ak.rpc
    async def count_after(self, seconds: float) -> int:
        await trio.sleep(seconds)
        return self.count()

    @ak.rpc
    async def incr_after(self, seconds: float) -> int:
        """A durable increment that waits first."""
        await trio.sleep(seconds)
        return await self.incr_durable(1)


app = ak.App()
app.mount(Counter, "counter")
app.mount(Echo, "echo")
app.mount(Echo, "vault", access="internal")
app.mount(Relay, "relay")
app.mount(Alarmer, "alarmer")
app.mount(shards.KVShard, "kv", access="internal")
app.mount(queues.Queue, "queue", access="internal")

kv = ak.kv.Client("kv", shards=4)


@app.actor("ping")
class Ping(ak.Actor):
    @ak.rpc
    async def bounce(self, target: str) -> dict[str, Any]:
        """Ask ``target`` to call this actor back: what its call back met."""
        result: dict[str, Any] = await self.actors.ref(target).back(origin=self.address)
        return result

    @ak.rpc
    async def back(self, origin: str) -> dict[str, Any]:
        try:
            await self.actors.ref(origin).bounce(target=self.address)
        except ak.ReentryError as exc:
            return {"refused": exc.status, "message": exc.message}
        return {"refused": None}


@app.actor("kvuser")
class KvUser(ak.Actor):
    @ak.rpc
    async def put(self, key: str, value: str, version: int | None = None) -> dict[str, Any]:
        """A durable put; with ``version``, only if the key is at that version (CAS)."""
        expect = ak.kv.ANY if version is None else version
        try:
            done = await kv.put_with(key, value.encode(), ak.kv.PutOptions(expect))
        except ak.kv.Conflict as exc:
            return {"conflict": exc.current_version}
        return {"version": done}

    @ak.rpc
    async def get(self, key: str) -> dict[str, Any] | None:
        entry = await kv.get(key)
        return None if entry is None else {"value": entry.value.decode(), "version": entry.version}


@app.actor("producer")
class Producer(ak.Actor):
    @ak.rpc
    async def start(self, queue: str, consumer: str) -> None:
        await ak.queue.Client(queue).configure(ak.queue.Config(consumer=consumer, batch_size=10))

    @ak.rpc
    async def send(self, queue: str, tags: list[str]) -> list[int]:
        return await ak.queue.Client(queue).send_batch([t.encode() for t in tags])


@app.actor("puller")
class Puller(ak.Actor):
    """Pulls from a queue: ``lease`` answers ``[id, attempt, body]`` of each message leased."""

    @ak.rpc
    async def lease(self, queue: str, max: int, visibility: float) -> list[list[Any]]:
        leases = await ak.queue.Client(queue).lease(max=max, visibility=visibility)
        return [[x.id, x.attempt, x.body.decode()] for x in leases]

    @ak.rpc
    async def ack(self, queue: str, id: int, attempt: int) -> bool:
        return await ak.queue.Client(queue).ack(id, attempt)


@app.actor("worker")
class Worker(ak.Actor):
    async def setup(self) -> None:
        self.sql.exec("CREATE TABLE IF NOT EXISTS handled (id INTEGER PRIMARY KEY, tag TEXT)")

    @ak.queue.consumer
    async def handle(self, msg: ak.queue.Lease) -> None:
        await self.sql.exec_durable(
            "INSERT OR IGNORE INTO handled VALUES (?, ?)", (msg.id, msg.body.decode())
        )

    @ak.rpc
    async def handled(self) -> list[str]:
        return [tag for (tag,) in self.sql.exec("SELECT tag FROM handled ORDER BY id")]
