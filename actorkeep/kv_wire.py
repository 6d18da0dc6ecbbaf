"""The internal protocol between ``ak.kv.Client`` and ``shards.KVShard`` (SPEC §7).

``POST /actorkeep-kv/v1/<op>`` with a msgpack map; the reply is a msgpack map, or a JSON error
body (400 for a bad frame, 409 for a failed expectation with ``current_version``). The path
carries the protocol version. Every field is checked here, so client and shard agree on the rules.
"""

from __future__ import annotations

import math
from typing import Any

from . import codec

PREFIX = "/actorkeep-kv/v1/"
OPS = ("get", "put", "delete", "list")
MAX_KEY = 2048
MAX_VALUE = 1 << 20
MAX_LIMIT = 1000
MAX_TTL = 100 * 365 * 86400  # seconds: expiry must fit SQLite's 64-bit milliseconds

#: ``expect`` on the wire: missing or nil = any, 0 = absent, n >= 1 = that version.
WIRE_ANY = None
WIRE_ABSENT = 0


def check_key(key: object, what: str = "key") -> bytes:
    if isinstance(key, str):
        key = key.encode()
    if not isinstance(key, bytes):
        raise ValueError(f"{what} must be bytes or str, not {type(key).__name__}")
    if len(key) > MAX_KEY:
        raise ValueError(f"{what} is {len(key)} bytes; the limit is {MAX_KEY}")
    return key


def check_value(value: object) -> bytes:
    if not isinstance(value, bytes):
        raise ValueError(f"value must be bytes, not {type(value).__name__}")
    if len(value) > MAX_VALUE:
        raise ValueError(f"value is {len(value)} bytes; the limit is {MAX_VALUE}")
    return value


def check_ttl(ttl: object) -> float | None:
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not math.isfinite(ttl):
        raise ValueError(f"ttl must be a finite number of seconds or None, not {ttl!r}")
    if not 0 < ttl <= MAX_TTL:
        raise ValueError(f"ttl must be more than 0 and at most {MAX_TTL} seconds, not {ttl!r}")
    return float(ttl)


def check_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be an int from 1 to {MAX_LIMIT}, not {limit!r}")
    return limit


def check_wire_expect(expect: object) -> int | None:
    if expect is None:
        return None
    if isinstance(expect, bool) or not isinstance(expect, int) or expect < 0:
        raise ValueError(f"expect must be nil, 0 (absent) or a version >= 1, not {expect!r}")
    return expect


_FIELDS = {
    "get": frozenset({"k"}),
    "put": frozenset({"k", "v", "x", "t", "l"}),
    "delete": frozenset({"k", "x"}),
    "list": frozenset({"p", "a", "n"}),
}


def _bool(frame: dict[str, Any], name: str) -> bool:
    value = frame.get(name, False)
    if not isinstance(value, bool):
        raise ValueError(f"{name!r} must be a bool")
    return value


def decode_frame(op: str, body: bytes) -> dict[str, Any]:
    """Decode and check a request frame; ``ValueError`` describes what is wrong."""
    if op not in OPS:
        raise ValueError(f"unknown kv operation {op!r}")
    try:
        frame = codec.unpack(body)
    except Exception as exc:
        raise ValueError(f"kv frame is not msgpack: {exc}") from None
    if not isinstance(frame, dict):
        raise ValueError("kv frame must be a map")
    unknown = frame.keys() - _FIELDS[op]
    if unknown:
        raise ValueError(f"unknown field(s) in kv {op} frame: {sorted(map(str, unknown))}")
    out: dict[str, Any] = {}
    if op == "list":
        out["p"] = check_key(frame.get("p", b""), "prefix")
        after = frame.get("a")
        out["a"] = None if after is None else check_key(after, "after")
        out["n"] = check_limit(frame.get("n", 100))
        return out
    if "k" not in frame:
        raise ValueError(f"kv {op} frame has no key")
    out["k"] = check_key(frame["k"])
    if op in ("put", "delete"):
        out["x"] = check_wire_expect(frame.get("x"))
    if op == "put":
        if "v" not in frame:
            raise ValueError("kv put frame has no value")
        out["v"] = check_value(frame["v"])
        out["t"] = check_ttl(frame.get("t"))
        out["l"] = _bool(frame, "l")
    return out
