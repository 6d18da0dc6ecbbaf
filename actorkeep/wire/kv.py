"""The protocol between ``ak.kv.Client`` and ``shards.KVShard``: its limits, checks and frames.

``POST /actorkeep-kv/v2/<op>``. A failed expectation is a 409 JSON body with
``current_version``; a bad frame a 400.
"""

from __future__ import annotations

import math
from typing import Any, Final

from . import REQUIRED, Protocol

MAX_KEY: Final = 2048
MAX_VALUE: Final = 1 << 20
MAX_LIMIT: Final = 1000
MAX_TTL: Final = 100 * 365 * 86400  # seconds: expiry must fit SQLite's 64-bit milliseconds

#: ``expect`` on the wire: nil = any, 0 = absent, n >= 1 = that version.
EXPECT_ABSENT: Final = 0


def check_key(key: object, what: str = "key") -> bytes:
    if type(key) is bytes and len(key) <= MAX_KEY:  # the common case, in two tests
        return key
    if isinstance(key, str):
        key = key.encode()
    if not isinstance(key, bytes):
        raise ValueError(f"{what} must be bytes or str, not {type(key).__name__}")
    if len(key) > MAX_KEY:
        raise ValueError(f"{what} is {len(key)} bytes; the limit is {MAX_KEY}")
    return key


def check_prefix(key: object) -> bytes:
    return check_key(key, "prefix")


def check_after(key: object) -> bytes | None:
    return None if key is None else check_key(key, "after")


def check_value(value: object) -> bytes:
    if type(value) is bytes and len(value) <= MAX_VALUE:
        return value
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


def check_expect(expect: object) -> int | None:
    if expect is None:
        return None
    if isinstance(expect, bool) or not isinstance(expect, int) or expect < 0:
        raise ValueError(f"expect must be nil, 0 (absent) or a version >= 1, not {expect!r}")
    return expect


def check_flag(value: object) -> bool:
    if value is True or value is False:
        return value
    if not isinstance(value, bool):
        raise ValueError(f"a flag must be a bool, not {type(value).__name__}")
    return value


# Replies come from the shard, the app's own code: their checks are shallow (shape, not
# every row), so that a page of a thousand entries costs no more than decoding it.


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"want an int, not {value!r}")
    return value


def _int_or_nil(value: object) -> int | None:
    return None if value is None else _int(value)


def _entry(value: object) -> list[Any] | None:
    """``[value, version, expires_at_ms]`` or nil."""
    if value is not None and not (isinstance(value, list) and len(value) == 3):
        raise ValueError("an entry is [value, version, expires_at]")
    return value


def _entries(value: object) -> list[list[Any]]:
    """``[key, value, version, expires_at_ms]`` rows, in key order."""
    if not isinstance(value, list):
        raise ValueError("entries is a list")
    return value


KV: Final = Protocol("actorkeep-kv", 2)

GET: Final = KV.op("get", {"key": (check_key, REQUIRED)}, reply={"entry": _entry})
PUT: Final = KV.op(
    "put",
    {
        "key": (check_key, REQUIRED),
        "value": (check_value, REQUIRED),
        "expect": (check_expect, None),
        "ttl": (check_ttl, None),
        "local": (check_flag, False),
    },
    reply={"version": _int, "expires_at": _int_or_nil},
)


def _no_ttl(frame: dict[str, Any], address: str) -> None:
    if frame["ttl"] is not None:
        raise ValueError("put_now takes puts without ttl")


#: A put without TTL (local or durable), whose handler never suspends: the host may run it in
#: the caller's task, and a durable one answers through the shard's output gate.
PUT_NOW: Final = KV.op("put_now", PUT.fields, reply=PUT.reply_fields, validate=_no_ttl)
DELETE: Final = KV.op(
    "delete",
    {"key": (check_key, REQUIRED), "expect": (check_expect, None)},
    reply={"deleted": check_flag},
)
LIST: Final = KV.op(
    "list",
    {
        "prefix": (check_prefix, b""),
        "after": (check_after, None),
        "limit": (check_limit, 100),
    },
    reply={"entries": _entries, "more": check_flag},
)
