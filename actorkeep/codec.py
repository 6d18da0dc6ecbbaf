"""Encoding of ``@rpc`` arguments and results: msgpack or JSON, chosen by Content-Type."""

from __future__ import annotations

import json
import math
from typing import Any, Literal

import msgpack

MSGPACK = "application/msgpack"
JSON = "application/json"
Encoding = Literal["msgpack", "json"]

_MSGPACK_TYPES = frozenset({MSGPACK, "application/x-msgpack", "application/vnd.msgpack"})


_EXACT: dict[str, Encoding] = {MSGPACK: "msgpack", JSON: "json"}


def encoding_of(content_type: str | None) -> Encoding:
    """The encoding a Content-Type asks for; JSON when there is none (curl-friendly)."""
    if not content_type:
        return "json"
    exact = _EXACT.get(content_type)
    if exact is not None:
        return exact
    media = content_type.partition(";")[0].strip().lower()
    if media in _MSGPACK_TYPES:
        return "msgpack"
    if media == JSON or media.endswith("+json"):
        return "json"
    raise ValueError(f"unsupported content type {content_type!r}: use {JSON} or {MSGPACK}")


def pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)  # type: ignore[no-any-return]


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False)


def encode(value: Any, encoding: Encoding) -> bytes:
    """Encode a result. ``TypeError`` if the value has no representation in that encoding."""
    if encoding == "msgpack":
        return pack(value)
    try:
        return json_dumps(value)
    except ValueError as exc:  # NaN/inf are refused: JSON has no such numbers
        raise TypeError(str(exc)) from None


def json_dumps(value: Any) -> bytes:
    """Compact strict JSON; ``ValueError`` for NaN and infinities (JSON has no such numbers)."""
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number out of range: {text}")
    return value


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def json_loads(body: bytes | str) -> Any:
    """Strict JSON: NaN, Infinity and numbers that overflow a float are refused."""
    return json.loads(body, parse_constant=_no_constant, parse_float=_finite)


def decode_args(body: bytes, encoding: Encoding) -> dict[str, Any]:
    """Decode an argument map; an empty body means no arguments. ``ValueError`` if malformed."""
    if not body:
        return {}
    try:
        args = unpack(body) if encoding == "msgpack" else json_loads(body)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise ValueError(f"body is not valid {encoding}: {exc}") from None
    if not isinstance(args, dict) or not all(isinstance(k, str) for k in args):
        raise ValueError("arguments must be a map with string keys")
    return args


def decode_result(body: bytes, encoding: Encoding) -> Any:
    """Decode a result; ``ValueError`` if malformed."""
    try:
        return unpack(body) if encoding == "msgpack" else json_loads(body)
    except Exception as exc:
        raise ValueError(f"reply is not valid {encoding}: {exc}") from None
