"""``@route`` / ``@rpc`` markers and the per-class router built from them (docs/reference.md §2)."""

from __future__ import annotations

import dis
import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar
from urllib.parse import unquote

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

RPC_PREFIX = "/_rpc/"
_ROUTES_ATTR = "__actorkeep_routes__"
_RPC_ATTR = "__actorkeep_rpc__"
_PARSE_ATTR = "__actorkeep_parse__"
_WEBSOCKET_ATTR = "__actorkeep_websocket__"
_DIRECT_ATTR = "__actorkeep_direct__"
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def _is_async(fn: object) -> bool:
    return inspect.iscoroutinefunction(fn)


_YIELD_OPS = frozenset({"YIELD_VALUE", "YIELD_FROM", "INSTRUMENTED_YIELD_VALUE"})


def never_suspends(fn: Callable[..., Any]) -> bool:
    """True if the coroutine function ``fn`` cannot suspend: its own code has no yield point.

    A coroutine gives control back to the event loop only through a ``YIELD_VALUE`` of its own
    code (every ``await``, ``async for`` and ``async with`` compiles to one), so a handler without
    one runs start to finish with nothing else running. The host may then run it in the caller's
    task (decision 0001). Anything that is not a plain function is assumed to suspend.
    """
    code = getattr(fn, "__code__", None)
    if code is None or not inspect.iscoroutinefunction(fn):
        return False
    return not any(ins.opname in _YIELD_OPS for ins in dis.get_instructions(code))


#: ``parse(address, request, **params)``: the parsed request (``request.parsed``), or a
#: ``Response`` that answers it at once; ``ValueError`` answers 400.
Parser = Callable[..., Any]


def route(method: str, path: str, *, parse: Parser | None = None) -> Callable[[F], F]:
    """Mark an ``async def handler(self, req, **params) -> Response`` for ``method path``.

    ``path`` may hold ``{param}`` segments; each matches one path segment and is passed to the
    handler as a keyword argument (percent-decoded). Stack the decorator for several routes.

    ``parse(address, req, **params)``, if given, runs before the actor is created or woken: it
    returns what the handler finds in ``req.parsed``, or an ``ak.Response`` to answer without
    running the handler; a ``ValueError`` answers 400 with its message (any other exception,
    500). Use it to check a body so that a refused request never creates the actor's file. It
    is a plain function: no ``await``, no storage. Stacked routes of one handler share it.
    """
    method = method.upper()
    if method not in METHODS:
        raise ValueError(f"unsupported HTTP method {method!r}")
    if not path.startswith("/"):
        raise ValueError(f"route path must start with '/': {path!r}")

    if parse is not None and (_is_async(parse) or not callable(parse)):
        raise TypeError("parse must be a plain function (no async def): it runs before the actor")

    def mark(fn: F) -> F:
        if not _is_async(fn):
            raise TypeError(f"@route handler {fn.__qualname__} must be async def")
        routes = list(getattr(fn, _ROUTES_ATTR, ()))
        if routes and getattr(fn, _PARSE_ATTR, None) is not parse:
            raise TypeError(
                f"@route handler {fn.__qualname__}: every route of one handler takes the same "
                "parse function (or none)"
            )
        routes.append((method, path))
        setattr(fn, _ROUTES_ATTR, routes)
        if parse is not None:
            setattr(fn, _PARSE_ATTR, parse)
        return fn

    return mark


def websocket(path: str, *, parse: Parser | None = None) -> Callable[[F], F]:
    """Mark an ``async def handler(self, req, **params)`` that takes WebSocket upgrades at
    ``GET path`` (docs/websockets.md). It runs as an event of the actor, after the access
    rules, the caller rules and ``parse`` (as for ``@route``) let the upgrade through; it
    returns ``req.accept_websocket(...)`` to accept, or an ``ak.Response`` to refuse. A
    request to ``path`` that is not an upgrade gets 426. The class must define
    ``async def websocket_message(self, ws, message)``, and may define
    ``async def websocket_close(self, ws, code, reason)``.
    """
    mark_route = route("GET", path, parse=parse)

    def mark(fn: F) -> F:
        if getattr(fn, _ROUTES_ATTR, ()):
            raise TypeError(f"@websocket handler {fn.__qualname__} may not be a @route too")
        mark_route(fn)
        setattr(fn, _WEBSOCKET_ATTR, True)
        return fn

    return mark


def direct(path: str, fn: Callable[..., Any]) -> Callable[[F], F]:
    """Mark a route handler whose request another actor of the host may also hand over as a
    value, without a request: ``fn(self, value)`` (plain or ``async``) takes what the route's
    ``parse`` would give and returns the reply's value, or an ``ak.Response``. The protocols of
    the ready classes (``actorkeep.wire``) mark theirs so; ``Host.call_op`` uses it."""

    def mark(handler: F) -> F:
        setattr(handler, _DIRECT_ATTR, (path, fn))
        return handler

    return mark


class Operation(Protocol):
    """What ``Host.call_op`` needs of a protocol's operation (``actorkeep.wire.Op``): the
    path of its ``@direct`` route, and its frame's checks."""

    @property
    def path(self) -> str:
        """The route the operation is also reached at: ``POST <path>``."""

    def checked(self, values: Mapping[str, Any], address: str) -> Any:
        """The frame the actor at ``address`` gets for ``values`` (``ValueError``)."""


def rpc(fn: F) -> F:
    """Mark an ``async def`` method as callable at ``POST /_rpc/<name>`` with a map of arguments."""
    if not _is_async(fn):
        raise TypeError(f"@rpc method {fn.__qualname__} must be async def")
    setattr(fn, _RPC_ATTR, True)
    return fn


def _direct_handler(fn: Callable[..., Any]) -> tuple[RouteHandler, bool]:
    """``fn`` as an event's handler (a coroutine function), and whether it never suspends."""
    if _is_async(fn):
        return fn, never_suspends(fn)

    async def plain(self: Any, value: Any) -> Any:
        return fn(self, value)

    return plain, True


class RpcMethod:
    """An ``@rpc`` method and the argument names it accepts, checked before it is called."""

    __slots__ = ("fn", "inline", "name", "optional", "required", "self_name", "var_kw")

    def __init__(self, name: str, fn: Callable[..., Awaitable[Any]]) -> None:
        self.name = name
        self.fn = fn
        self.inline = never_suspends(fn)
        required: set[str] = set()
        optional: set[str] = set()
        self.var_kw = False
        all_params = list(inspect.signature(fn).parameters.values())
        self.self_name = all_params[0].name if all_params else "self"
        for p in all_params[1:]:
            if p.kind is p.VAR_KEYWORD:
                self.var_kw = True
            elif p.kind in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL):
                raise TypeError(f"@rpc method {name}: arguments are passed by name only")
            elif p.default is p.empty:
                required.add(p.name)
            else:
                optional.add(p.name)
        self.required = frozenset(required)
        self.optional = frozenset(required | optional)

    def check_args(self, args: dict[str, Any]) -> None:
        """``ValueError`` unless ``args`` binds to the method's parameters."""
        keys = args.keys()
        if self.self_name in keys:
            raise ValueError(f"{self.name}: unexpected argument: {self.self_name}")
        if not self.required <= keys:
            missing = ", ".join(sorted(self.required - keys))
            raise ValueError(f"{self.name}: missing argument(s): {missing}")
        if not self.var_kw and not keys <= self.optional:
            extra = ", ".join(sorted(keys - self.optional))
            raise ValueError(f"{self.name}: unexpected argument(s): {extra}")


RouteHandler = Callable[..., Awaitable[Any]]


class RouteTable:
    """Matches ``(method, path)`` to a handler for one actor class, without an instance."""

    def __init__(self, cls: type) -> None:
        self.static: dict[tuple[str, str], RouteHandler] = {}
        self.patterns: list[tuple[str, tuple[str, ...], RouteHandler]] = []
        self.rpcs: dict[str, RpcMethod] = {}
        #: The route handlers that take WebSocket upgrades (``@websocket``).
        self.websockets: set[RouteHandler] = set()
        # Route handler -> (it never suspends, its parse function): one lookup per request.
        self.handlers: dict[RouteHandler, tuple[bool, Parser | None]] = {}
        #: Path -> (the handler that takes a value, it never suspends), of ``@direct`` routes.
        self.direct: dict[str, tuple[RouteHandler, bool]] = {}
        seen: set[str] = set()
        for klass in cls.__mro__:
            for attr, fn in vars(klass).items():
                if attr in seen:
                    continue
                seen.add(attr)
                if getattr(fn, _RPC_ATTR, False):
                    self.rpcs[attr] = RpcMethod(attr, fn)
                if getattr(fn, _ROUTES_ATTR, ()):
                    self.handlers[fn] = (never_suspends(fn), getattr(fn, _PARSE_ATTR, None))
                if getattr(fn, _WEBSOCKET_ATTR, False):
                    self.websockets.add(fn)
                marked = getattr(fn, _DIRECT_ATTR, None)
                if marked is not None:
                    self.direct[marked[0]] = _direct_handler(marked[1])
                for method, path in getattr(fn, _ROUTES_ATTR, ()):
                    segments = tuple(path.strip("/").split("/")) if path != "/" else ()
                    if any(s.startswith("{") and s.endswith("}") for s in segments):
                        self.patterns.append((method, segments, fn))
                    else:
                        self.static.setdefault((method, path), fn)

    def match(self, method: str, path: str) -> tuple[RouteHandler, dict[str, str]] | None:
        """The handler and path parameters for a request, or ``None``."""
        fn = self.static.get((method, path))
        if fn is not None:
            return fn, {}
        if not self.patterns:
            return None
        parts = path.strip("/").split("/") if path != "/" else []
        for m, segments, fn in self.patterns:
            if m != method or len(segments) != len(parts):
                continue
            params: dict[str, str] = {}
            for seg, part in zip(segments, parts, strict=True):
                if seg.startswith("{") and seg.endswith("}"):
                    if not part:
                        break
                    params[seg[1:-1]] = unquote(part)
                elif seg != part:
                    break
            else:
                return fn, params
        return None

    def rpc_for(self, method: str, path: str) -> RpcMethod | None:
        """The ``@rpc`` method addressed by ``POST /_rpc/<name>``, or ``None``."""
        if method != "POST" or not path.startswith(RPC_PREFIX):
            return None
        return self.rpcs.get(path[len(RPC_PREFIX) :])
