"""The HTTP edge: ``Front`` turns outside requests into events and refusals into statuses;
``serve_http`` is the HTTP/1.1 server of ``actorkeep serve``; ``AsgiApp`` is the same front as
an ASGI app. The runtime knows none of this (docs/decisions/0014-layout.md)."""

from .asgi import AsgiApp
from .front import Front
from .limits import ServerLimits
from .server import HttpServer, serve_http

__all__ = ["AsgiApp", "Front", "HttpServer", "ServerLimits", "serve_http"]
