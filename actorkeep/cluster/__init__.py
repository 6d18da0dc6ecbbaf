"""Several hosts over PostgreSQL (docs/cluster.md; decisions 0016 and 0017): partitions,
leases with epochs, the fenced commit of actors' durable writes as SQLite's log frames, the
alarm index, and events forwarded to their owner over signed connections. Built on the
runtime's seams (storage, router, alarm index); the runtime knows nothing of it.
``actorkeep serve --cluster`` puts it together (``serving.py``).
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
