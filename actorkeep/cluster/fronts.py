"""Where each cluster host's front is, so that a host holding a client's WebSocket can relay
it to the host that owns the actor (front/relay.py). Each host records its front's URL in the
store when it starts; the others look an owner up by its internal address, keeping what they
read for ``KEEP_FOR`` seconds (a failover sends every client back at once)."""

from __future__ import annotations

import urllib.parse

import structlog
import trio

from .connections import connect

log = structlog.get_logger("actorkeep")

KEEP_FOR = 5.0
_LOOKUPS = trio.CapacityLimiter(4)


class Fronts:
    """The fronts of the cluster whose store is at ``conninfo``, as host ``host_id`` (whose
    internal address is ``advertise``) sees them."""

    def __init__(self, conninfo: str, host_id: str, advertise: str) -> None:
        self.conninfo = conninfo
        self.host_id = host_id
        self.advertise = advertise
        self._seen: dict[str, tuple[float, str | None]] = {}

    def url_for(self, bound: str, port: int) -> str:
        """The ``ws://`` URL of a front bound to ``bound:port``: a wildcard bind is reached
        at the host of the advertised internal address."""
        if bound in ("0.0.0.0", "::", ""):
            bound = self.advertise.rpartition(":")[0].strip("[]") or "127.0.0.1"
        named = f"[{bound}]" if ":" in bound else bound
        return f"ws://{named}:{port}"

    async def announce(self, url: str) -> None:
        """Record this host's front at ``url``; a failure is logged (no relay reaches it)."""

        def write() -> None:
            with connect(self.conninfo) as conn:
                conn.execute(
                    "INSERT INTO actorkeep_fronts VALUES (%s, %s) "
                    "ON CONFLICT (host_id) DO UPDATE SET url = excluded.url",
                    (self.host_id, url),
                )
                conn.execute(
                    "DELETE FROM actorkeep_fronts f WHERE NOT EXISTS (SELECT 1 FROM "
                    "actorkeep_hosts h WHERE h.host_id = f.host_id AND h.seen_at > "
                    "clock_timestamp() - interval '1 hour') AND f.host_id <> %s",
                    (self.host_id,),
                )

        try:
            await trio.to_thread.run_sync(write, limiter=_LOOKUPS)
        except Exception as exc:
            log.warning("could not record where this host's front is", error=repr(exc))

    async def front_of(self, internal: str) -> str | None:
        """The front URL of the live host at the internal address ``internal``, if any."""
        now = trio.current_time()
        seen = self._seen.get(internal)
        if seen is not None and now - seen[0] < KEEP_FOR:
            return seen[1]

        def read() -> str | None:
            with connect(self.conninfo) as conn:
                row = conn.execute(
                    "SELECT f.url FROM actorkeep_hosts h JOIN actorkeep_fronts f USING "
                    "(host_id) WHERE h.address = %s ORDER BY h.seen_at DESC LIMIT 1",
                    (internal,),
                ).fetchone()
            return None if row is None else str(row[0])

        try:
            url = await trio.to_thread.run_sync(read, limiter=_LOOKUPS)
        except Exception as exc:
            log.warning("could not read where a host's front is", host=internal, error=repr(exc))
            return None
        if url is not None and urllib.parse.urlsplit(url).scheme != "ws":
            url = None
        if len(self._seen) > 1024:
            self._seen.clear()
        self._seen[internal] = (now, url)
        return url
