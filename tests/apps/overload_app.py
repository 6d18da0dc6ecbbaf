"""The app ``tests/test_overload.py`` serves: ``slow/<name>`` holds each event for a while.

``work(seconds)`` sleeps inside the event (so the actor's next events wait in its queue), then
counts itself in the actor's table and answers the new count: the answers of accepted requests
are 1, 2, 3, ... and a refused request leaves no trace.
"""

from __future__ import annotations

import trio

import actorkeep as ak

app = ak.App()


@app.actor("slow")
class Slow(ak.Actor):
    async def setup(self) -> None:
        self.sql.exec("CREATE TABLE IF NOT EXISTS done (n INTEGER PRIMARY KEY)")

    @ak.rpc
    async def work(self, seconds: float = 0.0) -> int:
        await trio.sleep(seconds)
        self.sql.exec("INSERT INTO done DEFAULT VALUES")
        n: int = self.sql.exec("SELECT count(*) FROM done").fetchone()[0]
        return n
