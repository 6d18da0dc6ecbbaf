"""The replies the HTTP server writes itself, without asking the host (server.py)."""

from __future__ import annotations

import structlog
import trio

from ..http import Response, error_response
from ..runtime.host import Host
from .http11 import ProtocolError, RequestHead

log = structlog.get_logger("actorkeep")


def too_large(host: Host) -> Response:
    return error_response(413, "PayloadTooLarge", f"body over {host.max_body} bytes")


def timeout_reply(message: str) -> Response:
    return error_response(408, "RequestTimeout", message)


PROTOCOL_ERRORS = {431: "HeadersTooLarge", 505: "HTTPVersionNotSupported"}


def protocol_error(exc: ProtocolError) -> Response:
    return error_response(exc.status, PROTOCOL_ERRORS.get(exc.status, "BadRequest"), exc.message)


def internal_error(error_id: str) -> Response:
    return error_response(500, "InternalError", f"internal error (id {error_id})")


NO_MEMORY = error_response(
    503, "Overloaded", "too many request bytes in flight", {"retry-after": "1"}
)
HOST_CLOSED = error_response(503, "HostClosed", "the host is shutting down", {"retry-after": "1"})
REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"retry-after: 1\r\nconnection: close\r\ncontent-length: 55\r\n\r\n"
    b'{"error":"Overloaded","message":"too many connections"}'
)


def log_access(request: RequestHead, status: int, started: float) -> None:
    ms = round((trio.current_time() - started) * 1000, 2)
    log.info("request", method=request.method, target=request.target, status=status, ms=ms)
