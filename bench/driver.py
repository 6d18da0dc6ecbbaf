"""What the benchmarks share: their caller (an ``@rpc`` call into a host from ``bench/driver``,
an address with no class, which the host vouches for like any caller) and their spreads."""

from __future__ import annotations

import statistics
from typing import Any

import actorkeep as ak
from actorkeep import codec

DRIVER = "bench/driver"


async def call(host: ak.Host, address: str, method: str, **args: Any) -> Any:
    """``address``'s ``@rpc`` method ``method`` with ``args``; its result (msgpack both ways)."""
    resp = await host.call(
        DRIVER,
        (DRIVER,),
        address,
        "POST",
        f"/_rpc/{method}",
        codec.pack(args),
        {"content-type": codec.MSGPACK},
        None,
    )
    if resp.status != 200:
        raise RuntimeError(f"{address} {method} failed: {resp.status} {resp.body[:300]!r}")
    return codec.decode_result(resp.body, "msgpack")


def spread(values: list[float], digits: int = 1) -> str:
    """min, median and max of ``values``, for the benchmarks' lines."""
    lo, mid, hi = min(values), statistics.median(values), max(values)
    return f"min {lo:,.{digits}f} median {mid:,.{digits}f} max {hi:,.{digits}f}"
