"""``actorkeep serve MODULE:APP``: one host process serving HTTP/1.1 (actorkeep.front.server)."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import importlib
import importlib.metadata
import os
import resource
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
import trio

from .app import App
from .front import ServerLimits, serve_http
from .logs import LOG_LEVELS, configure_logging
from .ops import commands, migrate, repair
from .ops.admin import AdminFront, AdminOptions, admin_options, admin_server
from .ops.cluster_view import ClusterView
from .ops.source import TOKEN_ENV, forget_admin_file, write_admin_file
from .runtime import ring
from .runtime.host import Host
from .runtime.sockets import SocketLimits
from .runtime.storage import DataDirInUse, FileStorage

if TYPE_CHECKING:  # the cluster's modules need its extra (psycopg): imported when asked for
    from .cluster.serving import ClusterOptions

log = structlog.get_logger("actorkeep")


def load_app(spec: str) -> App:
    """Import ``MODULE:APP`` (the current directory is on the import path)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise SystemExit(f"actorkeep: want MODULE:APP, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SystemExit(f"actorkeep: cannot import {module_name!r}: {exc}") from None
    app = getattr(module, attr, None)
    if not isinstance(app, App):
        raise SystemExit(f"actorkeep: {spec!r} is not an actorkeep.App")
    return app


def parse_access(values: list[str]) -> dict[str, str]:
    access: dict[str, str] = {}
    for value in values:
        class_name, sep, rule = value.partition("=")
        if not sep or rule not in ("internal", "public"):
            raise SystemExit(f"actorkeep: --access wants CLASS=internal, got {value!r}")
        access[class_name] = rule
    return access


#: Descriptors an actor in memory holds: its database, its WAL and its shared-memory index as
#: SQLite opens them, and the database and the index once more, as the host reads and syncs
#: them (never closed before SQLite's, which would drop SQLite's locks: runtime/storage.py).
FILES_PER_ACTOR = 5
#: In a cluster, one more: the log reader's descriptor of the WAL (cluster/frames.py).
CLUSTER_FILES_PER_ACTOR = FILES_PER_ACTOR + 1
#: Descriptors kept for everything else: the host database and its lock, listeners, the
#: interpreter's own, a WAL opened for an fsync in a sync thread, the files an app's code
#: opens; and the io_uring's (its own four, and a log opened for each fdatasync in flight).
FILES_RESERVED = 64 + 4 + ring.ENTRIES
#: When the limit cannot hold both, sockets get at most this share of what is left.
SOCKET_SHARE = 4


def fit_open_files(
    max_active: int,
    max_connections: int,
    open_file_limit: int,
    files_per_actor: int = FILES_PER_ACTOR,
) -> tuple[int, int]:
    """``(max_active, max_connections)`` lowered so that actors in memory and client
    sockets together stay within ``open_file_limit`` descriptors (sockets and actors' files
    share it). Unchanged when they fit."""
    if open_file_limit == resource.RLIM_INFINITY:
        return max_active, max_connections
    budget = max(open_file_limit - FILES_RESERVED, 2 * files_per_actor)
    if max_active * files_per_actor + max_connections <= budget:
        return max_active, max_connections
    connections = max(1, min(max_connections, budget // SOCKET_SHARE))
    active = max(1, min(max_active, (budget - connections) // files_per_actor))
    return active, connections


def _raise_open_file_limit() -> int:
    """Raise the soft limit on open files as far as the system lets us; return the soft limit
    that applies. (macOS has no finite hard limit but refuses a soft one above OPEN_MAX.)"""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    finite = [hard] if hard != resource.RLIM_INFINITY else [1 << 20, 10_240]
    for target in finite:
        if target <= soft:
            break
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            break
        except (ValueError, OSError):
            continue
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _url(sock: trio.socket.SocketType) -> str:
    address, port = sock.getsockname()[:2]
    return f"http://[{address}]:{port}" if ":" in address else f"http://{address}:{port}"


class CannotServe(Exception):
    """A port cannot be bound, or the data directory made: the message says which."""


async def _listen(host: str, port: int) -> list[trio.SocketListener]:
    try:
        return await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        raise CannotServe(f"cannot serve on {host}:{port}: {exc}") from None


def _make_data_dir(data: Path) -> None:
    try:
        data.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CannotServe(f"cannot use {str(data)!r} as the data directory: {exc}") from None


async def serve(
    app: App,
    app_spec: str,
    data: Path,
    bind_host: str,
    port: int,
    host_options: dict[str, Any],
    limits: ServerLimits,
    limited: dict[str, Any] | None = None,
    cluster: ClusterOptions | None = None,
    admin: AdminOptions | None = None,
    access_log: bool = False,
) -> None:
    # Bind first: a port in use is reported before anything is made in the data directory.
    listeners = await _listen(bind_host, port)
    admin_listeners = [] if admin is None else await _listen(admin.host, admin.port)
    _make_data_dir(data)
    if limited:
        log.warning(
            "the open-file limit holds fewer actors and connections than asked; raise it "
            "with `ulimit -n`",
            **limited,
        )
    seen_cluster: ClusterView | None = None
    if cluster is None:
        host = Host(app, FileStorage(data), **host_options)
        beside_host = None
    else:  # the leases, group commits and internal port run beside the host, and outlive it
        from .cluster.serving import open_cluster_node

        node = await open_cluster_node(data, cluster)  # SystemExit with one line if it cannot
        host = Host(
            app,
            node.storage,
            router=node.router,
            alarm_index=lambda _: node.storage.alarms,
            **host_options,
        )
        beside_host = node.run
        seen_cluster = ClusterView(node.view, node.held, node.address)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:

        async def until_signal() -> None:
            async for signum in signals:
                log.info("shutting down", signal=signal.Signals(signum).name)
                return

        async with trio.open_nursery() as beside:
            if beside_host is not None:
                await beside.start(beside_host)
            also = []
            if admin is not None:
                also = [(admin_server(host, data, admin, seen_cluster), admin_listeners)]
            admin_urls = [_url(listener.socket) for listener in admin_listeners]
            try:
                async with trio.open_nursery() as nursery:
                    app_server = await nursery.start(
                        functools.partial(
                            serve_http,
                            host,
                            listeners,
                            limits,
                            until=until_signal,
                            also=also,
                            access_log=access_log,
                        )
                    )
                    if cluster is not None:  # WebSockets of actors served elsewhere: relayed
                        app_server.front_of = node.fronts.front_of
                        bound, bound_port = listeners[0].socket.getsockname()[:2]
                        await node.fronts.announce(node.fronts.url_for(bound, bound_port))
                    for admin_http, _ in also:  # its metrics count the app's connections
                        assert isinstance(admin_http.front, AdminFront)
                        admin_http.front.metrics.collector.server = app_server
                    if admin_urls:  # the CLI finds the admin API there (and the cluster)
                        write_admin_file(data, admin_urls[0])
                        if seen_cluster is not None:
                            await seen_cluster.announce(admin_urls[0])
                    else:  # this host holds the directory: an admin file there is stale
                        forget_admin_file(data, anyone=True)
                    # What the app, the runtime and their imports made lives as long as the
                    # process: out of the collector's sight, a full collection scans only what was
                    # made since (29 ms pauses under load down to under 2; decision 0019).
                    gc.freeze()
                    log.info(
                        "actorkeep serving",
                        app=app_spec,
                        urls=[_url(listener.socket) for listener in listeners],
                        **({"admin": admin_urls} if admin_urls else {}),
                        data=str(data),
                        classes=sorted(app.classes),
                        pid=os.getpid(),
                        max_active=host.max_active,
                        max_connections=limits.max_connections,
                        **(
                            {}
                            if cluster is None
                            else {
                                "cluster_partitions": cluster.partitions,
                                "internal": node.address,
                            }
                        ),
                    )
            finally:
                forget_admin_file(data)  # ours only: a host started since keeps its own
            if cluster is not None:  # a planned stop: what closed actors wrote is committed,
                await node.storage.settle()  # then the partitions are handed over
            beside.cancel_scope.cancel()
    log.info("stopped")


def cluster_options(args: argparse.Namespace) -> ClusterOptions | None:
    """The ``--cluster`` options checked (``ValueError``), or None for a single host."""
    if args.cluster is None:
        return None
    try:
        from .cluster.serving import options_from
    except ImportError as exc:  # psycopg, the cluster extra
        raise ValueError(f"--cluster needs the cluster extra ({exc})") from None
    return options_from(args)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="actorkeep", description=__doc__)
    parser.add_argument(
        "--version",
        action="version",
        version=f"actorkeep {importlib.metadata.version('actorkeep')}",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve", help="serve an app's actors over HTTP")
    p.add_argument("app", metavar="MODULE:APP")
    p.add_argument("--data", default="./data", help="data directory (default ./data)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port to bind (default 8080)")
    p.add_argument(
        "--access",
        action="append",
        default=[],
        metavar="CLASS=internal",
        help="refuse outside requests to CLASS (repeatable)",
    )
    p.add_argument("--idle-timeout", type=float, default=30.0, help="seconds (default 30)")
    p.add_argument("--max-active", type=int, default=10_000, help="actors in memory (10,000)")
    p.add_argument("--max-pending", type=int, default=1_000, help="waiting events (1,000)")
    p.add_argument("--max-body", type=int, default=1 << 20, help="request bytes (1 MiB)")
    p.add_argument(
        "--max-inflight",
        type=int,
        default=64 << 20,
        help="bytes of outside requests in flight, bodies and what they decode to (64 MiB)",
    )
    p.add_argument("--max-websockets", type=int, help="open WebSockets (half of --max-connections)")
    p.add_argument(
        "--max-websocket-message", type=int, default=1 << 20, help="message bytes (1 MiB)"
    )
    defaults = ServerLimits()
    p.add_argument(
        "--max-connections",
        type=int,
        default=defaults.max_connections,
        help=f"open client connections ({defaults.max_connections:,})",
    )
    p.add_argument(
        "--keep-alive-timeout",
        type=float,
        default=defaults.keep_alive_timeout,
        help=f"seconds an idle connection is kept ({defaults.keep_alive_timeout:g})",
    )
    p.add_argument(
        "--graceful-timeout",
        type=float,
        default=defaults.graceful_timeout,
        help=f"seconds running requests get at shutdown ({defaults.graceful_timeout:g})",
    )
    p.add_argument(
        "--debug",
        action="store_true",
        help="show outside clients the exception of a failed event (never in production)",
    )
    p.add_argument("--log-format", choices=["console", "json"], default="console")
    p.add_argument(
        "--log-level",
        choices=list(LOG_LEVELS),
        default="info",
        help="the least severe lines logged (default info)",
    )
    p.add_argument(
        "--access-log",
        action="store_true",
        help="log a line for each HTTP request answered: method, target, status, milliseconds",
    )
    p.add_argument(
        "--cluster",
        metavar="POSTGRES_URL",
        help="be a host of the cluster kept in this PostgreSQL database (decision 0016; "
        "needs the package's cluster extra)",
    )
    p.add_argument(
        "--partitions",
        type=int,
        default=1024,
        help="partitions of a cluster created now; checked against an existing one (1,024)",
    )
    p.add_argument("--lease-ttl", type=float, default=3.0, help="cluster lease seconds (3)")
    p.add_argument(
        "--lease-margin",
        type=float,
        default=1.0,
        help="seconds before a lease ends at which the host stops serving its partition (1)",
    )
    p.add_argument(
        "--internal",
        metavar="HOST:PORT",
        default="127.0.0.1:0",
        help="where this cluster host listens for the others' calls (127.0.0.1:0: loopback, "
        "a free port; use a private network's address between machines)",
    )
    p.add_argument(
        "--advertise",
        metavar="HOST:PORT",
        help="the address the other hosts dial for --internal (its bound address by default)",
    )
    p.add_argument(
        "--admin",
        metavar="HOST:PORT",
        help="serve the admin API (docs/operations.md) there, apart from the app's port",
    )
    p.add_argument(
        "--admin-token",
        help="what the admin API wants in `authorization: Bearer ...` (default: "
        f"${TOKEN_ENV}); needed to bind --admin beyond loopback",
    )
    p.add_argument(
        "--reload",
        action="store_true",
        help="for development: serve in a child process, started again whenever a .py file "
        "under the current directory changes",
    )
    commands.add_parsers(sub)
    migrate.add_parser(sub)
    q = sub.add_parser(
        "quarantine",
        help="list the actors quarantined for damaged storage, or release one",
        description="Works on a data directory no host is serving.",
    )
    q.add_argument("--data", default="./data", help="data directory (default ./data)")
    q.add_argument(
        "--release",
        metavar="ADDRESS",
        help="take ADDRESS out of quarantine; if its database is missing or empty, forget it "
        "too, so that its next event creates it afresh",
    )
    c = sub.add_parser(
        "clock",
        help="show the latest host time recorded, or forget it",
        description="Host time never goes back, not even across restarts (decision 0012): "
        "after the wall clock was wrong ahead, it stays ahead until this forgets it. Works on "
        "a data directory no host is serving.",
    )
    c.add_argument("--data", default="./data", help="data directory (default ./data)")
    c.add_argument(
        "--reset",
        action="store_true",
        help="forget the latest host time: the next start follows the wall clock",
    )
    args = parser.parse_args(argv)
    if args.command == "quarantine":
        raise SystemExit(repair.quarantine(Path(args.data).resolve(), args.release))
    if args.command == "clock":
        raise SystemExit(repair.clock(Path(args.data).resolve(), args.reset))
    if args.command == "migrate":
        raise SystemExit(migrate.run(args, load_app))
    if args.command in commands.COMMANDS:
        configure_logging("console", "warning")  # a host run by --app logs to stderr
        raise SystemExit(commands.run(args, load_app))
    if args.reload:
        from .reload import supervise

        given = list(sys.argv[1:] if argv is None else argv)
        raise SystemExit(
            supervise([a for a in given if a != "--reload"], Path(args.data).resolve())
        )
    configure_logging(args.log_format, args.log_level)
    if not 0 <= args.port <= 65535:
        parser.error("--port must be 0-65535")
    app = load_app(args.app)
    host_options: dict[str, Any] = {
        "access": parse_access(args.access),
        "idle_timeout": args.idle_timeout,
        "max_active": args.max_active,
        "max_pending": args.max_pending,
        "max_body": args.max_body,
        "max_inflight_bytes": args.max_inflight,
        "debug": args.debug,
    }
    sockets = args.max_websockets or max(1, args.max_connections // 2)
    data = Path(args.data).resolve()
    try:  # validate options before touching disk
        message = args.max_websocket_message
        send_buffer = max(message, SocketLimits().send_buffer)
        host_options["socket_limits"] = SocketLimits(sockets, sockets, message, send_buffer)
        Host(app, FileStorage(data), **host_options)
        limits = ServerLimits(
            max_connections=args.max_connections,
            keep_alive_timeout=args.keep_alive_timeout,
            graceful_timeout=args.graceful_timeout,
        )
        cluster = cluster_options(args)
        admin = admin_options(args.admin, args.admin_token)
    except ValueError as exc:
        raise SystemExit(f"actorkeep: {exc}") from None
    # Past the open-file limit actors would fail to open and connections to be accepted:
    # evict actors and close waiting connections before that instead.
    open_file_limit = _raise_open_file_limit()
    per_actor = FILES_PER_ACTOR if cluster is None else CLUSTER_FILES_PER_ACTOR
    active, connections = fit_open_files(
        args.max_active, args.max_connections, open_file_limit, per_actor
    )
    limited: dict[str, Any] = {}
    if (active, connections) != (args.max_active, args.max_connections):
        limited = {
            "open_file_limit": open_file_limit,
            "max_active": f"{active} (asked {args.max_active})",
            "max_connections": f"{connections} (asked {args.max_connections})",
            "defaults_need": FILES_RESERVED
            + p.get_default("max_active") * per_actor
            + defaults.max_connections,
        }
        host_options["max_active"] = active
        limits = dataclasses.replace(limits, max_connections=connections)
    try:
        trio.run(
            serve,
            app,
            args.app,
            data,
            args.host,
            args.port,
            host_options,
            limits,
            limited,
            cluster,
            admin,
            args.access_log,
        )
    except* DataDirInUse as group:
        raise SystemExit(f"actorkeep: {group.exceptions[0]}") from None
    except* CannotServe as group:
        raise SystemExit(f"actorkeep: {group.exceptions[0]}") from None


if __name__ == "__main__":
    main()
