"""``ServerLimits``: what the HTTP server allows a client (decision 0010)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """What the server allows a client; every field is validated on creation."""

    #: Open connections, at most. Keep it below the open-file limit minus what actors use.
    max_connections: int = 1024
    #: Seconds an idle keep-alive connection is kept.
    keep_alive_timeout: float = 5.0
    #: Requests served on one connection before it is closed (the client reconnects).
    keep_alive_requests: int = 1000
    #: Seconds from a connection's start (or its first byte after keep-alive) to a whole
    #: request head.
    header_timeout: float = 10.0
    #: Bytes of request line and headers, at most (431 beyond).
    max_header_bytes: int = 16 * 1024
    #: A body, and a reply being written, get this many seconds plus one second per
    #: ``min_rate`` bytes: a client slower than that on average is cut off (408 for a body).
    transfer_grace: float = 10.0
    min_rate: float = 4096.0
    #: Seconds that requests already running get to finish at shutdown.
    graceful_timeout: float = 5.0

    def __post_init__(self) -> None:
        for name in ("keep_alive_timeout", "header_timeout", "transfer_grace", "min_rate"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive number of seconds, not {value!r}")
        if not (isinstance(self.graceful_timeout, int | float) and self.graceful_timeout >= 0):
            raise ValueError("graceful_timeout must be a number of seconds >= 0")
        for name in ("max_connections", "keep_alive_requests", "max_header_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")
