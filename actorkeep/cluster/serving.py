"""``actorkeep serve --cluster``: a host of a cluster (decisions 0016 and 0017): its storage
backend, its internal port and its router, made from the command line's options."""

from __future__ import annotations

import os
import secrets
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import trio

from ..runtime.dirlock import CLUSTER_MARK
from ..runtime.router import Target
from .backend import ClusterStorage
from .fronts import Fronts
from .keeper import LeaseKeeper, LeaseSettings
from .partitions import DEFAULT_PARTITIONS, check_partitions
from .peers import Peers, serve_peers
from .router import ClusterRouter
from .store import ClusterMismatch, ClusterStore, create
from .store_view import StoreView

_WILDCARDS = frozenset({"", "0.0.0.0", "::"})


@dataclass(frozen=True)
class ClusterOptions:
    """``conninfo``: PostgreSQL's (a URL or ``key=value`` pairs; several hosts for a standby).
    ``partitions``: fixed when the cluster is created, checked by every host after.
    ``internal``: where this host listens for the others (``host``, ``port``; port 0 picks a
    free one). ``advertise``: the ``host:port`` the others dial (the bound address if not
    given; the machine's name for a wildcard bind)."""

    conninfo: str
    partitions: int = DEFAULT_PARTITIONS
    lease: LeaseSettings = field(default_factory=LeaseSettings)
    internal: tuple[str, int] = ("127.0.0.1", 0)
    advertise: str | None = None

    def __post_init__(self) -> None:
        check_partitions(self.partitions)
        port = self.internal[1]
        if not 0 <= port <= 65535:
            raise ValueError(f"internal port {port} out of range")
        if self.advertise is not None:
            _, sep, advertised_port = self.advertise.rpartition(":")
            if not sep or not advertised_port.isdigit() or not 0 < int(advertised_port) < 65536:
                raise ValueError(f"--advertise wants HOST:PORT, got {self.advertise!r}")


def options_from(args: Any) -> ClusterOptions:
    """``serve --cluster``'s options (``args``: argparse's), checked (``ValueError``)."""
    lease = LeaseSettings(ttl=args.lease_ttl, margin=args.lease_margin)
    host, sep, port = args.internal.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--internal wants HOST:PORT, got {args.internal!r}")
    internal = (host.strip("[]"), int(port))
    return ClusterOptions(args.cluster, args.partitions, lease, internal, args.advertise)


def host_id() -> str:
    """This host incarnation's name in the cluster: machine, process and a random part (a
    restarted host is a new owner)."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"


class ClusterNode:
    """What a cluster host runs beside its ``Host``: the leases and group commits
    (``storage.run``), the connections to the other hosts, and its internal port."""

    def __init__(
        self, storage: ClusterStorage, listeners: list[trio.SocketListener], advertise: str
    ) -> None:
        self.storage = storage
        store = storage.store
        assert isinstance(store, ClusterStore)
        #: What the admin API reads the cluster's state from.
        self.view = StoreView(store.conninfo, store.host_id, store.partitions)
        #: Where the other hosts' fronts are, for WebSockets relayed to an owner.
        self.fronts = Fronts(store.conninfo, store.host_id, advertise)
        self.peers = Peers(storage.store.secret)
        self._listeners = listeners
        self._router: ClusterRouter | None = None
        storage.keeper.address = advertise

    def held(self) -> int:
        """How many partitions this host serves now."""
        return len(self.storage.keeper.held)

    @property
    def address(self) -> str:
        """The ``host:port`` the other hosts reach this one at."""
        assert self.storage.keeper.address is not None
        return self.storage.keeper.address

    def router(self, host: Target) -> ClusterRouter:
        """``Host(..., router=node.router)``."""
        self._router = ClusterRouter(host, self.storage, self.peers)
        return self._router

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Serve the internal port, keep the leases, until cancelled (a planned stop hands the
        partitions over)."""
        if self._router is None:
            raise RuntimeError("make the Host with router=node.router first")
        async with trio.open_nursery() as nursery:
            await nursery.start(self.peers.run)
            secret = self.storage.store.secret
            await nursery.start(serve_peers, self._listeners, secret, self._router)
            await nursery.start(self.storage.run)  # the first tick: now others may send here
            task_status.started()


async def open_cluster_node(data: Path, options: ClusterOptions) -> ClusterNode:
    """Bind the internal port, then ``open_cluster``; ``SystemExit`` with one line if either
    cannot be done."""
    host, port = options.internal
    try:
        listeners = await trio.open_tcp_listeners(port, host=host or None)
    except OSError as exc:
        raise SystemExit(f"actorkeep: cannot listen on --internal {host}:{port}: {exc}") from None
    try:
        storage = open_cluster(data, options)
    except BaseException:
        for listener in listeners:
            await listener.aclose()
        raise
    # Its actors' files are working copies now: the commands never write them offline.
    (data / "host").mkdir(parents=True, exist_ok=True)
    (data / "host" / CLUSTER_MARK).write_text("a host of a cluster served this directory\n")
    if options.advertise is not None:
        advertise = options.advertise
    else:
        bound, bound_port = listeners[0].socket.getsockname()[:2]
        name = socket.getfqdn() if host in _WILDCARDS else bound
        advertise = f"[{name}]:{bound_port}" if ":" in name else f"{name}:{bound_port}"
    return ClusterNode(storage, listeners, advertise)


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
