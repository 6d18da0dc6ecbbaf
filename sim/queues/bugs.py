"""Planted queue bugs: ``queues.Queue`` variants the queue checker must catch."""

from __future__ import annotations

import dataclasses

from actorkeep.runtime.gate import Gate
from actorkeep.wire.queue import Lease, Outcome
from queues import Queue
from queues.sending import PLAIN, SendOptions

from ..bugs import GATE_BUGS


class StaleAckQueue(Queue):
    """Settles whatever lease a message holds now, ignoring the attempt it was given: a late
    ack from a worker whose lease ran out settles the newer lease of someone else."""

    def settle(self, now: float, outcomes: list[Outcome]) -> tuple[list[bool], float | None]:
        current: list[Outcome] = []
        for o in outcomes:
            row = self.sql.exec(
                "SELECT attempts FROM actorkeep_queue WHERE id = ? AND leased = 1", (o.id,)
            ).fetchone()
            current.append(o if row is None else dataclasses.replace(o, attempt=row[0]))
        return super().settle(now, current)


class LazySendQueue(Queue):
    """Acknowledges sends after a plain write: power loss can drop an acknowledged message
    (and AUTOINCREMENT then hands its id to the next send)."""

    async def send(
        self, bodies: list[bytes], delay: float, priority: int, opts: SendOptions = PLAIN
    ) -> list[int]:
        now = self.now()
        if self.cfg.consumer is not None:
            await self.arm_by(now + delay)
        cur = self.sql.exec(
            "INSERT INTO actorkeep_queue (body, enqueued_at, visible_at, priority) VALUES "
            + ",".join(["(?, ?, ?, ?)"] * len(bodies))
            + " RETURNING id",
            [x for body in bodies for x in (body, now, now + delay, priority)],
        )
        return sorted(r[0] for r in cur.fetchall())


class PlainLeaseQueue(Queue):
    """Leases for pull workers with plain writes, as before decision 0008's amendment: power
    loss can undo a lease a worker holds and hand its name (id, attempt) out again."""

    async def pull_lease(self, n: int, visibility: float, worker: str | None = None) -> list[Lease]:
        leases = self.lease(self.now(), n, visibility, worker=worker)
        if leases:
            await self._arm_after_lease(leases, visibility)
        return leases


QUEUE_BUGS: dict[str, type[Queue] | type[Gate]] = {
    "ack-stale": StaleAckQueue,
    "lazy-send": LazySendQueue,
    "lease-reuse": PlainLeaseQueue,
    **GATE_BUGS,
}
