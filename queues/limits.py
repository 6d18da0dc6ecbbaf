"""``Config.max_in_flight`` and ``Config.rate``: how many messages a queue may lease now, and
when it may lease again (docs/queues.md).

The rate is an exact token bucket: ``bucket`` tokens at most, ``rate`` more each second, one
spent per message leased. Its state (``actorkeep_queue_bucket``) is written in the lease's own
transaction, as a gated write, so no reply or delivery carries a lease whose spending power
loss could undo: over any span of ``t`` seconds at most ``bucket + rate * t`` messages are
leased. A new configuration keeps the tokens left (at most its own ``bucket``).
"""

from __future__ import annotations

import math

from actorkeep import Sql
from actorkeep.wire.queue import Config


def limited(cfg: Config) -> bool:
    return cfg.max_in_flight is not None or cfg.rate is not None


def _tokens(sql: Sql, cfg: Config, now: float) -> float:
    assert cfg.rate is not None
    row = sql.exec("SELECT tokens, at FROM actorkeep_queue_bucket WHERE id = 0").fetchone()
    if row is None:
        return float(cfg.bucket)
    tokens, at = row
    return float(min(cfg.bucket, tokens + max(0.0, now - at) * cfg.rate))


def in_flight(sql: Sql, now: float) -> int:
    """Leases that have not run out."""
    (n,) = sql.exec(
        "SELECT COUNT(*) FROM actorkeep_queue WHERE leased = 1 AND visible_at > ?", (now,)
    ).fetchone()
    return int(n)


def allowance(sql: Sql, cfg: Config, now: float, n: int) -> int:
    """How many of ``n`` messages the limits let the queue lease now."""
    if cfg.max_in_flight is not None:
        n = min(n, max(0, cfg.max_in_flight - in_flight(sql, now)))
    if cfg.rate is not None and n > 0:
        n = min(n, math.floor(_tokens(sql, cfg, now)))
    return n


def spend(sql: Sql, cfg: Config, now: float, n: int) -> None:
    """``n`` messages were leased now (inside the lease's transaction)."""
    if cfg.rate is None:
        return
    sql.exec(
        "INSERT OR REPLACE INTO actorkeep_queue_bucket (id, tokens, at) VALUES (0, ?, ?)",
        (_tokens(sql, cfg, now) - n, now),
        durable=True,
    )


def next_allowed(sql: Sql, cfg: Config, now: float) -> float:
    """The earliest time the limits let the queue lease one more message (``now`` if they do
    now): the end of the first lease in flight, and the next whole token."""
    at = now
    if cfg.max_in_flight is not None and in_flight(sql, now) >= cfg.max_in_flight:
        (first,) = sql.exec(
            "SELECT MIN(visible_at) FROM actorkeep_queue WHERE leased = 1 AND visible_at > ?",
            (now,),
        ).fetchone()
        at = max(at, float(first))
    if cfg.rate is not None:
        tokens = _tokens(sql, cfg, now)
        if tokens < 1:
            t = now + (1 - tokens) / cfg.rate
            while tokens + (t - now) * cfg.rate < 1:  # float rounding: never a moment early
                t = math.nextafter(t, math.inf)
            at = max(at, t)
    return at


__all__ = ["allowance", "in_flight", "limited", "next_allowed", "spend"]
