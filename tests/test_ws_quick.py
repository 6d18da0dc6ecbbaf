import trio, trio.testing
import actorkeep as ak
from actorkeep.testing import open_host, WebSocketClosed

app = ak.App()

@app.actor("room")
class Room(ak.Actor):
    websocket_auto_reply = ("ping", "pong")
    async def setup(self):
        self.sql.exec("CREATE TABLE IF NOT EXISTS msgs (id INTEGER PRIMARY KEY, text TEXT)")
    @ak.websocket("/ws")
    async def join(self, req):
        ws = req.accept_websocket(tags=["all"], attachment={"user": req.query.get("user", "?")})
        ws.send("welcome")
        return ws
    async def websocket_message(self, ws, message):
        self.sql.exec("INSERT INTO msgs (text) VALUES (?)", (message,))
        for other in self.websockets("all"):
            other.send(f"{ws.attachment['user']}: {message}")
    async def websocket_close(self, ws, code, reason):
        for other in self.websockets():
            other.send(f"{ws.attachment['user']} left {code}")

async def test_chat(tmp_path):
    async with open_host(app, tmp_path) as th:
        async with th.websocket("/room/a/ws?user=ann") as a, th.websocket("/room/a/ws?user=bob") as b:
            assert await a.receive() == "welcome"
            assert await b.receive() == "welcome"
            await a.send("hi")
            assert await a.receive() == "ann: hi"
            assert await b.receive() == "ann: hi"
            await a.send("ping")
            assert await a.receive() == "pong"
            while not th.host.evict("room/a"):
                await trio.sleep(0.01)
            assert th.host.active_count == 0
            await b.send("yo")
            assert await a.receive() == "bob: yo"
            await b.close()
            assert await a.receive() == "bob left 1000"
        r = await th.request("GET", "/room/a/ws")
        assert r.status == 426, r.body
