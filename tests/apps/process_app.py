"""The app ``tests/test_process.py`` serves with ``actorkeep serve tests.apps.process_app:app``.

- ``alarmer``: sets its alarm through an ``@rpc`` and records in its table when ``alarm()`` ran.
- ``echo`` (and ``vault``, the same class under a second name, made internal with ``--access``):
  reports the caller the host vouched for and the reserved headers it saw.
- ``relay``: calls ``echo``/``vault`` as an actor, trying to forge the caller header.
- ``ledger``: a counter whose ``fail`` method writes inside a transaction and then raises.
"""

from __future__ import annotations

from typing import Any

import actorkeep as ak
from examples.counter.app import Counter

app = ak.App()


@app.actor("alarmer")
class Alarmer(ak.Actor):
    async def setup(self) -> None:
        self.sql.exec(
            "CREATE TABLE IF NOT EXISTS fired "
            "(seq INTEGER PRIMARY KEY, fired_at REAL, scheduled_at REAL, retry_count INTEGER)"
        )

    @ak.rpc
    async def arm(self, delay: float) -> dict[str, float]:
        """Set the alarm ``delay`` seconds ahead; return the host's now and the alarm time."""
        now = self.now()
        await self.set_alarm(now + delay)
        return {"now": now, "at": now + delay}

    @ak.route("GET", "/")
    async def show(self, req: ak.Request) -> ak.Response:
        rows = self.sql.exec(
            "SELECT fired_at, scheduled_at, retry_count FROM fired ORDER BY seq"
        ).fetchall()
        return ak.Response.json(
            {
                "alarm": self.get_alarm(),
                "now": self.now(),
                "fired": [{"fired_at": f, "scheduled_at": s, "retry_count": r} for f, s, r in rows],
            }
        )

    async def alarm(self, info: ak.AlarmInfo) -> None:
        self.sql.exec(
            "INSERT INTO fired (fired_at, scheduled_at, retry_count) VALUES (?, ?, ?)",
            (self.now(), info.scheduled_at, info.retry_count),
        )


class Echo(ak.Actor):
    @ak.route("GET", "/whoami")
    async def whoami(self, req: ak.Request) -> ak.Response:
        return ak.Response.json(
            {
                "caller": req.caller,
                "reserved": sorted(h for h in req.headers if h.startswith("x-actorkeep-")),
                "x-other": req.headers.get("x-other"),
            }
        )


app.mount(Echo, "echo")
app.mount(Echo, "vault")


@app.actor("relay")
class Relay(ak.Actor):
    @ak.rpc
    async def ask(self, target: str) -> dict[str, Any]:
        """Call ``target``'s /whoami as this actor, with a forged caller header."""
        resp = await self.actors.call(
            target, "GET", "/whoami", headers={"X-Actorkeep-Caller": "counter/forged"}
        )
        return {"status": resp.status, "body": resp.json()}


@app.actor("ledger")
class Ledger(Counter):
    """The example counter, plus a method that fails after writing."""

    @ak.rpc
    async def add(self, by: int = 1) -> int:
        return await self.incr(by)

    @ak.rpc
    async def fail(self, by: int = 1) -> int:
        """Add inside a transaction, then raise: the host must roll the addition back."""
        self.sql.exec("BEGIN IMMEDIATE")
        self.sql.exec(
            "INSERT INTO c VALUES (0, ?) ON CONFLICT(id) DO UPDATE SET n = n + excluded.n", (by,)
        )
        raise RuntimeError(f"ledger {self.name} refuses {by}")
