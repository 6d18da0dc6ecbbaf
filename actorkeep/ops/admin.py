"""The admin API: a host's own listener (``actorkeep serve --admin HOST:PORT``), apart from the
app's port, that shows what the host holds (docs/operations.md).

``/api/actors`` (list, show, ``sql``, ``DELETE``), ``/api/alarms``, ``/api/backup``,
``/api/queues`` and ``/api/kv`` (as the host's operator, ops/ready.py) and ``/api/cluster``
answer JSON; ``/metrics`` is the host's metrics for Prometheus; every other path is the
dashboard (ops/dashboard.py). Bound to anything but loopback it wants the token in
``authorization: Bearer ...`` or the dashboard's cookie (the CLI refuses to start it without
one).
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import trio

from .. import codec
from ..errors import RemoteError
from ..front import ServerLimits
from ..front.server import HttpServer
from ..http import Response, error_response, parse_query
from ..runtime.budget import ByteBudget
from ..runtime.host import Host
from . import backup, inspect
from .cluster_view import ClusterView, is_loopback
from .dashboard import COOKIE, Dashboard
from .inspect import InspectError
from .metrics import CONTENT_TYPE, HostMetrics
from .ready import Ready
from .source import FORWARDED, TOKEN_ENV, Online, SourceError

#: Reads of actors' databases run in threads, one at a time, so that a slow one never
#: holds the host's event loop.
_READERS = trio.CapacityLimiter(1)
#: Requests passed on to another host of the cluster wait in threads of their own: never in a
#: reader's place (two hosts asking each other at once would each wait for the other).
_FORWARDS = trio.CapacityLimiter(8)


def _host_name(host: str) -> str:
    """The name of a ``host`` header, without its port."""
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


@dataclass(frozen=True)
class AdminOptions:
    """``actorkeep serve --admin HOST:PORT`` and its token."""

    host: str
    port: int
    token: str | None


#: The admin listener's own limits: a few operators, small bodies.
ADMIN_LIMITS = ServerLimits(max_connections=64)
ADMIN_INFLIGHT = 4 << 20


def admin_options(spec: str | None, token: str | None) -> AdminOptions | None:
    """``--admin`` checked (``ValueError``): anything but loopback needs a token (``token``,
    else ``$ACTORKEEP_ADMIN_TOKEN``)."""
    if spec is None:
        return None
    host, sep, port = spec.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--admin wants HOST:PORT, got {spec!r}")
    host = host.strip("[]") or "127.0.0.1"
    token = token or os.environ.get(TOKEN_ENV) or None
    if token is None and not is_loopback(host):
        raise ValueError(
            f"--admin {spec} is not a loopback address: give it a token (--admin-token or "
            f"${TOKEN_ENV}), or bind it to 127.0.0.1"
        )
    return AdminOptions(host, int(port), token)


def admin_server(
    host: Host, data: Path, options: AdminOptions, cluster: ClusterView | None = None
) -> HttpServer:
    """The admin listener's HTTP server, with its own connection cap and byte budget."""
    front = AdminFront(host, data, options.token, cluster)
    return HttpServer(front, ADMIN_LIMITS, ByteBudget(ADMIN_INFLIGHT))


class AdminFront:
    """Answers the admin API's requests for ``host``, whose data directory is ``data``.
    ``token``: what requests must bear (None: no token, on loopback only). ``cluster``: the
    cluster this host is one of (None: a single host)."""

    def __init__(
        self, host: Host, data: Path, token: str | None, cluster: ClusterView | None = None
    ) -> None:
        self.host = host
        self.cluster = cluster
        self.actors_root = data / "actors"
        self._token = None if token is None else f"Bearer {token}".encode()
        self._token_text = token
        self.metrics = HostMetrics(host)
        if cluster is not None:
            self.metrics.collector.cluster_held = cluster.held
        self.ready = Ready(host, None if cluster is None else cluster.known)
        self.dashboard = Dashboard(self)

    async def handle(
        self,
        method: str,
        raw_path: str,
        query_string: str,
        headers: Iterable[tuple[str, str]],
        body: bytes,
    ) -> Response:
        """Answer one request to the admin listener."""
        seen = {name.lower(): value for name, value in headers}
        path = unquote(raw_path)
        refused = self._refusal(method, seen)
        if refused is not None:
            return refused
        pages_wanted = not path.startswith("/api/") and path != "/metrics"
        if self._token is not None and not self._authorized(seen):
            if pages_wanted:  # a person at a browser: the token form, then a cookie
                return self.dashboard.login(
                    method if path == "/login" else "GET", body, self._token
                )
            return error_response(
                401,
                "Unauthorized",
                "want authorization: Bearer <admin token>",
                {"www-authenticate": "Bearer"},
            )
        query = parse_query(query_string)
        if pages_wanted:
            if path == "/login":
                return Response(303, {"location": "/"})
            return await self.dashboard.handle(method, path, query, body)
        try:
            if path == "/api/actors":
                return _only(method, "GET") or Response.json(await self.actors(query))
            if path == "/api/alarms":
                return _only(method, "GET") or Response.json(await self.alarms(query))
            if path == "/api/backup":
                return _only(method, "POST") or await self._backup(body)
            if path == "/metrics":
                return _only(method, "GET") or await self._metrics()
            if path == "/api/cluster":
                return _only(method, "GET") or Response.json(await self.cluster_view())
            if path == "/api/queues":
                return _only(method, "GET") or Response.json(await self.ready.queues())
            if path.startswith("/api/queues/"):
                parts = path[len("/api/queues/") :].split("/")
                return await self._queue(method, parts, query, body)
            if path.startswith("/api/kv/"):
                return await self._kv(method, path[len("/api/kv/") :].split("/"), query)
            if path.startswith("/api/actors/"):
                parts = path[len("/api/actors/") :].split("/")
                address = "/".join(parts[:2])
                forward = FORWARDED not in seen  # a request another host passed on stops here
                if len(parts) == 2 and method == "DELETE":
                    return Response.json(await self.remove(address, forward))
                if len(parts) == 2:
                    refused = _only(method, "GET")
                    return refused or Response.json(await self.show(address, forward))
                if len(parts) == 3 and parts[2] == "sql":
                    return _only(method, "POST") or await self._sql(address, body, forward)
        except InspectError as exc:
            return error_response(exc.status, _ERROR_NAMES.get(exc.status, "Error"), str(exc))
        return error_response(404, "NotFound", "no such admin path")

    async def _metrics(self) -> Response:
        counts = (await self.ready.queues())["queues"]
        self.dashboard.record(counts)
        self.metrics.collector.queues = counts
        return Response(200, {"content-type": CONTENT_TYPE}, self.metrics.text())

    def _authorized(self, headers: dict[str, str]) -> bool:
        assert self._token is not None
        given = headers.get("authorization")
        if given is None:
            for part in headers.get("cookie", "").split(";"):
                name, _, value = part.strip().partition("=")
                if name == COOKIE:
                    given = f"Bearer {value}"
        return given is not None and hmac.compare_digest(given.encode(), self._token)

    def _refusal(self, method: str, headers: dict[str, str]) -> Response | None:
        """403 for what a browser sends on another site's behalf: a ``POST`` or ``DELETE``
        from another origin (a form or script of a page elsewhere), and, with no token, a
        request for a name that is not loopback (a page elsewhere whose name was pointed at
        127.0.0.1)."""
        host = headers.get("host", "")
        if self._token is None and host and not is_loopback(_host_name(host)):
            return error_response(403, "Forbidden", f"the admin listener is not {host!r}")
        if method not in ("GET", "HEAD"):
            origin = headers.get("origin")
            site = headers.get("sec-fetch-site", "same-origin")
            if site not in ("same-origin", "none") or (
                origin is not None and urlsplit(origin).netloc != host
            ):
                return error_response(403, "Forbidden", "cross-site requests are refused")
        return None

    async def _queue(
        self, method: str, parts: list[str], query: dict[str, str], body: bytes
    ) -> Response:
        """``/api/queues/<class>/<name>[/dead | /messages/<id> | /redrive | /cancel]``."""
        address, rest = "/".join(parts[:2]), parts[2:]
        ready = self.ready
        if not rest:
            return _only(method, "GET") or Response.json(await ready.stats(address))
        if rest == ["dead"]:
            limit = inspect.page_size(_int(query, "limit"))
            after = _int(query, "after")
            return _only(method, "GET") or Response.json(await ready.dead(address, after, limit))
        if len(rest) == 2 and rest[0] == "messages":
            message_id = _int({"id": rest[1]}, "id") or 0
            return _only(method, "GET") or Response.json(await ready.get(address, message_id))
        if rest == ["redrive"]:
            return _only(method, "POST") or Response.json(
                await ready.redrive(address, _redrive_ids(body))
            )
        if rest == ["cancel"]:
            return _only(method, "POST") or Response.json(
                await ready.cancel(address, _fields(body, {"id": (int, None)}, '{"id": 42}')[0])
            )
        return error_response(404, "NotFound", "no such admin path")

    async def _kv(self, method: str, parts: list[str], query: dict[str, str]) -> Response:
        """``/api/kv/<class>?prefix=&after=&limit=&shards=`` and ``/api/kv/<class>/entry?key=``."""
        refused = _only(method, "GET")
        if refused is not None:
            return refused
        shards = _int(query, "shards")
        if len(parts) == 1:
            limit = inspect.page_size(_int(query, "limit"))
            page = await self.ready.kv_list(
                parts[0], shards, query.get("prefix", ""), query.get("after"), limit
            )
            return Response.json(page)
        if len(parts) == 2 and parts[1] == "entry" and "key" in query:
            return Response.json(await self.ready.kv_get(parts[0], shards, query["key"]))
        return error_response(404, "NotFound", "no such admin path")

    async def cluster_view(self) -> dict[str, Any]:
        """The cluster's hosts and partitions (404 on a single host)."""
        if self.cluster is None:
            raise InspectError("this host is not in a cluster (serve --cluster)", 404)
        view: dict[str, Any] = await self.cluster.overview()
        return view

    async def actors(self, query: dict[str, str]) -> dict[str, Any]:
        """A page of actors: ``class``, ``prefix``, ``after`` and ``limit`` of ``query``. In a
        cluster, every actor with durable state in it, wherever it is served."""
        prefix = inspect.address_prefix(query.get("class") or None, query.get("prefix", ""))
        limit = inspect.page_size(_int(query, "limit"))
        after = query.get("after")
        if self.cluster is not None:
            found = await self.cluster.addresses(prefix, after, limit + 1)
            page: dict[str, Any] = {
                # PostgreSQL keeps an actor's state, not when it was made
                "actors": [{"address": a, "created_at": None} for a in found[:limit]],
                "next": found[limit - 1] if len(found) > limit else None,
            }
        else:
            page = inspect.list_actors(self.host.registry, prefix, after, limit)
        active = self.host.activations
        quarantined = self.host.quarantined
        for actor in page["actors"]:
            actor["active"] = actor["address"] in active
            actor["quarantined"] = quarantined.get(actor["address"])
        return page

    async def alarms(self, query: dict[str, str]) -> dict[str, Any]:
        """A page of pending alarms, soonest first (``due``: only those due now); in a
        cluster, the whole cluster's (from PostgreSQL)."""
        limit = inspect.page_size(_int(query, "limit"))
        until = self.host.clock.now() if query.get("due") in ("1", "true") else float("inf")
        after = inspect.alarm_cursor(query.get("after"))
        if self.cluster is not None:
            rows = await self.cluster.alarms(until, after, limit + 1)
        else:
            rows = self.host.alarm_index.due(until, after, limit + 1)
        return {"now": self.host.clock.now(), **inspect.list_alarms(rows, limit)}

    async def _from_owner(
        self, address: str, where: dict[str, Any], ask: Callable[[Online], dict[str, Any]]
    ) -> dict[str, Any]:
        """``ask`` the admin API of the host that holds ``address`` (with this host's token:
        a cluster's hosts share one), marked as forwarded, so that it does not pass it on."""
        url = where["owner_admin"]
        try:
            owner = Online(url, self._token_text, forwarded=True)
            return await trio.to_thread.run_sync(lambda: ask(owner), limiter=_FORWARDS)
        except SourceError as exc:
            message = f"{_elsewhere(address, where)}: it did not answer at {url} ({exc})"
            raise InspectError(message, 503) from None
        except InspectError as exc:
            if exc.status != 401:
                raise  # the owner's answer, with its status
            message = f"{_elsewhere(address, where)}: it refused this host's admin token"
            raise InspectError(f"{message} (give the hosts one --admin-token)", 503) from None

    async def _where(self, address: str, forward: bool) -> dict[str, Any] | None:
        """Where ``address`` lives (None on a single host); ``InspectError`` naming the owner
        if this host does not hold it and may not (``forward``) or cannot ask the owner: its
        own copy, if it has one, is not the current one."""
        if self.cluster is None:
            return None
        where = await self.cluster.where(address)
        if not where["here"] and not (forward and where["owner_admin"]):
            raise InspectError(_elsewhere(address, where), 404)
        return where

    async def show(self, address: str, forward: bool = True) -> dict[str, Any]:
        """One actor: its file, tables with row counts, its alarm; in a cluster, where it
        lives, as the host that holds it answers (``forward``: ask that host)."""
        where = await self._where(address, forward)
        if where is not None and not where["here"]:
            about = await self._from_owner(address, where, lambda owner: owner.show(address))
            about["cluster"] = {**where, "here": False}  # the owner's answer, asked here
            return about
        about = await trio.to_thread.run_sync(
            inspect.describe_actor, self.actors_root, address, limiter=_READERS
        )
        about["cluster"] = where
        about["active"] = address in self.host.activations
        about["quarantined"] = self.host.quarantined.get(address)
        about["alarm_index"] = self.host.alarm_index.get(address)
        return about

    async def remove(self, address: str, forward: bool = True) -> dict[str, Any]:
        """Delete an idle actor (409 while it has events in flight). In a cluster, by the
        host that holds it (``forward``: asked by this one; 409 naming it when it cannot
        be), whether or not it has a copy here."""
        known = False
        if self.cluster is not None:
            where = await self.cluster.where(address)
            if not where["here"]:
                if forward and where["owner_admin"]:
                    return await self._from_owner(address, where, lambda o: o.remove(address))
                raise InspectError(_elsewhere(address, where), 409)
            known = await self.cluster.known(address)
        try:
            freed = await self.host.remove(address, known)
        except RemoteError as exc:
            raise InspectError(exc.message, exc.status) from None
        return {"deleted": address, "bytes": freed}

    async def _backup(self, body: bytes) -> Response:
        (dest_text,) = _fields(body, {"dest": (str, None)}, '{"dest": "/absolute/path"}')
        dest = backup.check_destination(Path(dest_text))
        if self.cluster is not None:  # the whole cluster, as PostgreSQL holds it
            backup.check_outside(dest, self.actors_root.parent)
            return Response.json(await self.cluster.backup(dest))
        answer = await trio.to_thread.run_sync(
            backup.backup, self.actors_root.parent, dest, limiter=_READERS
        )
        return Response.json(answer)

    async def _sql(self, address: str, body: bytes, forward: bool) -> Response:
        wanted: dict[str, tuple[type, Any]] = {"sql": (str, None), "params": (list, [])}
        sql, params = _fields(body, wanted, '{"sql": "SELECT ...", "params": [...]}')
        return Response.json(await self.sql(address, sql, params, forward))

    async def sql(
        self, address: str, sql: str, params: list[Any], forward: bool = True
    ) -> dict[str, Any]:
        """One read-only statement on an actor's database: its columns and rows (in a
        cluster, on the copy of the host that holds it; ``forward``: ask that host)."""
        where = await self._where(address, forward)
        if where is not None and not where["here"]:
            return await self._from_owner(
                address, where, lambda owner: owner.sql(address, sql, params)
            )
        return await trio.to_thread.run_sync(
            inspect.query, self.actors_root, address, sql, params, limiter=_READERS
        )


def _elsewhere(address: str, where: dict[str, Any]) -> str:
    owner = where["owner"]
    if owner is None:
        return f"{address} is in partition {where['partition']}, which no host holds now"
    return (
        f"no copy of {address} on this host: it is in partition {where['partition']}, "
        f"held by {owner} (internal address {where['owner_address']}); ask that host's "
        "admin API"
    )


_ERROR_NAMES = {
    400: "BadRequest",
    404: "NotFound",
    409: "Conflict",
    500: "StorageError",
    503: "Unavailable",
}


def _fields(body: bytes, wanted: dict[str, tuple[type, Any]], shape: str) -> list[Any]:
    """The fields of a JSON object body, in ``wanted``'s order: each of its type, those with a
    None default required, no others (``InspectError`` naming ``shape`` otherwise)."""
    try:
        asked = codec.json_loads(body)
    except ValueError:
        asked = None
    if not isinstance(asked, dict) or not set(asked) <= set(wanted):
        raise InspectError(f"want a JSON body {shape}")
    values = []
    for name, (kind, default) in wanted.items():
        value = asked.get(name, default)
        if not isinstance(value, kind):
            raise InspectError(f"want a JSON body {shape}")
        values.append(value)
    return values


def _redrive_ids(body: bytes) -> list[int] | None:
    """A redrive's ``{"ids": [1, 2]}``, or ``{"ids": null}``: every dead letter."""
    shape = '{"ids": [1, 2]} or {"ids": null} for every dead letter'
    try:
        asked = codec.json_loads(body)
    except ValueError:
        asked = None
    if not isinstance(asked, dict) or set(asked) != {"ids"}:
        raise InspectError(f"want a JSON body {shape}")
    ids = asked["ids"]
    if ids is not None and not isinstance(ids, list):
        raise InspectError(f"want a JSON body {shape}")
    return ids


def _only(method: str, allowed: str) -> Response | None:
    if method == allowed:
        return None
    return error_response(405, "MethodNotAllowed", f"want {allowed}", {"allow": allowed})


def _int(query: dict[str, str], key: str) -> int | None:
    value = query.get(key)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise InspectError(f"{key} must be an integer, got {value!r}") from None
