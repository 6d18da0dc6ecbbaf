"""What the operator sees of a cluster (``serve --cluster``): its hosts, every partition's owner
and epoch, where an actor lives, and the actors with durable state anywhere in it. Read from
PostgreSQL on connections of their own, in a thread (docs/operations.md)."""

from __future__ import annotations

import collections
import ipaddress
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import structlog
import trio

from .backup import backup_cluster
from .inspect import InspectError

_READERS = trio.CapacityLimiter(2)
log = structlog.get_logger("actorkeep")


class ClusterSource(Protocol):
    """What ``cluster.store_view.StoreView`` answers (ops does not import the cluster: it
    needs psycopg, which a single host goes without)."""

    host_id: str
    partitions: int

    def view(self) -> dict[str, Any]: ...

    def partition_of(self, address: str) -> int: ...

    def known(self, address: str) -> bool: ...

    def addresses(self, low: str, high: str | None, after: str | None, limit: int) -> list[str]: ...

    def announce(self, url: str) -> None: ...

    def image(self, address: str) -> bytes: ...

    def alarms(
        self, until: float, after: tuple[float, str] | None, limit: int
    ) -> list[tuple[str, float]]: ...


class ClusterView:
    """The cluster of ``store``; ``held``: the partitions this host serves now;
    ``advertise``: the internal address the other hosts reach this one at."""

    def __init__(self, store: ClusterSource, held: Callable[[], int], advertise: str = "") -> None:
        self.store = store
        self.held = held
        self.advertise = advertise

    async def overview(self) -> dict[str, Any]:
        """The hosts, each with the partitions it holds, and every partition's lease."""
        view = await trio.to_thread.run_sync(self.store.view, limiter=_READERS)
        live = [x for x in view["leases"] if x["owner"] and (x["expires_in"] or 0) > 0]
        owned = collections.Counter(x["owner"] for x in live)
        for host in view["hosts"]:
            host["partitions"] = owned.get(host["host_id"], 0)
            host["this"] = host["host_id"] == view["host_id"]
        view["unowned"] = view["partitions"] - len(live)
        view["held_here"] = self.held()
        return view

    async def where(self, address: str) -> dict[str, Any]:
        """The partition of ``address``, its owner and epoch, and the owner's address."""
        try:
            partition = self.store.partition_of(address)
        except ValueError as exc:
            raise InspectError(str(exc)) from None
        view = await trio.to_thread.run_sync(self.store.view, limiter=_READERS)
        lease = view["leases"][partition]
        live = lease["owner"] is not None and (lease["expires_in"] or 0) > 0
        owner = lease["owner"] if live else None
        hosts = {h["host_id"]: h for h in view["hosts"]}
        found = hosts.get(owner) if owner else None
        return {
            "partition": partition,
            "owner": owner,
            "owner_address": found["address"] if found else None,
            "owner_admin": found["admin"] if found else None,
            "epoch": lease["epoch"],
            "here": owner == view["host_id"],
        }

    async def announce(self, url: str) -> None:
        """Tell the other hosts where this host's admin API is: ``url``, as bound, with the
        host of the advertised internal address if it was bound to every interface; nothing
        if it is bound to loopback and the other hosts are elsewhere."""
        parts = urllib.parse.urlsplit(url)
        advertised = self.advertise.rpartition(":")[0].strip("[]") or "127.0.0.1"
        if parts.hostname in ("0.0.0.0", "::"):
            named = f"[{advertised}]" if ":" in advertised else advertised
            url = f"http://{named}:{parts.port}"
        elif is_loopback(parts.hostname or "") and not is_loopback(advertised):
            return  # the other machines cannot reach it: they name this host instead
        try:
            await trio.to_thread.run_sync(self.store.announce, url, limiter=_READERS)
        except Exception as exc:  # the others then say which host to ask instead
            log.warning("could not tell the cluster where the admin API is", error=repr(exc))

    async def backup(self, dest: Path) -> dict[str, Any]:
        """Every actor of the cluster, as PostgreSQL holds it, written under ``dest`` as a data
        directory that ``serve --data`` serves (one host)."""

        def every() -> Iterator[str]:
            after = None
            while page := self.store.addresses("", None, after, 1000):
                yield from page
                after = page[-1]

        return await trio.to_thread.run_sync(
            backup_cluster, every(), self.store.image, dest, limiter=_READERS
        )

    async def alarms(
        self, until: float, after: tuple[float, str] | None, limit: int
    ) -> list[tuple[str, float]]:
        """The cluster's pending alarms due by ``until``, soonest first."""
        return await trio.to_thread.run_sync(
            self.store.alarms, until, after, limit, limiter=_READERS
        )

    async def known(self, address: str) -> bool:
        """Whether ``address`` has durable state anywhere in the cluster."""
        return await trio.to_thread.run_sync(self.store.known, address, limiter=_READERS)

    async def addresses(self, prefix: str, after: str | None, limit: int) -> list[str]:
        """Actors with durable state in the cluster whose address starts with ``prefix``."""
        high = _after_prefix(prefix) if prefix else None
        return await trio.to_thread.run_sync(
            self.store.addresses, prefix, high, after, limit, limiter=_READERS
        )


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address to bind) is a loopback address or ``localhost``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _after_prefix(prefix: str) -> str | None:
    """The least string above every string starting with ``prefix`` (None: none is)."""
    for i in range(len(prefix) - 1, -1, -1):
        if ord(prefix[i]) < 0x10FFFF:
            return prefix[:i] + chr(ord(prefix[i]) + 1)
    return None
