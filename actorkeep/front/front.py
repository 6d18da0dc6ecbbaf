"""The outside front: from an HTTP request to an actor's event (docs/reference.md §6).

``/<class>/<name>/<path>`` goes to the actor's handler with path ``/<path>``; the host's own
``/_actorkeep/health`` answers 200. Every ``x-actorkeep-*`` header from outside is dropped here,
so an outside client can never pose as an actor. Used by the ASGI app and by ``ak.testing``.
"""

from __future__ import annotations

import json as _json
from collections.abc import Iterable, Mapping
from typing import Any, Protocol
from urllib.parse import unquote

import structlog

from ..address import check_actor_name
from ..errors import ActorkeepError, HostClosed, OutcomeUnknown, Overloaded, Quarantined
from ..http import (
    RESERVED_HEADER_PREFIX,
    Headers,
    Request,
    Response,
    error_response,
    parse_query,
)
from ..runtime.host import Host
from ..runtime.sockets import ACCEPTED, SocketLink, Upgrade
from ..ws import WebSocket

log = structlog.get_logger("actorkeep")

HEALTH_PATH = "/_actorkeep/health"


class Handler(Protocol):
    """What an ``HttpServer`` serves: ``Front`` (the app's requests), or another listener's
    answers for the same host (the admin API)."""

    @property
    def host(self) -> Host: ...

    async def handle(
        self,
        method: str,
        raw_path: str,
        query_string: str,
        headers: Iterable[tuple[str, str]],
        body: bytes,
    ) -> Response: ...


class Front:
    """Turns outside requests into events and refusals into status codes."""

    def __init__(self, host: Host) -> None:
        self.host = host

    async def handle(
        self,
        method: str,
        raw_path: str,
        query_string: str,
        headers: Iterable[tuple[str, str]],
        body: bytes,
    ) -> Response:
        """Answer one outside request; ``raw_path`` is still percent-encoded."""
        try:
            request = self._request(method, raw_path, query_string, headers, body)
            if isinstance(request, Response):
                return request
            class_name, name, req = request
            return await self.host.router.deliver(class_name, name, req, (), None)
        except _REFUSED as exc:
            return _refusal(exc)

    async def upgrade(
        self,
        raw_path: str,
        query_string: str,
        headers: Iterable[tuple[str, str]],
        link: SocketLink,
    ) -> tuple[Response, WebSocket | None]:
        """An outside WebSocket upgrade (a GET) whose socket would be ``link``: the reply,
        and the socket if the actor accepted it (the reply is then ``ACCEPTED``, and the
        caller writes the handshake's own)."""
        upgrade: Upgrade | None = None
        try:
            request = self._request("GET", raw_path, query_string, headers, b"")
            if isinstance(request, Response):
                return request, None
            class_name, name, req = request
            actor_class = self.host.classes[class_name]
            address = f"{class_name}/{name}"
            upgrade = req.upgrade = self.host.sockets.upgrade(actor_class, address, name, link)
            resp = await self.host.router.deliver(class_name, name, req, (), None)
        except _REFUSED as exc:
            resp = _refusal(exc)
        except BaseException:
            if upgrade is not None:
                upgrade.abandon()
            raise
        if resp is ACCEPTED and upgrade is not None and upgrade.socket is not None:
            return resp, upgrade.socket
        if upgrade is not None:
            upgrade.abandon()
        return resp, None

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        """An outside request written as a path with its query (``/c/a/items?limit=5``);
        ``json`` becomes the body with its content type. For tests and the simulator."""
        hdrs = dict(headers or {})
        if json is not None:
            body = _json.dumps(json).encode()
            hdrs.setdefault("content-type", "application/json")
        raw_path, _, query = path.partition("?")
        return await self.handle(method, raw_path, query, hdrs.items(), body)

    def _request(
        self,
        method: str,
        raw_path: str,
        query_string: str,
        headers: Iterable[tuple[str, str]],
        body: bytes,
    ) -> Response | tuple[str, str, Request]:
        """The actor's class, name and request, or the reply that refuses it."""
        if raw_path == HEALTH_PATH:
            return Response.json({"status": "ok", "active": self.host.active_count})
        parts = raw_path.split("/", 3)
        if len(parts) < 3 or parts[0] or not parts[1] or not parts[2]:
            return error_response(404, "NotFound", "want /<class>/<name>/<path>")
        class_name = unquote(parts[1])
        if class_name not in self.host.classes:
            return error_response(404, "NotFound", f"no actor class {class_name!r}")
        name = unquote(parts[2])
        try:
            check_actor_name(name)
        except ValueError as exc:
            return error_response(400, "BadRequest", str(exc))
        if len(body) > self.host.max_body:
            return error_response(413, "PayloadTooLarge", f"body over {self.host.max_body} bytes")
        path = "/" + parts[3] if len(parts) == 4 else "/"
        # Without the x-actorkeep-* headers, lower-cased, repeats joined: one pass per request.
        lower: dict[str, str] = {}
        for key, value in headers:
            k = key.lower()
            if not k.startswith(RESERVED_HEADER_PREFIX):
                lower[k] = f"{lower[k]}, {value}" if k in lower else value
        hdrs = Headers._from_lower(lower)
        try:
            query = parse_query(query_string)
        except ValueError as exc:
            return error_response(400, "BadRequest", f"bad query string: {exc}")
        return class_name, name, Request(method.upper(), path, query, hdrs, body, None)


#: What the host raises for an outside request it will not run now.
_REFUSED = (Overloaded, OutcomeUnknown, HostClosed, Quarantined)


def _refusal(exc: ActorkeepError) -> Response:
    """The reply to an outside request the host refused with ``exc``."""
    if isinstance(exc, Overloaded | OutcomeUnknown):
        name = "Overloaded" if isinstance(exc, Overloaded) else "OutcomeUnknown"
        # The call may have run (OutcomeUnknown): 503, not a gateway timeout.
        return error_response(503, name, exc.message, {"retry-after": str(round(exc.retry_after))})
    if isinstance(exc, HostClosed):
        return error_response(503, "HostClosed", str(exc), {"retry-after": "1"})
    assert isinstance(exc, Quarantined)
    return error_response(503, "Quarantined", exc.message)
