"""The transactional outbox: a message queued exactly once per committed transaction, none
for one rolled back, delivered after a crash or an unreachable queue (docs/queues.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import actorkeep as ak
from actorkeep.queue import Client
from actorkeep.sql import Sql
from actorkeep.testing import open_host
from tests.outbox_app import app
from tests.sqlutil import rows_read


async def rpc(host: ak.testing.TestHost, address: str, method: str, /, **args: Any) -> Any:
    resp = await host.request("POST", f"/{address}/_rpc/{method}", json=args)
    assert resp.status == 200, resp.body
    return resp.json()


async def test_a_commit_queues_once_a_rollback_never(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        assert await rpc(host, "shop/s", "order", id="a") == 0  # delivered at once
        assert await rpc(host, "shop/s", "order", id="b") == 0
        resp = await host.request("POST", "/shop/s/_rpc/order", json={"id": "c", "fail": True})
        assert resp.status == 500
        assert await rpc(host, "shop/s", "orders") == ["a", "b"]
        assert [body for _, body in await rpc(host, "shop/s", "drain")] == ["a", "b"]
        assert "inside `async with self.outbox.transaction()`" in await rpc(
            host, "shop/s", "outside"
        )
        await trio.sleep(10)  # the fallback schedules had nothing left to do
        assert await rpc(host, "shop/s", "drain") == []


async def test_a_queue_that_refuses_gets_the_rows_later(
    data_dir: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = Client.send
    refusals = iter(range(3))

    async def flaky(self: Client, *args: Any, **kw: Any) -> int:
        if next(refusals, None) is not None:
            raise ak.Overloaded("the queue is busy")
        return await real(self, *args, **kw)

    monkeypatch.setattr(Client, "send", flaky)
    async with open_host(app, data_dir) as host:
        assert await rpc(host, "shop/s", "order", id="a") == 1  # committed, not delivered
        assert await rpc(host, "shop/s", "order", id="b") == 2  # behind it
        await trio.sleep(120)  # the fallback retries with backoff (5 s, then 10 s, ...)
        assert await rpc(host, "shop/s", "pending") == 0
        assert [body for _, body in await rpc(host, "shop/s", "drain")] == ["a", "b"]


async def test_a_crash_between_send_and_delete_queues_once(
    data_dir: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = Sql.exec
    crashes = iter([True])

    def crash_before_delete(self: Sql, sql: str, params: Any = (), **kw: Any) -> Any:
        if sql.startswith("DELETE FROM actorkeep_outbox") and next(crashes, False):
            raise OSError("the process died after the send")
        return real(self, sql, params, **kw)

    monkeypatch.setattr(Sql, "exec", crash_before_delete)
    async with open_host(app, data_dir) as host:
        resp = await host.request("POST", "/shop/s/_rpc/order", json={"id": "a"})
        assert resp.status == 500  # the event failed after its commit and its send
        await host.restart()
        await trio.sleep(10)  # the fallback sends the row again: the queue knows its key
        assert await rpc(host, "shop/s", "pending") == 0
        assert [body for _, body in await rpc(host, "shop/s", "drain")] == ["a"]
        assert await rpc(host, "shop/s", "orders") == ["a"]


async def test_a_backlog_is_read_a_page_at_a_time_and_goes_in_order(
    data_dir: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """250 orders commit while their queue refuses: each try reads one page of the backlog
    (not all of it, bodies and all, again at every try); once the queue answers, every row
    goes, once, in order."""
    down = True
    real_send = Client.send

    async def flaky(self: Client, *args: Any, **kw: Any) -> int:
        if down:
            raise ak.Overloaded("the queue is busy")
        return await real_send(self, *args, **kw)

    monkeypatch.setattr(Client, "send", flaky)
    read = rows_read(monkeypatch, "SELECT id, queue, body")
    async with open_host(app, data_dir) as host:
        for i in range(250):
            assert await rpc(host, "shop/s", "order", id=f"{i:03}") == i + 1
        assert max(read) == 100, read
        down = False
        await trio.sleep(600)  # the fallback's next try
        assert await rpc(host, "shop/s", "pending") == 0
        drained = [body for _, body in await rpc(host, "shop/s", "drain")]
        assert drained == [f"{i:03}" for i in range(250)]
