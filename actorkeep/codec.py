"""Encoding of ``@rpc`` arguments and results: msgpack or JSON, chosen by Content-Type."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable
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


#: Values (scalars and containers) one body may decode to. A decoded value costs tens of bytes
#: whatever its size on the wire (an empty map is one byte of msgpack and 64 of Python), so the
#: count, not the body's length, bounds the memory a decoded body holds.
MAX_VALUES = 131_072
#: Bytes of memory charged per decoded value against the host's in-flight budget.
VALUE_COST = 64


#: One packer for the process: it costs less than half of ``msgpack.packb``, which makes a new
#: packer for every value. ``Packer.pack`` holds the GIL unless packing calls back into Python
#: (the ``items()`` of a dict subclass, say); a pack started from such a callback gets a packer
#: of its own, or it would write into the buffer of the pack it interrupts.
_PACKER = msgpack.Packer(use_bin_type=True)
_pack_shared = _PACKER.pack
_packing = False


def pack(value: Any) -> bytes:
    """``value`` as msgpack (bytes as bin, str as str)."""
    global _packing
    if _packing:
        return msgpack.packb(value, use_bin_type=True)  # type: ignore[no-any-return]
    _packing = True
    try:
        return _pack_shared(value)  # type: ignore[no-any-return]
    finally:
        _packing = False


#: ``unpack(data)``: one msgpack value from the app's own code (frames and replies between
#: actors); what outside clients send is decoded with ``unpack_counted``.
unpack: Callable[[bytes], Any] = functools.partial(msgpack.unpackb, raw=False)


_COPIED_AS_IS = frozenset({float, bool, bytes, type(None)})


def copy_args(args: dict[str, Any]) -> dict[str, Any]:
    """What ``unpack(pack(args))`` gives: the callee's own copy of a call's arguments. An
    argument map of plain scalars (and ASCII names) is copied without the round trip."""
    for key, value in args.items():
        kind = type(value)
        if type(key) is not str or not key.isascii():
            break
        if kind is int:
            if not -(1 << 63) <= value < 1 << 64:  # msgpack's range: pack raises beyond
                break
        elif kind is str:
            if not value.isascii():  # may hold what UTF-8 cannot carry (lone surrogates)
                break
        elif kind not in _COPIED_AS_IS:
            break
    else:
        return dict(args)
    return unpack(pack(args))  # type: ignore[no-any-return]


#: The ints msgpack carries: pack raises beyond them.
_INT_MIN, _INT_END = -(1 << 63), 1 << 64
#: ``copy_value`` copies maps and lists this deep itself; deeper values take the round trip.
_COPY_DEPTH = 4


class _NotPlain(Exception):
    """A value ``_copied`` does not copy itself (the round trip decides)."""


def copy_value(value: Any) -> Any:
    """What ``unpack(pack(value))`` gives: a copy nobody else holds. Maps with ASCII string
    keys, lists and plain scalars (a few levels deep) are copied without the round trip."""
    try:
        return _copied(value, _COPY_DEPTH)
    except _NotPlain:
        return unpack(pack(value))


def _copied(value: Any, depth: int) -> Any:
    kind = type(value)
    if kind in _COPIED_AS_IS:
        return value
    if kind is int:
        if _INT_MIN <= value < _INT_END:
            return value
    elif kind is str:
        if value.isascii():
            return value
    elif depth and kind is dict:
        out = {}
        for key, item in value.items():
            if type(key) is not str or not key.isascii():
                raise _NotPlain
            of = type(item)  # plain scalars as they are, without a call
            out[key] = (
                item
                if of in _COPIED_AS_IS
                or (of is int and _INT_MIN <= item < _INT_END)
                or (of is str and item.isascii())
                else _copied(item, depth - 1)
            )
        return out
    elif depth and kind is list:
        return [
            item
            if (of := type(item)) in _COPIED_AS_IS
            or (of is int and _INT_MIN <= item < _INT_END)
            or (of is str and item.isascii())
            else _copied(item, depth - 1)
            for item in value
        ]
    raise _NotPlain


def unpack_counted(data: bytes, max_values: int = MAX_VALUES) -> tuple[Any, int]:
    """Decode msgpack and count its values; ``ValueError`` past ``max_values`` (checked while
    decoding, so a body of a million empty maps stops after ``max_values`` of them)."""
    count = 1

    def seen_list(items: list[Any]) -> list[Any]:
        nonlocal count
        count += len(items)
        if count > max_values:
            raise ValueError(f"more than {max_values} values")
        return items

    def seen_map(items: dict[Any, Any]) -> dict[Any, Any]:
        nonlocal count
        count += 2 * len(items)
        if count > max_values:
            raise ValueError(f"more than {max_values} values")
        return items

    value = msgpack.unpackb(
        data,
        raw=False,
        list_hook=seen_list,
        object_hook=seen_map,
        max_array_len=max_values,
        max_map_len=max_values,
    )
    return value, count


def encode(value: Any, encoding: Encoding) -> bytes:
    """Encode a result. ``TypeError`` if the value has no representation in that encoding."""
    if encoding == "msgpack":
        return pack(value)
    try:
        return json_dumps(value)
    except ValueError as exc:  # NaN/inf are refused: JSON has no such numbers
        raise TypeError(str(exc)) from None


_JSON_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def json_dumps(value: Any) -> bytes:
    """Compact strict JSON; ``ValueError`` for NaN and infinities (JSON has no such numbers)."""
    return _JSON_ENCODER.encode(value).encode()


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number out of range: {text}")
    return value


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


_JSON_DECODER = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite)


def json_loads(body: bytes | str, max_values: int = MAX_VALUES) -> Any:
    """Strict JSON: NaN, Infinity and numbers that overflow a float are refused, and so are
    bodies nested deeper than the interpreter's recursion limit or holding more than
    ``max_values`` values (``ValueError``)."""
    value, _ = json_loads_counted(body, max_values)
    return value


def json_loads_counted(body: bytes | str, max_values: int = MAX_VALUES) -> tuple[Any, int]:
    """``json_loads`` and a count of the values, as ``unpack_counted``."""
    if isinstance(body, str):
        bound = json_values_bound(body.encode())
        if body.startswith("\ufeff"):  # as json.loads does
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", body, 0)
        text = body
    else:
        bound = json_values_bound(body)
        text = body.decode(json.detect_encoding(body), "surrogatepass")  # as json.loads does
    try:
        value = _JSON_DECODER.decode(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    if bound <= max_values // 16:  # small: the bound is close enough, and cheap
        return value, bound
    count = _count_values(value, max_values)
    if count > max_values:
        raise ValueError(f"more than {max_values} values")
    return value, count


def json_values_bound(data: bytes) -> int:
    """At least as many as the values ``data`` decodes to as JSON: every value but the
    outermost follows a ``[``, ``{``, ``,`` or ``:`` (those inside strings count too)."""
    return 1 + data.count(b"[") + data.count(b"{") + data.count(b",") + data.count(b":")


def decode_cost(body: bytes, content_type: str | None) -> int:
    """The memory a handler may hold decoding ``body`` (``VALUE_COST`` a value, at most
    ``MAX_VALUES``), for a JSON or msgpack body; 0 for anything else."""
    try:
        encoding = encoding_of(content_type)
    except ValueError:
        return 0
    values = json_values_bound(body) if encoding == "json" else len(body)
    return min(values, MAX_VALUES) * VALUE_COST


def _count_values(value: Any, stop_after: int) -> int:
    count = 0
    stack = [value]
    while stack and count <= stop_after:
        item = stack.pop()
        count += 1
        if isinstance(item, dict):
            count += len(item)  # the keys
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return count


_THREE_LISTS = b"\x91\x91\x91"  # msgpack: a list of one item, three times


def decode_args_counted(body: bytes, encoding: Encoding) -> tuple[dict[str, Any], int]:
    """Decode an argument map and count its values; an empty body means no arguments.
    ``ValueError`` if malformed or past ``MAX_VALUES``."""
    if not body:
        return {}, 0
    try:
        if encoding == "msgpack":
            # Decoded as the first item of three nested lists: arguments that decode so still
            # decode as part of a call's message to another host (msgpack's decoder stops at
            # about 1,020 levels; deeper would close the hosts' connection there).
            wrapped, count = unpack_counted(_THREE_LISTS + body)
            args, count = wrapped[0][0][0], count - 3
        else:
            args, count = json_loads_counted(body)
    except msgpack.StackError:
        raise ValueError("msgpack body nested too deeply") from None
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise ValueError(f"body is not valid {encoding}: {exc}") from None
    if not isinstance(args, dict) or not all(isinstance(k, str) for k in args):
        raise ValueError("arguments must be a map with string keys")
    return args, count


def decode_args(body: bytes, encoding: Encoding) -> dict[str, Any]:
    """Decode an argument map; an empty body means no arguments. ``ValueError`` if malformed."""
    return decode_args_counted(body, encoding)[0]


def decode_result(body: bytes, encoding: Encoding) -> Any:
    """Decode a result; ``ValueError`` if malformed."""
    try:
        return unpack(body) if encoding == "msgpack" else json_loads(body)
    except Exception as exc:
        raise ValueError(f"reply is not valid {encoding}: {exc}") from None
