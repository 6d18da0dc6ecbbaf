"""An app with a transactional outbox: ``shop`` actors record orders and queue one message
per order to ``queue/orders`` in the same commit (tests/test_outbox.py, the simulator's)."""

from __future__ import annotations

from typing import Any

import actorkeep as ak
import queues
from actorkeep.queue import Client

app = ak.App()
app.mount(queues.Queue, "queue")


@app.actor("shop")
class Shop(ak.OutboxActor):
    async def setup(self) -> None:
        self.sql.exec("CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY)")

    @ak.rpc
    async def order(self, id: str, fail: bool = False) -> int:
        async with self.outbox.transaction():
            self.sql.exec("INSERT OR IGNORE INTO orders VALUES (?)", (id,))
            self.outbox.send("queue/orders", id.encode(), group="orders")
            if fail:
                raise ValueError("the order is refused after its rows were written")
        return self.outbox.pending()

    @ak.rpc
    async def orders(self) -> list[str]:
        return [r[0] for r in self.sql.exec("SELECT id FROM orders ORDER BY id")]

    @ak.rpc
    async def drain(self) -> list[Any]:
        """Every message of queue/orders: leased and acked, as [id, body]."""
        q = Client("queue/orders")
        out: list[Any] = []
        while leases := await q.lease(max=100, visibility=60):
            for x in leases:
                out.append([x.id, x.body.decode()])
                await q.ack(x.id, x.attempt)
        return out

    @ak.rpc
    async def pending(self) -> int:
        return self.outbox.pending()

    @ak.rpc
    async def outside(self) -> str:
        try:
            self.outbox.send("queue/orders", b"x")
        except RuntimeError as exc:
            return str(exc)
        return "accepted"
