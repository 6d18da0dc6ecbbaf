"""From a request to an event: the checks that refuse a request before its actor exists.

Everything here is plain (no await, no storage but a ``stat``): an unknown route, a body that
does not decode, a route's ``parse`` that refuses, or an outside request for an actor its
class does not let outsiders create, is answered without creating or opening the actor.
"""

from __future__ import annotations

from collections.abc import Callable

from .. import codec
from ..app import ActorClass
from ..http import Request, Response, error_response
from .handoff import Event

#: ``(exc, what, address, outside)`` -> the 500 for a bug in app code (the host's).
ErrorReply = Callable[[Exception, str, str, bool], Response]


def event_for(
    actor_class: ActorClass,
    address: str,
    request: Request,
    chain: tuple[str, ...],
    error_reply: ErrorReply,
) -> tuple[Event | Response, int]:
    """The event for ``request``, or the response that refuses it; and the bytes its decoded
    arguments hold, or a route's handler could hold decoding it (for the in-flight budget)."""
    routes = actor_class.routes
    rpc = routes.rpc_for(request.method, request.path)
    if rpc is not None:
        try:
            encoding = codec.encoding_of(request.headers.get("content-type"))
            args, values = codec.decode_args_counted(request.body, encoding)
            rpc.check_args(args)
        except ValueError as exc:
            return error_response(400, "BadRequest", str(exc)), 0
        ev = Event("rpc", rpc.fn, request, chain, None, args, encoding, rpc.inline)
        return ev, values * codec.VALUE_COST
    found = routes.match(request.method, request.path)
    if found is None:
        no_route = f"{actor_class.name} has no route {request.method} {request.path}"
        return error_response(404, "NotFound", no_route), 0
    fn, params = found
    if fn in routes.websockets:
        if request.upgrade is None:
            return _UPGRADE_REQUIRED, 0
    elif request.upgrade is not None:
        no_route = f"{actor_class.name} has no WebSocket route {request.path}"
        return error_response(404, "NotFound", no_route), 0
    inline, parse = routes.handlers[fn]
    if parse is not None:
        try:
            parsed = parse(address, request, **params)
        except ValueError as exc:
            return error_response(400, "BadRequest", str(exc)), 0
        except Exception as exc:  # a bug in the parse function: answered like one
            return error_reply(exc, "parse failed", address, request.caller is None), 0
        if isinstance(parsed, Response):
            return parsed, 0
        request.parsed = parsed
    ev = Event("request", fn, request, chain, params, inline=inline)
    if request.caller is not None or not request.body:
        return ev, 0
    # A route's handler may decode the body itself (req.json()): count what it could hold.
    return ev, codec.decode_cost(request.body, request.headers.get("content-type"))


_UPGRADE_REQUIRED = error_response(
    426, "UpgradeRequired", "this route takes WebSocket upgrades only", {"upgrade": "websocket"}
)


def creation_refused(
    actor_class: ActorClass,
    address: str,
    name: str,
    exists: Callable[[], bool],
    error_reply: ErrorReply,
) -> Response | None:
    """The 404 for an outside request that would create an actor its class does not let
    outsiders create (``App.mount(create=...)``); ``exists()`` says whether it exists."""
    creates = actor_class.outside_creates
    if creates is None:
        return None
    try:
        refuse = not creates(name) and not exists()
    except Exception as exc:  # a bug in the app's create function
        return error_reply(exc, "create check failed", address, True)
    return error_response(404, "NotFound", f"no actor {address}") if refuse else None
