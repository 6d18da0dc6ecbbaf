"""Chat rooms: one actor per room, its history in the room's SQLite, its members' WebSockets.

    .venv/bin/actorkeep serve examples.chat.app:app --data ./data
    open http://127.0.0.1:8080/room/lobby/?user=ann   (and again as bob, in another tab)

The page (``GET /room/<name>/``) opens ``/room/<name>/ws?user=<you>``. On accept the room
sends the last 50 messages; a message is a JSON ``{"text": ...}``, kept durably, then sent to
every member. When the host restarts, the page reconnects and gets the history again.
"""

from __future__ import annotations

import json
import re
from importlib import resources

import actorkeep as ak

app = ak.App()

USER = re.compile(r"[A-Za-z0-9_.-]{1,32}")
MAX_TEXT = 500
HISTORY = 50
PAGE = resources.files(__package__).joinpath("page.html").read_bytes()


def who(address: str, req: ak.Request) -> str | ak.Response:
    """Before the room is woken (or created): the member's name, checked."""
    user = req.query.get("user", "")
    if not USER.fullmatch(user):
        return ak.Response.json({"error": "user must be 1-32 of A-Z a-z 0-9 _ . -"}, 400)
    return user


@app.actor("room")
class Room(ak.Actor):
    # Pages ping every 20 s to keep idle connections open; the host answers for the room.
    websocket_auto_reply = ("ping", "pong")

    async def setup(self) -> None:
        self.sql.exec(
            "CREATE TABLE IF NOT EXISTS messages (id INTEGER PRIMARY KEY, at REAL NOT NULL, "
            "user TEXT NOT NULL, text TEXT NOT NULL)"
        )

    @ak.route("GET", "/")
    async def page(self, req: ak.Request) -> ak.Response:
        return ak.Response(200, {"content-type": "text/html; charset=utf-8"}, PAGE)

    @ak.websocket("/ws", parse=who)
    async def join(self, req: ak.Request) -> ak.WebSocket:
        ws = req.accept_websocket(attachment={"user": req.parsed})
        ws.send(json.dumps({"type": "history", "messages": self.history()}))
        return ws

    async def websocket_message(self, ws: ak.WebSocket, message: str | bytes) -> None:
        try:
            text = json.loads(message)["text"]
            if not isinstance(text, str) or not 0 < len(text) <= MAX_TEXT:
                raise ValueError
        except (ValueError, KeyError, TypeError):
            ws.send(json.dumps({"type": "error", "error": f'want {{"text": 1-{MAX_TEXT} chars}}'}))
            return
        user = ws.attachment["user"]
        at = self.now()
        # Durable before anyone sees it: the sends below leave once the write is on disk.
        self.sql.exec(
            "INSERT INTO messages (at, user, text) VALUES (?, ?, ?)", (at, user, text), durable=True
        )
        out = json.dumps({"type": "message", "at": at, "user": user, "text": text})
        for member in self.websockets():
            member.send(out)

    async def websocket_close(self, ws: ak.WebSocket, code: int, reason: str) -> None:
        gone = json.dumps({"type": "left", "user": ws.attachment["user"]})
        for member in self.websockets():
            member.send(gone)

    @ak.route("GET", "/messages")
    async def messages(self, req: ak.Request) -> ak.Response:
        return ak.Response.json(self.history())

    def history(self) -> list[dict[str, object]]:
        rows = self.sql.exec(
            "SELECT at, user, text FROM messages ORDER BY id DESC LIMIT ?", (HISTORY,)
        ).fetchall()
        return [{"at": at, "user": user, "text": text} for at, user, text in reversed(rows)]
