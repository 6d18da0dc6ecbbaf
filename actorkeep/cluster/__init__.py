"""Several hosts over PostgreSQL (decision 0016): partitions, leases with epochs, and the fenced
commit of actors' durable writes. Built on the runtime's seams; the runtime knows nothing of it.

Not wired into ``actorkeep serve`` yet: this package holds the store the cluster mode stands on.
"""

from __future__ import annotations

from .partitions import partition_of
from .store import ClusterMismatch, ClusterStore, Fenced, Lease, Write, create

__all__ = ["ClusterMismatch", "ClusterStore", "Fenced", "Lease", "Write", "create", "partition_of"]
