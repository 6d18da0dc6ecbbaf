"""Where the CLI's operations commands read from: a running host's admin API, or the data
directory itself when no host serves it (docs/operations.md).

Both answer the same JSON documents. A host started with ``--admin`` writes its admin URL to
``<data>/host/admin.json`` while it serves; a command finds the directory locked, reads the
URL there, and asks the host. A directory no host holds is read directly, under its lock, so
that no host starts on it meanwhile.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import trio

from .. import codec
from ..app import App
from ..runtime.alarm_index import LocalAlarmIndex
from ..runtime.dirlock import CLUSTER_MARK
from ..runtime.files import delete_database
from ..runtime.host import Host
from ..runtime.hostdb import HostDb
from ..runtime.registry import Registry
from ..runtime.storage import DataDirInUse, FileStorage
from . import inspect, ready
from .backup import backup
from .inspect import InspectError

TOKEN_ENV = "ACTORKEEP_ADMIN_TOKEN"
ADMIN_FILE = "admin.json"


class SourceError(Exception):
    """The command cannot reach what it reads (the message says why and what to do)."""


class Source(Protocol):
    """What the operations commands read."""

    def actors(self, prefix: str, after: str | None, limit: int) -> dict[str, Any]: ...

    def show(self, address: str) -> dict[str, Any]: ...

    def sql(self, address: str, sql: str, params: list[Any]) -> dict[str, Any]: ...

    def alarms(self, due: bool, after: str | None, limit: int) -> dict[str, Any]: ...

    def remove(self, address: str) -> dict[str, Any]: ...

    def backup(self, dest: Path) -> dict[str, Any]: ...

    def cluster(self) -> dict[str, Any]: ...

    def queue_stats(self, address: str) -> dict[str, Any]: ...

    def queue_dead(self, address: str, after: int | None, limit: int) -> dict[str, Any]: ...

    def queue_get(self, address: str, id: int) -> dict[str, Any]: ...

    def queue_redrive(self, address: str, ids: list[int] | None) -> dict[str, Any]: ...

    def queue_cancel(self, address: str, id: int) -> dict[str, Any]: ...

    def kv_get(self, class_name: str, shards: int | None, key: str) -> dict[str, Any]: ...

    def kv_list(
        self, class_name: str, shards: int | None, prefix: str, after: str | None, limit: int
    ) -> dict[str, Any]: ...


class Offline:
    """A data directory no host serves, read under its lock. ``app``: how to get the app that
    serves it, for the queue writes (``--app``; None: they are refused)."""

    def __init__(
        self,
        data: Path,
        host_db: HostDb,
        release: Callable[[], None],
        app: Callable[[], App] | None = None,
    ) -> None:
        self.data = data
        self.host_db = host_db
        self._release = release
        self._app = app
        #: A cluster host's directory: its files are working copies, what counts is in
        #: PostgreSQL, so nothing here is written.
        self.of_cluster = (data / "host" / CLUSTER_MARK).exists()
        self.actors_root = data / "actors"
        self.registry = Registry(host_db)
        self.alarm_index = LocalAlarmIndex(host_db)
        latest = host_db.get_meta("clock_high_water")
        # Host time never goes back (decision 0012): no earlier than the latest it recorded.
        self.now = max(time.time(), latest if isinstance(latest, int | float) else 0.0)

    def actors(self, prefix: str, after: str | None, limit: int) -> dict[str, Any]:
        page = inspect.list_actors(self.registry, prefix, after, limit)
        quarantined = self.registry.quarantined()
        for actor in page["actors"]:
            actor["active"] = False
            reason = quarantined.get(actor["address"])
            actor["quarantined"] = reason[0] if reason else None
        return page

    def show(self, address: str) -> dict[str, Any]:
        about = inspect.describe_actor(self.actors_root, address)
        about["active"] = False
        reason = self.registry.quarantined().get(address)
        about["quarantined"] = reason[0] if reason else None
        about["alarm_index"] = self.alarm_index.get(address)
        return about

    def sql(self, address: str, sql: str, params: list[Any]) -> dict[str, Any]:
        return inspect.query(self.actors_root, address, sql, params)

    def alarms(self, due: bool, after: str | None, limit: int) -> dict[str, Any]:
        until = self.now if due else float("inf")
        rows = self.alarm_index.due(until, inspect.alarm_cursor(after), limit + 1)
        return {"now": self.now, **inspect.list_alarms(rows, limit)}

    def remove(self, address: str) -> dict[str, Any]:
        """Delete an actor's database and forget it, in the order of ``Host.remove``
        (runtime/removal.py): the registry forgets it durably, the files go, then its
        quarantine and alarm entries. A crash before the files go leaves files that the
        actor's next event or alarm takes as its own (run ``rm`` once more), never a
        registered actor without its file, a damaged file out of quarantine, nor an alarm
        nothing wakes."""
        self._not_of_cluster("rm")
        path = inspect.database_path(self.actors_root, address)
        files = [path.with_name(path.name + suffix) for suffix in ("", "-wal", "-shm")]
        known = self.registry.has(address) or address in self.registry.quarantined()
        if (
            not known
            and self.alarm_index.get(address) is None
            and not any(f.exists() for f in files)
        ):
            raise InspectError("no such actor", 404)
        self.registry.forget(address)
        trio.run(self.host_db.sync)
        freed = delete_database(path)
        self.registry.release(address)
        self.alarm_index.remove(address)
        trio.run(self.host_db.sync)
        return {"deleted": address, "bytes": freed}

    def _not_of_cluster(self, what: str) -> None:
        if self.of_cluster:
            raise SourceError(
                f"{what} is refused here: this directory holds a cluster host's working "
                "copies, and the actors are in PostgreSQL; ask a running host of the cluster "
                "(--admin URL)"
            )

    def backup(self, dest: Path) -> dict[str, Any]:
        return backup(self.data, dest)

    def cluster(self) -> dict[str, Any]:
        raise SourceError("no host serves this directory: a cluster is seen through its hosts")

    def queue_stats(self, address: str) -> dict[str, Any]:
        return ready.offline_stats(self.actors_root, address, self.now)

    def queue_dead(self, address: str, after: int | None, limit: int) -> dict[str, Any]:
        return ready.offline_dead(self.actors_root, address, after, limit)

    def queue_get(self, address: str, id: int) -> dict[str, Any]:
        return ready.offline_get(self.actors_root, address, id, self.now)

    def queue_redrive(self, address: str, ids: list[int] | None) -> dict[str, Any]:
        return self._as_host(lambda r: r.redrive(address, ids))

    def queue_cancel(self, address: str, id: int) -> dict[str, Any]:
        return self._as_host(lambda r: r.cancel(address, id))

    def _as_host(
        self, change: Callable[[ready.Ready], Awaitable[dict[str, Any]]]
    ) -> dict[str, Any]:
        """Run ``change`` as the operator of a host of the app, opened on the directory for
        as long as it takes: one of the queue's own events, as on a running host."""
        self._not_of_cluster("a queue write")
        if self._app is None:
            raise SourceError(_QUEUE_WRITES)
        app = self._app()
        self._release()  # the host takes the directory's lock itself

        async def run() -> dict[str, Any]:
            host = Host(app, FileStorage(self.data))
            async with host.open():
                try:
                    return await change(ready.Ready(host))
                except InspectError as exc:  # raised here, not from the host's nursery
                    refused = exc
            raise refused

        try:
            return trio.run(run)
        except DataDirInUse:
            raise SourceError(f"a host started on {str(self.data)!r} meanwhile") from None

    def kv_get(self, class_name: str, shards: int | None, key: str) -> dict[str, Any]:
        return ready.offline_kv_get(self.actors_root, class_name, shards, key, self.now)

    def kv_list(
        self, class_name: str, shards: int | None, prefix: str, after: str | None, limit: int
    ) -> dict[str, Any]:
        root = self.actors_root
        return ready.offline_kv_list(root, class_name, shards, prefix, after, limit, self.now)


_QUEUE_WRITES = (
    "a redrive or cancel runs as one of the queue's own events (in order with its sends and "
    "leases, its alarm set with the change): give --app MODULE:APP to run it with the app on "
    "this stopped directory, or ask the running host (serve the app with --admin)"
)


#: The header of an admin request one host of a cluster passes on to another.
FORWARDED = "x-actorkeep-forwarded"


class Online:
    """A running host, through its admin API at ``url`` (``http://HOST:PORT``)."""

    def __init__(self, url: str, token: str | None, forwarded: bool = False) -> None:
        parsed = urllib.parse.urlsplit(url)
        try:
            port = parsed.port or 80
        except ValueError:
            port = 0
        if parsed.scheme != "http" or not parsed.hostname or not 0 < port < 65536:
            raise SourceError(f"want the admin API as http://HOST:PORT, got {url!r}")
        self.url = url
        self._host = parsed.hostname
        self._port = port
        self._headers = {"authorization": f"Bearer {token}"} if token else {}
        if forwarded:  # by another host of the cluster: the host asked answers itself
            self._headers[FORWARDED] = "1"

    def _ask(
        self,
        method: str,
        path: str,
        query: dict[str, Any],
        body: Any = None,
        timeout: float | None = 30.0,
    ) -> Any:
        wanted = {k: v for k, v in query.items() if v is not None}
        target = path + ("?" + urllib.parse.urlencode(wanted) if wanted else "")
        conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        data = None if body is None else codec.json_dumps(body)
        headers = dict(self._headers, **({"content-type": "application/json"} if data else {}))
        try:
            conn.request(method, target, data, headers)
            resp = conn.getresponse()
            raw = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            raise SourceError(f"cannot reach the admin API at {self.url}: {exc!r}") from None
        finally:
            conn.close()
        try:
            answer = json.loads(raw)
        except ValueError:
            raise SourceError(f"the admin API at {self.url} answered {resp.status}") from None
        if resp.status != 200:
            message = answer.get("message") if isinstance(answer, dict) else None
            raise InspectError(str(message or resp.status), resp.status)
        return answer

    def actors(self, prefix: str, after: str | None, limit: int) -> dict[str, Any]:
        query = {"prefix": prefix, "after": after, "limit": limit}
        return dict(self._ask("GET", "/api/actors", query))

    def show(self, address: str) -> dict[str, Any]:
        return dict(self._ask("GET", "/api/actors/" + urllib.parse.quote(address), {}))

    def sql(self, address: str, sql: str, params: list[Any]) -> dict[str, Any]:
        path = "/api/actors/" + urllib.parse.quote(address) + "/sql"
        return dict(self._ask("POST", path, {}, {"sql": sql, "params": params}))

    def alarms(self, due: bool, after: str | None, limit: int) -> dict[str, Any]:
        query = {"due": "1" if due else None, "after": after, "limit": limit}
        return dict(self._ask("GET", "/api/alarms", query))

    def remove(self, address: str) -> dict[str, Any]:
        return dict(self._ask("DELETE", "/api/actors/" + urllib.parse.quote(address), {}))

    def _queue_path(self, address: str, rest: str = "") -> str:
        return "/api/queues/" + urllib.parse.quote(address) + rest

    def cluster(self) -> dict[str, Any]:
        return dict(self._ask("GET", "/api/cluster", {}))

    def queue_stats(self, address: str) -> dict[str, Any]:
        return dict(self._ask("GET", self._queue_path(address), {}))

    def queue_dead(self, address: str, after: int | None, limit: int) -> dict[str, Any]:
        query = {"after": after, "limit": limit}
        return dict(self._ask("GET", self._queue_path(address, "/dead"), query))

    def queue_get(self, address: str, id: int) -> dict[str, Any]:
        return dict(self._ask("GET", self._queue_path(address, f"/messages/{id}"), {}))

    def queue_redrive(self, address: str, ids: list[int] | None) -> dict[str, Any]:
        path = self._queue_path(address, "/redrive")
        return dict(self._ask("POST", path, {}, {"ids": ids}))

    def queue_cancel(self, address: str, id: int) -> dict[str, Any]:
        return dict(self._ask("POST", self._queue_path(address, "/cancel"), {}, {"id": id}))

    def kv_get(self, class_name: str, shards: int | None, key: str) -> dict[str, Any]:
        path = "/api/kv/" + urllib.parse.quote(class_name) + "/entry"
        return dict(self._ask("GET", path, {"key": key, "shards": shards}))

    def kv_list(
        self, class_name: str, shards: int | None, prefix: str, after: str | None, limit: int
    ) -> dict[str, Any]:
        query = {"prefix": prefix, "after": after, "limit": limit, "shards": shards}
        return dict(self._ask("GET", "/api/kv/" + urllib.parse.quote(class_name), query))

    def backup(self, dest: Path) -> dict[str, Any]:
        # As long as the copy takes: the host answers when it has written the last file.
        return dict(self._ask("POST", "/api/backup", {}, {"dest": str(dest)}, timeout=None))


@contextlib.contextmanager
def open_source(
    data: Path, admin: str | None, token: str | None, app: Callable[[], App] | None = None
) -> Iterator[Source]:
    """The running host's admin API (``admin``, or the one it wrote in ``data``), else the
    data directory itself (``app``: the app that serves it, for queue writes)."""
    token = token or os.environ.get(TOKEN_ENV) or None
    if admin is not None:
        yield Online(admin, token)
        return
    if not (data / "host" / "host.sqlite").exists():
        raise SourceError(f"no host database in {str(data)!r}: not a data directory (--data)")
    storage = FileStorage(data, in_thread=False)
    try:
        host_db = HostDb(storage.open_host_db())
    except DataDirInUse:
        storage.close()
        yield Online(_written_url(data), token)
        return
    closed = False

    def release() -> None:
        nonlocal closed
        if not closed:
            closed = True
            host_db.close()
            storage.close()

    try:
        yield Offline(data, host_db, release, app)
    finally:
        release()


def _written_url(data: Path) -> str:
    try:
        written = json.loads((data / "host" / ADMIN_FILE).read_text())
        os.kill(int(written["pid"]), 0)  # its writer still runs (a file left by a kill -9 is not)
        return str(written["url"])
    except (OSError, ValueError, KeyError, TypeError):
        raise SourceError(
            f"a host is serving {str(data)!r} without --admin: start it with --admin "
            "127.0.0.1:8081 (or pass --admin URL here), or stop it to read the directory itself"
        ) from None


def write_admin_file(data: Path, url: str) -> Path:
    """Tell the CLI where this host's admin API is (``<data>/host/admin.json``)."""
    path = data / "host" / ADMIN_FILE
    part = path.with_name(ADMIN_FILE + ".part")
    part.write_text(json.dumps({"url": url, "pid": os.getpid()}) + "\n")
    part.replace(path)
    return path


def forget_admin_file(data: Path, anyone: bool = False) -> None:
    """Remove the admin file this process wrote (not one a later host wrote since); with
    ``anyone``, whoever wrote it (a host that holds the directory: it is stale)."""
    path = data / "host" / ADMIN_FILE
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        if anyone or json.loads(path.read_text())["pid"] == os.getpid():
            path.unlink()
