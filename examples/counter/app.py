"""A counter per name.

    curl -X POST localhost:8080/counter/a/_rpc/incr \\
         -H 'content-type: application/json' -d '{"by": 2}'
    curl localhost:8080/counter/a/
"""

from __future__ import annotations

import actorkeep as ak

app = ak.App()


@app.actor("counter")
class Counter(ak.Actor):
    async def setup(self) -> None:
        self.sql.exec(
            "CREATE TABLE IF NOT EXISTS c (id INTEGER PRIMARY KEY CHECK (id = 0), n INTEGER)"
        )

    @ak.rpc
    async def incr(self, by: int = 1) -> int:
        """Add ``by`` and return the new count. Survives a crash of the process."""
        self.sql.exec(
            "INSERT INTO c VALUES (0, ?) ON CONFLICT(id) DO UPDATE SET n = n + excluded.n", (by,)
        )
        return self.count()

    @ak.rpc
    async def incr_durable(self, by: int = 1) -> int:
        """Add ``by`` and return once the new count survives power loss."""
        await self.sql.exec_durable(
            "INSERT INTO c VALUES (0, ?) ON CONFLICT(id) DO UPDATE SET n = n + excluded.n", (by,)
        )
        return self.count()

    @ak.route("GET", "/")
    async def show(self, req: ak.Request) -> ak.Response:
        return ak.Response.json({"name": self.name, "n": self.count()})

    def count(self) -> int:
        row = self.sql.exec("SELECT n FROM c").fetchone()
        return int(row[0]) if row else 0
