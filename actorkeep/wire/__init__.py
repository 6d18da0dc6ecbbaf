"""The protocols between the SDK clients and their ready actor classes: one schema per frame.

A protocol (``Protocol("actorkeep-kv", 2)``) is a set of operations, each reached at
``POST /<name>/v<version>/<op>`` with a msgpack map and answered with a msgpack map (or a JSON
error body). An ``Op`` declares the fields of its frame once, each with the function that
checks it, and the fields of its reply. Both sides use the one declaration:

- the client builds a frame with ``op.frame(...)``, which refuses (``ValueError``) before any
  call exactly what the actor would refuse on the wire, and reads the reply with ``op.reply``;
- the actor class marks one method per operation with ``@op.handler``: the frame is checked
  before the actor is created or woken (a refused frame never creates a file), and the
  method gets the checked frame and returns the reply map (or an ``ak.Response``). A method
  written as a plain ``def`` never suspends, so the host may run it in its caller's task.

Every field of a frame may be omitted if it has a default; a field the schema does not know
is refused. ``docs/reference.md`` lists both protocols.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, TypeVar

from .. import codec
from ..errors import error_for_status
from ..http import Headers, Request, Response, ValueReply
from ..routing import direct, route

__all__ = [
    "MSGPACK_HEADERS",
    "REQUIRED",
    "Op",
    "Protocol",
    "decode",
    "error_of",
    "operation_at",
    "reply_response",
]

#: The headers of a frame or a reply (shared: ``Headers`` are read-only).
MSGPACK_HEADERS: Final = Headers({"content-type": codec.MSGPACK})


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


#: The default of a field that must be present.
REQUIRED: Final = _Required()
_ABSENT: Final = object()

Check = Callable[[Any], Any]
S = TypeVar("S")
Handler = Callable[[S, dict[str, Any]], Any]


class Protocol:
    """A named, versioned set of operations."""

    def __init__(self, name: str, version: int) -> None:
        self.name = name
        self.version = version
        self.prefix = f"/{name}/v{version}/"
        self.ops: dict[str, Op] = {}

    def op(
        self,
        name: str,
        fields: Mapping[str, tuple[Check, Any]],
        reply: Mapping[str, Check] | None = None,
        validate: Callable[[dict[str, Any], str], None] | None = None,
        exact_reply: bool = False,
    ) -> Op:
        """Declare an operation: ``fields`` maps each field to ``(check, default)``
        (``REQUIRED`` for none); ``reply`` maps each reply field to its check (``exact_reply``:
        a reply with any other field is malformed); ``validate`` checks the whole frame on the
        actor's side, given the actor's address."""
        if name in self.ops:
            raise ValueError(f"{self.name} already has an operation {name!r}")
        op = Op(self, name, fields, reply or {}, validate, exact_reply)
        self.ops[name] = op
        _AT_PATH.setdefault(op.path, op)
        return op


#: Every operation declared in this process, by path: the first declared of a path.
_AT_PATH: dict[str, Op] = {}


def operation_at(path: str) -> Op | None:
    """The operation at ``path`` (``/<protocol>/v<version>/<op>``), if one was declared in
    this process: how a cluster host reads an operation another host names."""
    return _AT_PATH.get(path)


class Op:
    """One operation of a protocol: its path, its frame's fields and its reply's."""

    def __init__(
        self,
        protocol: Protocol,
        name: str,
        fields: Mapping[str, tuple[Check, Any]],
        reply: Mapping[str, Check],
        validate: Callable[[dict[str, Any], str], None] | None,
        exact_reply: bool = False,
    ) -> None:
        self.protocol = protocol
        self.exact_reply = exact_reply
        self.name = name
        self.path = protocol.prefix + name
        self.fields = dict(fields)
        self.reply_fields = dict(reply)
        self._validate = validate
        self._checks = [(key, check, default) for key, (check, default) in self.fields.items()]
        self._reply_checks = list(self.reply_fields.items())

    def __repr__(self) -> str:
        return f"<Op {self.path}>"

    # -- the client's side ------------------------------------------------------------------
    def frame(self, **values: Any) -> bytes:
        """The frame of a call: every field checked (``ValueError``), then packed as given
        (the actor checks them again, the same way)."""
        self.check(values)
        return codec.pack(values)

    def pack(self, **values: Any) -> bytes:
        """The frame of values the caller has already checked with this operation's own
        field checks: packed as given, without checking them again."""
        return codec.pack(values)

    def result(self, resp: Response) -> dict[str, Any]:
        """The reply map of a 2xx ``resp`` (a ``ValueReply`` from an actor of the same host:
        a copy of its value); for an error status, the ``ak.RemoteError`` subclass it means is
        raised."""
        if type(resp) is ValueReply:
            return self.checked_reply(codec.copy_value(resp.value))
        if not 200 <= resp.status < 300:
            raise error_of(resp)
        return self.reply(resp.body)

    def reply(self, body: bytes) -> dict[str, Any]:
        """A reply map, its fields checked (``ValueError`` if the actor answered nonsense)."""
        try:
            value = codec.unpack(body)
        except Exception as exc:  # msgpack raises several unrelated types for bad input
            bad = type(exc).__name__
            raise ValueError(f"{self.name} reply is not valid msgpack: {bad}") from None
        return self.checked_reply(value)

    def checked_reply(self, value: Any) -> dict[str, Any]:
        """A reply value (the caller's own), its fields checked (``ValueError``)."""
        if not isinstance(value, dict):
            raise ValueError(f"{self.protocol.name} answered {self.name} with a malformed reply")
        try:
            if self.exact_reply and len(value) != len(self._reply_checks):
                raise KeyError  # a field this operation does not answer with
            for key, check in self._reply_checks:
                value[key] = check(value[key])
        except KeyError:
            raise ValueError(
                f"{self.protocol.name} answered {self.name} with a malformed reply"
            ) from None
        return value

    # -- the actor's side -------------------------------------------------------------------
    def check(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """``values`` as the schema has them: unknown fields refused, each checked, defaults
        filled in (``ValueError`` names what is wrong)."""
        out: dict[str, Any] = {}
        found = 0
        for key, check, default in self._checks:
            value = values.get(key, _ABSENT)
            if value is not _ABSENT:
                out[key] = check(value)
                found += 1
            elif default is REQUIRED:
                raise ValueError(f"{self.name}: missing field: {key}")
            else:
                out[key] = default
        if found != len(values):
            unknown = [k for k in values if k not in self.fields]
            raise ValueError(
                f"{self.name}: unexpected field(s): {', '.join(sorted(map(repr, unknown)))}"
            )
        return out

    def checked(self, values: Mapping[str, Any], address: str) -> dict[str, Any]:
        """The frame of ``values`` (the caller's, already a copy of its own) as the actor at
        ``address`` gets it: what ``decode`` does after the msgpack (``ValueError``)."""
        frame = self.check(values)
        if self._validate is not None:
            self._validate(frame, address)
        return frame

    def decode(self, body: bytes, address: str = "") -> dict[str, Any]:
        """The checked frame in ``body``, as the actor at ``address`` gets it (``ValueError``
        says what is wrong)."""
        try:
            value = codec.unpack(body)
        except Exception as exc:  # msgpack raises several unrelated types for bad input
            bad = type(exc).__name__
            raise ValueError(f"{self.name} frame is not valid msgpack: {bad}") from None
        if type(value) is not dict:
            raise ValueError(f"{self.name}: the frame must be a map")
        return self.checked(value, address)

    def parse(self, address: str, req: Request) -> dict[str, Any]:
        """A route's ``parse``: the checked frame of ``req`` (``ValueError`` answers 400 before
        the actor is created or woken)."""
        return self.decode(req.body, address)

    def handler(self, fn: Handler[S]) -> Callable[[S, Request], Awaitable[Response]]:
        """Make ``fn(self, frame) -> reply`` the actor's route for this operation. A plain
        ``def`` gives a route that never suspends (the host may run it inline)."""
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def awaiting(self: S, req: Request) -> Response:
                reply = await fn(self, req.parsed)
                if type(reply) is dict:
                    return Response(200, MSGPACK_HEADERS, codec.pack(reply))
                return reply_response(reply)

            wrapped = awaiting
        else:

            @functools.wraps(fn)
            async def plain(self: S, req: Request) -> Response:
                reply = fn(self, req.parsed)
                if type(reply) is dict:  # reply_response, inlined: it runs on every call
                    return Response(200, MSGPACK_HEADERS, codec.pack(reply))
                return reply_response(reply)

            wrapped = plain
        return route("POST", self.path, parse=self.parse)(direct(self.path, fn)(wrapped))


def decode(body: bytes, what: str) -> Any:
    """One msgpack value; ``ValueError`` if the body is not that."""
    try:
        return codec.unpack(body)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise ValueError(f"{what} is not valid msgpack: {type(exc).__name__}") from None


def error_of(resp: Response) -> Exception:
    """The exception an error reply means (its JSON body's error and message)."""
    try:
        err = resp.json()
        error, message = str(err["error"]), str(err["message"])
    except Exception:  # not our JSON error body: say what came back
        error, message = "RemoteError", resp.body[:200].decode("utf-8", "replace")
    return error_for_status(resp.status, error, message)


def reply_response(reply: Mapping[str, Any] | Response) -> Response:
    """A handler's reply map as a msgpack response (an ``ak.Response`` as it is)."""
    if isinstance(reply, Response):
        return reply
    return Response(200, MSGPACK_HEADERS, codec.pack(reply))
