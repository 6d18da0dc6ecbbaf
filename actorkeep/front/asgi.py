"""The host as an ASGI application, served by hypercorn's trio worker (docs/reference.md §6)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from ..http import Response, error_response
from .front import Front

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class _Disconnected(Exception):
    """The client went away while its request body was still arriving."""


class AsgiApp:
    """ASGI 3 application over a ``Front``. Bodies over ``max_body`` get 413 unread."""

    def __init__(self, front: Front) -> None:
        self.front = front
        self.max_body = front.host.max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "websocket":  # not served: close before accepting (hypercorn answers 403)
            if (await receive())["type"] == "websocket.connect":
                await send({"type": "websocket.close", "code": 1008})
        elif kind == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        try:
            body = await self._read_body(headers, receive)
        except _Disconnected:
            return  # the client is gone before its request was whole: run nothing, answer no one
        if body is None:
            resp = error_response(413, "PayloadTooLarge", f"body over {self.max_body} bytes")
        else:
            raw_path = scope.get("raw_path") or scope["path"].encode()
            resp = await self.front.handle(
                scope["method"],
                raw_path.decode("latin-1"),
                scope["query_string"].decode("latin-1"),
                headers,
                body,
            )
        await _send_response(send, resp)

    async def _read_body(self, headers: list[tuple[str, str]], receive: Receive) -> bytes | None:
        for key, value in headers:
            if key.lower() == "content-length":
                try:
                    if int(value) > self.max_body:
                        return None
                except ValueError:
                    pass  # hypercorn (h11/h2) rejects malformed lengths before we see them
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Disconnected
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


async def _send_response(send: Send, resp: Response) -> None:
    headers = [
        (k.encode("latin-1"), v.encode("latin-1"))
        for k, v in resp.headers.items()
        if k != "content-length"
    ]
    headers.append((b"content-length", str(len(resp.body)).encode()))
    await send({"type": "http.response.start", "status": resp.status, "headers": headers})
    await send({"type": "http.response.body", "body": resp.body})
