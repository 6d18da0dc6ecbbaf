"""The app ``tests/test_queue_process.py`` serves: a queue driven over HTTP through app actors.

- ``queue/q``: ``queues.Queue`` (internal: outside requests are refused before it exists).
- ``producer/<name>``: ``send(tag)`` queues ``tag`` on ``queue/q`` and answers with its id once
  the send is acknowledged (durable).
- ``consumer/<name>``: ``lease(max)`` answers ``[id, attempt, body]`` for each message it
  leased; ``ack(id, attempt)`` answers whether the ack applied.
"""

from __future__ import annotations

from typing import Any

import actorkeep as ak
import queues

app = ak.App()
app.mount(queues.Queue, "queue", access="internal")

QUEUE = "queue/q"


@app.actor("producer")
class Producer(ak.Actor):
    @ak.rpc
    async def send(self, tag: str) -> int:
        return await ak.queue.Client(QUEUE).send(tag.encode())


@app.actor("consumer")
class Consumer(ak.Actor):
    @ak.rpc
    async def lease(self, max: int = 5) -> list[list[Any]]:
        leases = await ak.queue.Client(QUEUE).lease(max=max, visibility=2.0)
        return [[x.id, x.attempt, x.body.decode()] for x in leases]

    @ak.rpc
    async def ack(self, id: int, attempt: int) -> bool:
        return await ak.queue.Client(QUEUE).ack(id, attempt)
