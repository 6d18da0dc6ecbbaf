"""What the operator sees of the cluster's store (actorkeep/ops): its hosts and leases, and
the actors with durable state in it. Each look is on a connection of its own, so that a slow
one never holds a host's connection to the store."""

from __future__ import annotations

from typing import Any

from .connections import connect
from .partitions import partition_of
from .replica import held
from .store import load_actor


class StoreView:
    """Looks at the store at ``conninfo`` for the host ``host_id`` of a cluster of
    ``partitions`` partitions."""

    def __init__(self, conninfo: str, host_id: str, partitions: int) -> None:
        self.conninfo = conninfo
        self.host_id = host_id
        self.partitions = partitions

    def view(self) -> dict[str, Any]:
        """The hosts (seconds since each was last seen), and every partition's owner, epoch
        and seconds to its lease's expiry, by PostgreSQL's clock."""
        with connect(self.conninfo) as conn:
            hosts = conn.execute(
                "SELECT h.host_id, h.address, EXTRACT(EPOCH FROM clock_timestamp() - seen_at), "
                "a.url FROM actorkeep_hosts h LEFT JOIN actorkeep_admin a USING (host_id) "
                "ORDER BY h.host_id"
            ).fetchall()
            leases = conn.execute(
                "SELECT partition, owner, epoch, "
                "EXTRACT(EPOCH FROM expires_at - clock_timestamp()) "
                "FROM actorkeep_leases ORDER BY partition"
            ).fetchall()
        return {
            "host_id": self.host_id,
            "partitions": self.partitions,
            "hosts": [
                {"host_id": h, "address": a, "seen_ago": float(ago), "admin": url}
                for h, a, ago, url in hosts
            ],
            "leases": [
                {
                    "partition": int(p),
                    "owner": owner,
                    "epoch": int(epoch),
                    "expires_in": None if left is None else float(left),
                }
                for p, owner, epoch, left in leases
            ],
        }

    def announce(self, url: str) -> None:
        """Record where this host's admin API is (``http://host:port``)."""
        with connect(self.conninfo) as conn:
            conn.execute(
                "INSERT INTO actorkeep_admin VALUES (%s, %s) "
                "ON CONFLICT (host_id) DO UPDATE SET url = excluded.url",
                (self.host_id, url),
            )
            # Each start is a new host: forget those that are gone (left, or not seen for
            # an hour).
            conn.execute(
                "DELETE FROM actorkeep_admin a WHERE NOT EXISTS (SELECT 1 FROM actorkeep_hosts h "
                "WHERE h.host_id = a.host_id AND h.seen_at > clock_timestamp() - interval '1 hour')"
                " AND a.host_id <> %s",
                (self.host_id,),
            )

    def alarms(
        self, until: float, after: tuple[float, str] | None, limit: int
    ) -> list[tuple[str, float]]:
        """``(address, at)`` of the cluster's alarm index entries due by ``until``, by
        ``(at, address)`` past ``after``: up to ``limit`` (a scan of the index: no index
        serves that order)."""
        where = "at <= %s"
        params: list[Any] = [until]
        if after is not None:
            where += ' AND (at > %s OR (at = %s AND address COLLATE "C" > %s))'
            params += [after[0], after[0], after[1]]
        query = (
            f"SELECT address, at FROM actorkeep_alarms WHERE {where} "
            'ORDER BY at, address COLLATE "C" LIMIT %s'
        )
        with connect(self.conninfo) as conn:
            rows = conn.execute(query, [*params, limit]).fetchall()
        return [(a, float(at)) for a, at in rows]

    def load(self, address: str) -> tuple[int, bytes, list[tuple[int, bytes]]]:
        """What the cluster holds of an actor (``ClusterStore.load``), in one snapshot."""
        with connect(self.conninfo) as conn:
            return load_actor(conn, address)

    def image(self, address: str) -> bytes:
        """The actor's database file as the cluster holds it (empty: it holds nothing of
        it): its image with its batches laid over it."""
        return held(self, address).image

    def known(self, address: str) -> bool:
        """Whether the actor at ``address`` has durable state in the cluster."""
        with connect(self.conninfo) as conn:
            row = conn.execute(
                "SELECT EXISTS (SELECT 1 FROM actorkeep_images WHERE address = %s) "
                "OR EXISTS (SELECT 1 FROM actorkeep_frames WHERE address = %s)",
                (address, address),
            ).fetchone()
        return bool(row and row[0])

    def partition_of(self, address: str) -> int:
        """The partition of the actor at ``address``."""
        return partition_of(address, self.partitions)

    def addresses(self, low: str, high: str | None, after: str | None, limit: int) -> list[str]:
        """Addresses of actors with durable state in the cluster, ``low <= address < high``
        (None: no bound) and past ``after``, in order: up to ``limit``."""
        start = low if after is None or after < low else after
        op = ">" if after is not None and after >= low else ">="
        # Compared byte by byte (as a single host orders them), whatever the database's
        # collation; so not by the primary key's index: a scan (docs/operations.md).
        where = f'address COLLATE "C" {op} %s'
        params: list[Any] = [start]
        if high is not None:
            where += ' AND address COLLATE "C" < %s'
            params.append(high)
        query = (
            f"SELECT address FROM (SELECT address FROM actorkeep_images WHERE {where} "
            f"UNION SELECT address FROM actorkeep_frames WHERE {where}) AS known "
            'ORDER BY address COLLATE "C" LIMIT %s'
        )
        with connect(self.conninfo) as conn:
            rows = conn.execute(query, [*params, *params, limit]).fetchall()
        return [r[0] for r in rows]
