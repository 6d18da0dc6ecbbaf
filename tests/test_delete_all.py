"""``await self.delete_all()``: an actor drops everything it stored, and its alarm."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

import actorkeep as ak
from actorkeep.testing import open_host

app = ak.App()
setups: list[str] = []
fired: list[str] = []


@app.actor("doc")
class Doc(ak.Actor):
    async def setup(self) -> None:
        setups.append(self.address)
        self.sql.exec("CREATE TABLE IF NOT EXISTS parent (id INTEGER PRIMARY KEY)")
        self.sql.exec(
            "CREATE TABLE IF NOT EXISTS child (id INTEGER PRIMARY KEY, "
            "parent INTEGER REFERENCES parent (id))"
        )
        self.sql.exec("CREATE INDEX IF NOT EXISTS child_parent ON child (parent)")
        self.sql.exec("CREATE VIEW IF NOT EXISTS both_ AS SELECT * FROM parent JOIN child")
        self.sql.exec(
            "CREATE TRIGGER IF NOT EXISTS no_neg BEFORE INSERT ON parent "
            "WHEN NEW.id < 0 BEGIN SELECT RAISE(ABORT, 'negative'); END"
        )

    @ak.rpc
    async def fill(self) -> None:
        self.sql.exec("INSERT INTO parent (id) VALUES (1)")
        self.sql.exec("INSERT INTO child (id, parent) VALUES (1, 1)")
        await self.set_alarm(self.now() + 60)

    @ak.rpc
    async def wipe(self) -> list[str]:
        await self.delete_all()
        # The rest of the event sees the empty database.
        return [r[0] for r in self.sql.exec("SELECT name FROM sqlite_master").fetchall()]

    @ak.rpc
    async def wipe_in_transaction(self) -> None:
        with self.sql.transaction():
            await self.delete_all()

    @ak.rpc
    async def rows(self) -> int:
        return int(self.sql.exec("SELECT count(*) FROM child").fetchone()[0])

    async def alarm(self, info: ak.AlarmInfo) -> None:
        fired.append(self.address)


async def rpc(host: ak.testing.TestHost, method: str) -> object:
    resp = await host.request("POST", f"/doc/d/_rpc/{method}", json={})
    assert resp.status == 200, resp.body
    return resp.json()


async def test_delete_all_drops_the_tables_and_the_alarm_and_survives_a_restart(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    setups.clear()
    fired.clear()
    async with open_host(app, data_dir=tmp_path) as host:
        await rpc(host, "fill")
        assert await rpc(host, "rows") == 1
        left = await rpc(host, "wipe")
        assert left == ["actorkeep_actor", "actorkeep_alarm"]  # the runtime's own rows
        assert host.host.alarm_index.get("doc/d") is None
        assert await rpc(host, "rows") == 0  # a new instance: setup() made the tables again
        assert setups == ["doc/d", "doc/d"]
        await trio.sleep(120)  # the alarm it had would have fired by now
        await host.restart()
        assert await rpc(host, "rows") == 0
        await trio.sleep(120)
    assert fired == []


async def test_delete_all_refuses_inside_a_transaction(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir=tmp_path) as host:
        await rpc(host, "fill")
        resp = await host.request("POST", "/doc/d/_rpc/wipe_in_transaction", json={})
        assert resp.status == 500 and "inside a transaction" in resp.json()["message"]
        assert await rpc(host, "rows") == 1
