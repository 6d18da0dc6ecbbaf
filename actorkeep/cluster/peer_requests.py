"""What a request and a reply between the hosts of a cluster carry (``peers.py`` sends and
answers them): each kind of request checked and run on the owner, and errors with their kind.

A request is ``[id, "rpc", caller, chain, address, method, args, timeout]``, ``[id, "op",
caller, chain, address, path, values, timeout]`` (an operation of a ready class's protocol, its
frame as a value: decision 0028) or ``[id, "http", class, name, method, path, query, headers,
body, caller, chain, timeout]``; its reply is ``[id, 0, result]`` (an rpc's value; for an
operation ``[value]`` if the handler returned its reply map, else ``[status, headers, body]``
as for ``http``) or ``[id, 1, [kind, status, error, message, retry_after]]``.

A host from before ``op`` answers it 400 ``UNKNOWN_REQUEST``, having run nothing; the caller
then sends that host's operations as ``http`` requests to their routes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Protocol

from .. import codec
from ..address import split_address
from ..errors import (
    CallTimeout,
    HostClosed,
    OutcomeUnknown,
    Overloaded,
    RemoteError,
    error_for_status,
)
from ..http import Headers, Request, Response, ValueReply, call_headers
from ..routing import Operation
from ..wire import MSGPACK_HEADERS, operation_at
from .peerwire import PeerRefused

#: What a host answers a request of a kind it does not know (one from a newer host).
UNKNOWN_REQUEST = "not a request this host knows"


class Elsewhere(Overloaded):
    """This host does not own the actor's partition (any more): nothing of the event ran, and
    the caller may send it to the owner."""

    def __init__(self, address: str) -> None:
        super().__init__(f"{address} is not served by this host now", retry_after=1.0)


def outcome_unknown(address: str) -> OutcomeUnknown:
    """The connection to the owner was lost after the event was sent, or the owner stopped
    with it: it may have run."""
    return OutcomeUnknown(f"lost the host serving {address}; the call may have run")


class Local(Protocol):
    """What a host runs for its peers: the events of the actors it owns (``Elsewhere`` for
    the others, before anything of the event runs)."""

    async def deliver_local(
        self,
        class_name: str,
        name: str,
        request: Request,
        chain: tuple[str, ...],
        timeout: float | None,
    ) -> Response: ...

    async def call_rpc_local(
        self,
        caller: str,
        chain: tuple[str, ...],
        address: str,
        method: str,
        args: dict[str, Any],
        timeout: float | None,
    ) -> Any: ...

    async def call_op_local(
        self,
        caller: str,
        chain: tuple[str, ...],
        address: str,
        op: Operation,
        values: Mapping[str, Any],
        timeout: float | None,
    ) -> Response: ...


# -- what goes on the wire ----------------------------------------------------------------------
def error_of(exc: BaseException) -> list[Any]:
    if isinstance(exc, Elsewhere):
        return ["elsewhere", 503, "Overloaded", exc.message, exc.retry_after]
    if isinstance(exc, RemoteError):
        retry_after = getattr(exc, "retry_after", None)
        return ["remote", exc.status, exc.error, exc.message, retry_after]
    if isinstance(exc, OutcomeUnknown):
        return ["unknown", 503, "OutcomeUnknown", exc.message, exc.retry_after]
    if isinstance(exc, CallTimeout):
        return ["timeout", 504, "CallTimeout", str(exc), None]
    if isinstance(exc, HostClosed):
        return ["closed", 503, "HostClosed", str(exc), None]
    return ["remote", 500, "InternalError", "the owner host failed the call", None]


def raise_error(error: Any, address: str) -> None:
    if type(error) is not list or len(error) != 5:
        raise PeerRefused("an error reply of the wrong shape")
    kind, status, name, message, retry_after = error
    if type(status) is not int or type(name) is not str or type(message) is not str:
        raise PeerRefused("an error reply of the wrong shape")
    if kind == "elsewhere":
        raise Elsewhere(address)
    if kind == "timeout":
        raise CallTimeout(message)
    if kind == "unknown":
        raise OutcomeUnknown(message)
    if kind == "closed":
        # The owner is stopping: the event may have run (cancelled halfway, or its reply
        # abandoned), so it is not tried again.
        raise outcome_unknown(address)
    exc = error_for_status(status, name, message)
    if isinstance(exc, Overloaded) and isinstance(retry_after, int | float):
        exc.retry_after = float(retry_after)
    raise exc


def _timeout(value: Any) -> float | None:
    if value is None:
        return None
    if type(value) not in (int, float) or not (0 < value < math.inf):
        raise ValueError(f"bad timeout {value!r}")
    return float(value)


def _strings(value: Any, what: str) -> tuple[str, ...]:
    if type(value) is not list or not all(type(x) is str for x in value):
        raise ValueError(f"{what} must be a list of strings")
    return tuple(value)


def _string_map(value: Any, what: str) -> dict[str, str]:
    if type(value) is not dict or not all(
        type(k) is str and type(v) is str for k, v in value.items()
    ):
        raise ValueError(f"{what} must map strings to strings")
    return value


def _text(value: Any, what: str) -> str:
    if type(value) is not str:
        raise ValueError(f"{what} must be a string")
    return value


async def run_request(local: Local, msg: list[Any]) -> Any:
    """Check a peer's request and run it on ``local``; the reply's result."""
    op = msg[1] if len(msg) > 1 else None
    if op == "rpc" and len(msg) == 8:
        _, _, caller, chain, address, method, args, timeout = msg
        if type(args) is not dict:
            raise ValueError("args must be a map")
        split_address(_text(address, "address"))
        return await local.call_rpc_local(
            _text(caller, "caller"),
            _strings(chain, "chain"),
            address,
            _text(method, "method"),
            args,
            _timeout(timeout),
        )
    if op == "op" and len(msg) == 8:
        _, _, caller, chain, address, path, values, timeout = msg
        if type(values) is not dict:
            raise ValueError("values must be a map")
        split_address(_text(address, "address"))
        caller, chained = _text(caller, "caller"), _strings(chain, "chain")
        operation, timeout = operation_at(_text(path, "path")), _timeout(timeout)
        if operation is None:  # not one this host declares: its route says what it is
            class_name, name = split_address(address)
            request = op_request(caller, path, values)
            resp = await local.deliver_local(class_name, name, request, chained, timeout)
        else:
            resp = await local.call_op_local(caller, chained, address, operation, values, timeout)
        if type(resp) is ValueReply:
            return [resp.value]
        return [resp.status, dict(resp.headers.items()), bytes(resp.body)]
    if op == "http" and len(msg) == 12:
        _, _, class_name, name, method, path, query, headers, body, caller, chain, timeout = msg
        if type(body) is not bytes:
            raise ValueError("body must be bytes")
        if caller is not None:
            _text(caller, "caller")
        split_address(f"{_text(class_name, 'class')}/{_text(name, 'name')}")
        request = Request(
            _text(method, "method"),
            _text(path, "path"),
            _string_map(query, "query"),
            Headers(_string_map(headers, "headers")),
            body,
            caller,
        )
        resp = await local.deliver_local(
            class_name, name, request, _strings(chain, "chain"), _timeout(timeout)
        )
        return [resp.status, dict(resp.headers.items()), bytes(resp.body)]
    raise ValueError(UNKNOWN_REQUEST)


def op_request(caller: str, path: str, values: Mapping[str, Any]) -> Request:
    """An operation as an outside request to its route would carry it."""
    headers = call_headers(caller, MSGPACK_HEADERS)
    return Request("POST", path, {}, headers, codec.pack(values), caller)


def response_of(result: Any) -> Response:
    if type(result) is not list or len(result) != 3:
        raise PeerRefused("a reply of the wrong shape")
    status, headers, body = result
    if type(status) is not int or type(headers) is not dict or type(body) is not bytes:
        raise PeerRefused("a reply of the wrong shape")
    return Response(status, headers, body)
