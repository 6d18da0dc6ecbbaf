"""The app and helpers the queue tests share.

- ``queue``: ``queues.Queue``; ``guarded``: the same class, callable only by ``driver`` actors;
  ``timed``: with recurring sends; ``counted``: ``CountingQueue``.
- ``driver``: runs a test's coroutine function inside an actor event (``inside``), so that the
  test can use ``ak.queue.Client`` as an application would.
- ``worker``: a push consumer (``@ak.queue.consumer``) whose behaviour a test sets per address;
  ``silent``: a consumer that answers deliveries without mentioning any message.
"""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import trio

import actorkeep as ak
import queues
from actorkeep import codec
from actorkeep.address import actor_path
from actorkeep.queue import PREFIX, Client, Lease, RetryLater

app = ak.App()
app.mount(queues.Queue, "queue")
app.mount(queues.Queue, "guarded", allow=["driver"])
#: Queues that send themselves messages on a cron (queues.Recurring).
app.mount(
    queues.Queue,
    "timed",
    recurring={
        "q": [
            queues.Recurring("tick", "*/10 * * * * *", b"tick"),
            queues.Recurring("hourly", "0 * * * *", b"h", group="cron", priority=5),
        ]
    },
)


class CountingQueue(queues.Queue):
    """``queues.Queue``, recording how many messages each of its alarm events dead-lettered
    that dead-lettered any (``swept``)."""

    swept: ClassVar[list[int]] = []

    async def alarm(self, info: ak.AlarmInfo) -> None:
        count = "SELECT count(*) FROM actorkeep_queue_dead"
        (before,) = self.sql.exec(count).fetchone()
        await super().alarm(info)
        (after,) = self.sql.exec(count).fetchone()
        if after > before:
            CountingQueue.swept.append(after - before)


app.mount(CountingQueue, "counted")

Task = Callable[[ak.Actor], Awaitable[Any]]
_tasks: dict[int, Task] = {}
_results: dict[int, tuple[bool, Any]] = {}
_keys = itertools.count(1)


@app.actor("driver")
class Driver(ak.Actor):
    @ak.rpc
    async def run(self, key: int) -> None:
        fn = _tasks.pop(key)
        try:
            _results[key] = (True, await fn(self))
        except Exception as exc:
            _results[key] = (False, exc)


Behaviour = Callable[[ak.Actor, Lease], Awaitable[RetryLater | None]]


@dataclass
class Deliveries:
    """What the consumers saw: (consumer, id, attempt, body, host time)."""

    seen: list[tuple[str, int, int, bytes, float]] = field(default_factory=list)
    behaviour: dict[str, Behaviour] = field(default_factory=dict)
    batches: list[int] = field(default_factory=list)

    def clear(self) -> None:
        self.seen.clear()
        self.behaviour.clear()
        self.batches.clear()


deliveries = Deliveries()


@app.actor("worker")
class Worker(ak.Actor):
    @ak.queue.consumer
    async def handle(self, msg: Lease) -> RetryLater | None:
        deliveries.seen.append((self.address, msg.id, msg.attempt, msg.body, self.now()))
        fn = deliveries.behaviour.get(self.address)
        return await fn(self, msg) if fn is not None else None

    @ak.route("POST", "/count")
    async def count(self, req: ak.Request) -> ak.Response:
        return ak.Response.json({"n": len(deliveries.seen)})


picky_seen: list[bytes] = []


@app.actor("picky")
class Picky(ak.Actor):
    """A consumer that takes deliveries from ``queue/listed`` only."""

    @ak.queue.consumer(queues=["queue/listed"])
    async def handle(self, msg: Lease) -> None:
        picky_seen.append(msg.body)


@app.actor("silent")
class Silent(ak.Actor):
    @ak.route("POST", ak.queue.DELIVER_PATH)
    async def deliver(self, req: ak.Request) -> ak.Response:
        async def note(msg: Lease) -> None:
            deliveries.seen.append((self.address, msg.id, msg.attempt, msg.body, self.now()))

        await ak.queue.handle_delivery(req, note)  # runs the handler, then drops the reply
        return ak.Response(200, {"content-type": codec.MSGPACK}, codec.pack({"outcomes": []}))


async def inside(host: ak.testing.TestHost, fn: Task, driver: str = "driver/d") -> Any:
    """Run ``await fn(actor)`` inside an event of ``driver``; its result, or raise its error."""
    key = next(_keys)
    _tasks[key] = fn
    resp = await host.call_as(
        "tester/t",
        driver,
        "POST",
        "/_rpc/run",
        codec.pack({"key": key}),
        {"content-type": codec.MSGPACK},
        timeout=None,
    )
    assert resp.status == 200, resp.body
    ok, value = _results.pop(key)
    if not ok:
        raise value
    return value


class Remote:
    """``await Remote(host, "queue/q").send(b"x")`` runs ``Client("queue/q").send(b"x")``
    inside a driver actor's event."""

    def __init__(
        self, host: ak.testing.TestHost, address: str = "queue/q", driver: str = "driver/d"
    ) -> None:
        self.host = host
        self.address = address
        self.driver = driver

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        async def call(*args: Any, **kwargs: Any) -> Any:
            async def run(_: ak.Actor) -> Any:
                return await getattr(Client(self.address), name)(*args, **kwargs)

            return await inside(self.host, run, self.driver)

        return call


async def raw(
    host: ak.testing.TestHost, op: str, body: bytes, address: str = "queue/q"
) -> ak.Response:
    """A frame sent as the actor ``app/x`` straight to the queue's protocol."""
    return await host.call_as("app/x", address, "POST", f"{PREFIX}/{op}", body)


def now(host: ak.testing.TestHost) -> float:
    return host.host.clock.now()


def alarm_of(host: ak.testing.TestHost, address: str = "queue/q") -> float | None:
    """The alarm time the host's index holds for ``address``."""
    return host.host.alarm_index.get(address)


def queue_file(data_dir: Path, address: str = "queue/q") -> Path:
    class_name, name = address.split("/", 1)
    return actor_path(data_dir / "actors", class_name, name)


def check_chains(conn: sqlite3.Connection) -> None:
    """Each grouped message names the live one before it in its group (none for the head,
    the only one unblocked), and each live group its last message (queues/groups.py)."""
    rows = conn.execute(
        "SELECT id, grp, prev, blocked FROM actorkeep_queue WHERE grp IS NOT NULL ORDER BY id"
    ).fetchall()
    tails = dict(conn.execute("SELECT grp, tail FROM actorkeep_queue_groups").fetchall())
    last: dict[str, int] = {}
    for id_, group, prev, blocked in rows:
        assert (prev, blocked) == (last.get(group), int(group in last)), (id_, rows)
        last[group] = id_
    assert tails == last, (tails, last)


def table_rows(data_dir: Path, table: str, address: str = "queue/q") -> list[tuple[Any, ...]]:
    """Every row of ``table`` in the queue's file, read from the side."""
    path = queue_file(data_dir, address)
    if not path.exists():
        return []
    conn = sqlite3.connect(path)
    try:
        return conn.execute(f"SELECT * FROM {table} ORDER BY id").fetchall()
    finally:
        conn.close()


async def settle_down(seconds: float = 0.0) -> None:
    """Let virtual time pass (and every ready task run)."""
    await trio.sleep(seconds)
