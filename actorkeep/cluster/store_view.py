"""What the operator sees of the cluster's store (actorkeep/ops): its hosts and leases, and
the actors with durable state in it. Each look is on a connection of its own, so that a slow
one never holds a host's connection to the store."""

from __future__ import annotations

from typing import Any

from .partitions import partition_of
from .store import connect


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
                "SELECT host_id, address, EXTRACT(EPOCH FROM clock_timestamp() - seen_at) "
                "FROM actorkeep_hosts ORDER BY host_id"
            ).fetchall()
            leases = conn.execute(
                "SELECT partition, owner, epoch, "
                "EXTRACT(EPOCH FROM expires_at - clock_timestamp()) "
                "FROM actorkeep_leases ORDER BY partition"
            ).fetchall()
        return {
            "host_id": self.host_id,
            "partitions": self.partitions,
            "hosts": [{"host_id": h, "address": a, "seen_ago": float(ago)} for h, a, ago in hosts],
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
