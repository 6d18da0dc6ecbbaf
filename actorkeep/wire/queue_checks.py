"""The limits of the queue protocol and the checks of its fields (``actorkeep.wire.queue``)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, Final

from ..address import split_address

# -- limits ------------------------------------------------------------------------------------

MAX_BATCH: Final = 1_000  # messages per send_batch, leases per lease(), outcomes per settle()
MAX_BODY: Final = 1 << 20  # bytes per message body
MAX_BATCH_BYTES: Final = 16 << 20  # bytes of bodies per send_batch
MAX_SECONDS: Final = 1e9  # longest delay, visibility, backoff or retention (about 31 years)
MAX_ERROR: Final = 4096  # characters of a recorded error
MIN_PRIORITY: Final = -(2**31)
MAX_PRIORITY: Final = 2**31 - 1
MAX_ID: Final = 2**63 - 1
MAX_ATTEMPTS: Final = 1_000_000
#: The shortest visibility or backoff: shorter spans vanish in ``now + span`` (a subnormal
#: visibility would make a lease visible again at once).
MIN_SPAN: Final = 0.001
#: the highest ``Config.rate``, messages per second
MAX_RATE: Final = 1e6
#: characters of a message's key or group, and of a worker's name
MAX_NAME: Final = 200

# -- field checks ------------------------------------------------------------------------------


def is_number(v: object) -> bool:
    return (type(v) is int or type(v) is float) and math.isfinite(v)


def check_int(v: object, name: str, lo: int, hi: int) -> int:
    if type(v) is not int:
        raise ValueError(f"{name} must be an int, not {type(v).__name__}")
    if not lo <= v <= hi:
        raise ValueError(f"{name} must be in {lo}..{hi}, not {v}")
    return v


def check_id(v: object, name: str = "id") -> int:
    return check_int(v, name, 1, MAX_ID)


def check_attempt(v: object) -> int:
    return check_int(v, "attempt", 1, MAX_ID)


def check_seconds(v: object, name: str) -> float:
    """A finite number of seconds in 0..MAX_SECONDS."""
    if not is_number(v):
        raise ValueError(f"{name} must be a finite number of seconds, not {v!r}")
    assert isinstance(v, int | float)
    if not 0 <= v <= MAX_SECONDS:
        raise ValueError(f"{name} must be in 0..{MAX_SECONDS:g} seconds, not {v!r}")
    return float(v)


def check_positive_seconds(v: object, name: str) -> float:
    s = check_seconds(v, name)
    if s < MIN_SPAN:
        raise ValueError(f"{name} must be at least {MIN_SPAN} seconds, not {v!r}")
    return s


def check_priority(v: object) -> int:
    return check_int(v, "priority", MIN_PRIORITY, MAX_PRIORITY)


def check_str(v: object, name: str, limit: int) -> str:
    if not isinstance(v, str):
        raise ValueError(f"{name} must be a str, not {type(v).__name__}")
    if len(v) > limit:
        raise ValueError(f"{name} is longer than {limit} characters")
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{name} is not encodable as UTF-8") from None
    return v


def check_error(v: object) -> str | None:
    return None if v is None else check_str(v, "error", MAX_ERROR)


def check_body(v: object, name: str = "body") -> bytes:
    if not isinstance(v, bytes | bytearray):
        raise ValueError(f"{name} must be bytes, not {type(v).__name__}")
    if len(v) > MAX_BODY:
        raise ValueError(f"{name} is over {MAX_BODY} bytes")
    return bytes(v)


def check_bodies(v: object) -> list[bytes]:
    if isinstance(v, bytes | bytearray | str) or not isinstance(v, Sequence):
        raise ValueError(f"bodies must be a list of bytes, not {type(v).__name__}")
    if not 1 <= len(v) <= MAX_BATCH:
        raise ValueError(f"a batch holds 1..{MAX_BATCH} messages, not {len(v)}")
    bodies = [check_body(b, "each body") for b in v]
    if sum(map(len, bodies)) > MAX_BATCH_BYTES:
        raise ValueError(f"a batch holds at most {MAX_BATCH_BYTES} bytes of bodies")
    return bodies


def check_list(v: object, name: str, lo: int, hi: int) -> list[Any]:
    if not isinstance(v, list):
        raise ValueError(f"{name} must be a list, not {type(v).__name__}")
    if not lo <= len(v) <= hi:
        raise ValueError(f"{name} holds {lo}..{hi} items, not {len(v)}")
    return v


def check_map(
    v: object, name: str, allowed: Iterable[str], required: Iterable[str] = ()
) -> dict[str, Any]:
    """A map with string keys, only ``allowed`` ones, all ``required`` ones present."""
    if not isinstance(v, dict):
        raise ValueError(f"{name} must be a map, not {type(v).__name__}")
    allowed = frozenset(allowed)
    extra = [k for k in v if k not in allowed]
    if extra:
        raise ValueError(f"{name}: unexpected field(s): {', '.join(sorted(map(repr, extra)))}")
    missing = [k for k in required if k not in v]
    if missing:
        raise ValueError(f"{name}: missing field(s): {', '.join(missing)}")
    return v


def check_ids(v: object) -> list[int]:
    return [check_id(i, "each id") for i in check_list(v, "ids", 1, MAX_BATCH)]


def check_queue_address(v: object) -> str:
    address = check_str(v, "queue", 300)
    split_address(address)
    return address


def check_message_key(v: object, name: str) -> str | None:
    """A message's key or group: None, or a str of 1..MAX_NAME characters."""
    if v is None:
        return None
    if type(v) is str and 0 < len(v) <= MAX_NAME and v.isascii():  # the common case, at once
        return v
    if not check_str(v, name, MAX_NAME):
        raise ValueError(f"{name} must not be empty")
    return v  # type: ignore[return-value]
