"""Counting the msgpack work a piece of code does."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from actorkeep import codec


@contextlib.contextmanager
def counted_msgpack() -> Iterator[dict[str, int]]:
    """``codec.pack`` and ``codec.unpack`` counted while the block runs: ``{"pack": n,
    "unpack": m}``, filled in as they are called."""
    counts = {"pack": 0, "unpack": 0}
    real_pack, real_unpack = codec.pack, codec.unpack

    def pack(value: Any) -> bytes:
        counts["pack"] += 1
        return real_pack(value)

    def unpack(data: bytes) -> Any:
        counts["unpack"] += 1
        return real_unpack(data)

    codec.pack, codec.unpack = pack, unpack
    try:
        yield counts
    finally:
        codec.pack, codec.unpack = real_pack, real_unpack
