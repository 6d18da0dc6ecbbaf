"""Run a host on real files through writes of every kind, and print (as JSON) the event loop's
thread id, how many checkpoints ran, the size of the busiest write-ahead log and how many
fdatasyncs the host's io_uring ran: run under ``strace -f`` by tests/test_gate.py, which checks
that no fsync ran on the event loop.

    python tests/apps/fsync_probe.py DATA [ring|threads]
"""

from __future__ import annotations

import json
import os
import sys
import threading
from functools import partial
from pathlib import Path
from typing import Any

import trio

import actorkeep as ak
import queues
import shards
from actorkeep.runtime import storage
from actorkeep.runtime.syncer import Syncer
from actorkeep.testing import open_host

app = ak.App()
app.mount(shards.KVShard, "kv")
app.mount(queues.Queue, "queue")
kv = ak.kv.Client("kv", shards=1)
jobs = ak.queue.Client("queue/jobs")
handled: list[int] = []


@app.actor("writer")
class Writer(ak.Actor):
    @ak.rpc
    async def configure(self) -> None:
        await jobs.configure(ak.queue.Config(consumer="consumer/c"))

    @ak.rpc
    async def local(self, i: int) -> None:
        await kv.put(f"local/{i}", b"v" * 2048, local=True)

    @ak.rpc
    async def durable(self, i: int) -> None:
        await kv.put(f"durable/{i}", b"d" * 100)

    @ak.rpc
    async def send(self, i: int) -> None:
        await jobs.send(b"%d" % i)

    @ak.rpc
    async def timer(self, delay: float) -> None:
        await self.set_alarm(self.now() + delay, wait=False)

    async def alarm(self, info: ak.AlarmInfo) -> None:
        self.sql.exec("CREATE TABLE IF NOT EXISTS fired (at REAL)")
        self.sql.exec("INSERT INTO fired VALUES (?)", (info.scheduled_at,), durable=True)


@app.actor("consumer")
class Consumer(ak.Actor):
    @ak.queue.consumer
    async def handle(self, msg: Any) -> None:
        handled.append(int(msg.body))


async def main(data: Path, syncs: str) -> dict[str, Any]:
    checkpoints = 0
    real = storage.FileDatabase._checkpoint

    def counting(self: storage.FileDatabase) -> None:
        nonlocal checkpoints
        checkpoints += 1
        real(self)

    storage.FileDatabase._checkpoint = counting  # type: ignore[method-assign]
    largest_wal = 0
    files = ak.FileStorage(data)
    if syncs == "threads":
        files.syncer = Syncer(ring=False)
    async with open_host(app, storage=files, idle_timeout=0.5) as host:
        await host.request("POST", "/writer/w/_rpc/configure", json={})
        for i in range(4000):
            await host.request("POST", "/writer/w/_rpc/local", json={"i": i})
            if i % 500 == 0:
                wal = data / "actors" / "kv"
                sizes = [p.stat().st_size for p in wal.rglob("*.sqlite-wal")]
                largest_wal = max([largest_wal, *sizes])
        async with trio.open_nursery() as nursery:
            for i in range(200):
                for op in ("durable", "send"):
                    nursery.start_soon(
                        partial(host.request, "POST", f"/writer/w{i % 8}/_rpc/{op}", json={"i": i})
                    )
        await host.request("POST", "/writer/t/_rpc/timer", json={"delay": 0.2})
        with trio.fail_after(20):
            while len(set(handled)) < 200:  # noqa: ASYNC110 (the consumer's deliveries)
                await trio.sleep(0.05)
        await trio.sleep(1.5)  # the timer fires; idle actors are evicted (closed)
        ring = None if files.syncer is None else files.syncer.ring
    return {
        "ring_syncs": 0 if ring is None else ring.completed,
        "loop_thread": threading.get_native_id(),
        "checkpoints": checkpoints,
        "largest_wal": largest_wal,
        "handled": len(set(handled)),
        "pid": os.getpid(),
    }


if __name__ == "__main__":
    print(json.dumps(trio.run(main, Path(sys.argv[1]), sys.argv[2] if sys.argv[2:] else "ring")))
