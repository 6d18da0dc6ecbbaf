"""The HTTP-shaped values that handlers receive and return: Request, Response, Headers."""

from __future__ import annotations

from collections.abc import Callable, ItemsView, Iterable, Iterator, Mapping
from typing import Any, Protocol, overload
from urllib.parse import parse_qsl

from .codec import json_dumps, json_loads
from .ws import WebSocket, check_tags, encode_attachment


class Headers(Mapping[str, str]):
    """A read-only, case-insensitive header map. Repeated headers are joined with ``", "``."""

    __slots__ = ("_map",)

    def __init__(self, items: Mapping[str, str] | Iterable[tuple[str, str]] | None = None) -> None:
        self._map: dict[str, str] = {}
        if items is None:
            return
        pairs = items.items() if isinstance(items, Mapping) else items
        for key, value in pairs:
            k = key.lower()
            self._map[k] = f"{self._map[k]}, {value}" if k in self._map else value

    @classmethod
    def _from_lower(cls, mapping: dict[str, str]) -> Headers:
        h = cls.__new__(cls)
        h._map = mapping
        return h

    def __getitem__(self, key: str) -> str:
        return self._map[key.lower()]

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key.lower() in self._map

    def __iter__(self) -> Iterator[str]:
        return iter(self._map)

    def __len__(self) -> int:
        return len(self._map)

    def get(self, key: str, default: Any = None) -> Any:
        return self._map.get(key.lower(), default)

    def items(self) -> ItemsView[str, str]:
        """Lower-case names and their values (the map's own view: no copy)."""
        return self._map.items()

    def __repr__(self) -> str:
        return f"Headers({self._map!r})"


class PendingUpgrade(Protocol):
    """The upgrade a request asks for, while its accept event runs (runtime/sockets.py)."""

    def accept(self, tags: tuple[str, ...], attachment: bytes) -> WebSocket: ...

    def accepted(self, result: object, handler: Callable[..., Any]) -> Response:
        """The reply of the accept event whose handler returned ``result`` (not a
        ``Response``): ``TypeError`` unless it is the socket accepted."""


class Request:
    """What a ``@route`` handler receives.

    ``caller`` is the address of the calling actor as vouched for by the host, or ``None``
    for a request from outside. ``parsed`` is what the route's ``parse`` function returned.
    """

    __slots__ = ("body", "caller", "headers", "method", "parsed", "path", "query", "upgrade")

    def __init__(
        self,
        method: str,
        path: str,
        query: dict[str, str] | None = None,
        headers: Headers | None = None,
        body: bytes = b"",
        caller: str | None = None,
    ) -> None:
        self.method = method
        self.path = path
        self.query = query if query is not None else {}
        self.headers = headers if headers is not None else Headers()
        self.body = body
        self.caller = caller
        self.parsed: Any = None
        #: The WebSocket upgrade this request asks for (``@ak.websocket`` routes), else None.
        self.upgrade: PendingUpgrade | None = None

    def json(self) -> Any:
        """The body decoded as JSON (``ValueError`` if it is not JSON)."""
        return json_loads(self.body)

    def accept_websocket(self, *, tags: Iterable[str] = (), attachment: Any = None) -> WebSocket:
        """Accept the WebSocket this request asks for, in an ``@ak.websocket`` route: the
        socket joins ``self.websockets()`` at once; return it from the handler (return an
        ``ak.Response`` instead to refuse the upgrade). ``tags`` (at most 10) select sockets
        in ``self.websockets(tag)``; ``attachment`` is kept with the socket (see
        ``ak.WebSocket.attachment``). ``Overloaded`` if the host or the actor holds all the
        sockets it may."""
        if self.upgrade is None:
            raise RuntimeError("this request is not a WebSocket upgrade (see @ak.websocket)")
        checked = check_tags(tags)
        data = encode_attachment(attachment) if attachment is not None else b""
        return self.upgrade.accept(checked, data)

    def __repr__(self) -> str:
        return f"<Request {self.method} {self.path} caller={self.caller!r}>"


def _json_response(obj: Any, status: int = 200) -> Response:
    body = json_dumps(obj)
    return Response(status, Headers._from_lower({"content-type": "application/json"}), body)


class _JsonMember:
    """``Response.json(obj)`` builds a JSON response; ``resp.json()`` decodes one
    (docs/reference.md §2)."""

    @overload
    def __get__(self, obj: None, objtype: type[Response]) -> Callable[..., Response]: ...
    @overload
    def __get__(self, obj: Response, objtype: type[Response]) -> Callable[[], Any]: ...
    def __get__(self, obj: Response | None, objtype: type[Response]) -> Callable[..., Any]:
        if obj is None:
            return _json_response
        body = obj.body
        return lambda: json_loads(body)


class Response:
    """What a handler returns and what a call answers."""

    __slots__ = ("body", "headers", "status")
    json = _JsonMember()

    def __init__(
        self,
        status: int = 200,
        headers: Mapping[str, str] | Iterable[tuple[str, str]] | None = None,
        body: bytes = b"",
    ) -> None:
        if type(body) is not bytes and not isinstance(body, bytes | bytearray):
            raise TypeError(f"a Response body is bytes, not {type(body).__name__}")
        self.status = status
        self.headers = headers if type(headers) is Headers else Headers(headers)
        self.body = body

    def __repr__(self) -> str:
        return f"<Response {self.status} {len(self.body)} bytes>"


class ValueReply(Response):
    """A 200 that carries the handler's reply as a Python value, with no body: what a call of
    a protocol's operation answers (``Host.call_op``) when the handler returned its reply map.
    It is never an outside client's reply; the caller takes a copy of ``value`` (from another
    host of a cluster, the value came over the internal port)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.status = 200
        self.headers = _NO_HEADERS
        self.body = b""
        self.value = value


_NO_HEADERS = Headers()


#: The header that names the calling actor. The host sets it on every call between actors and
#: strips every ``x-actorkeep-*`` header from outside requests, so no one can forge it.
CALLER_HEADER = "x-actorkeep-caller"
RESERVED_HEADER_PREFIX = "x-actorkeep-"


#: ``(caller, id(headers)) -> (headers, the call's headers)`` for the shared, read-only
#: ``Headers`` objects SDK clients pass on every call (``headers`` is kept to pin its id).
_CALL_HEADERS: dict[tuple[str, int], tuple[Headers, Headers]] = {}
_CALL_HEADERS_MAX = 4096


def call_headers(caller: str, headers: Mapping[str, str] | None) -> Headers:
    """The headers of a call from ``caller``: what it passed, without reserved ones, and the
    caller header."""
    if type(headers) is Headers:
        cached = _CALL_HEADERS.get((caller, id(headers)))
        if cached is not None and cached[0] is headers:
            return cached[1]
        made = _call_headers(caller, headers)
        if len(_CALL_HEADERS) >= _CALL_HEADERS_MAX:
            _CALL_HEADERS.clear()
        _CALL_HEADERS[caller, id(headers)] = (headers, made)
        return made
    return _call_headers(caller, headers)


def _call_headers(caller: str, headers: Mapping[str, str] | None) -> Headers:
    if type(headers) is Headers:  # lower case already: copy unless it holds reserved names
        hdrs = headers._map.copy()
        for k in headers._map:
            if k.startswith(RESERVED_HEADER_PREFIX):
                del hdrs[k]
    else:
        hdrs = {}
        if headers:
            for key, value in headers.items():
                k = key.lower()
                if not k.startswith(RESERVED_HEADER_PREFIX):
                    hdrs[k] = value
    hdrs[CALLER_HEADER] = caller
    return Headers._from_lower(hdrs)


def parse_query(query_string: str) -> dict[str, str]:
    """``a=1&b=2`` -> ``{"a": "1", "b": "2"}``; the first value of a repeated key wins."""
    if not query_string:
        return {}
    query: dict[str, str] = {}
    for key, value in parse_qsl(query_string, keep_blank_values=True):
        query.setdefault(key, value)
    return query


def error_response(
    status: int, error: str, message: str, headers: dict[str, str] | None = None
) -> Response:
    """The JSON error body of docs/reference.md §2: ``{"error": ..., "message": ...}``."""
    resp = _json_response({"error": error, "message": message}, status)
    if headers:
        resp.headers._map.update({k.lower(): v for k, v in headers.items()})
    return resp
