"""``actorkeep serve --cluster``: a host of a cluster (decision 0016), its storage backend and
router made from the command line's options."""

from __future__ import annotations

import os
import secrets
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from .backend import ClusterStorage
from .keeper import LeaseKeeper, LeaseSettings
from .partitions import DEFAULT_PARTITIONS, check_partitions
from .store import ClusterMismatch, ClusterStore, create


@dataclass(frozen=True)
class ClusterOptions:
    """``conninfo``: PostgreSQL's (a URL or ``key=value`` pairs; several hosts for a standby).
    ``partitions``: fixed when the cluster is created, checked by every host after."""

    conninfo: str
    partitions: int = DEFAULT_PARTITIONS
    lease: LeaseSettings = field(default_factory=LeaseSettings)

    def __post_init__(self) -> None:
        check_partitions(self.partitions)


def host_id() -> str:
    """This host incarnation's name in the cluster: machine, process and a random part (a
    restarted host is a new owner)."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"


def open_cluster(data: Path, options: ClusterOptions) -> ClusterStorage:
    """The storage backend of this host: creates the cluster's tables if they are not there.
    ``SystemExit`` with one clear line if PostgreSQL cannot be reached or disagrees."""
    try:
        create(options.conninfo, options.partitions)
        store = ClusterStore(options.conninfo, host_id(), clock=time.monotonic)
    except psycopg.OperationalError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SystemExit(f"actorkeep: cannot reach the cluster's PostgreSQL: {first}") from None
    except ClusterMismatch as exc:
        raise SystemExit(f"actorkeep: {exc}") from None
    return ClusterStorage(data, store, LeaseKeeper(store, options.lease, time.monotonic))
