"""Several hosts over PostgreSQL (decision 0016): partitions, leases with epochs, the fenced
commit of actors' durable writes, and those writes as SQLite's log frames. Built on the
runtime's seams; the runtime knows nothing of it.

Not wired into ``actorkeep serve`` yet: this package holds the store the cluster mode stands on.
"""

from __future__ import annotations

from .keeper import LeaseKeeper, LeaseSettings
from .partitions import partition_of
from .store import ClusterMismatch, ClusterStore, Fenced, Lease, Write, create

__all__ = [
    "ClusterMismatch",
    "ClusterStore",
    "Fenced",
    "Lease",
    "LeaseKeeper",
    "LeaseSettings",
    "Write",
    "create",
    "partition_of",
]
