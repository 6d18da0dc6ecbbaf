"""``actorkeep serve MODULE:APP``: one host process on hypercorn's trio worker (SPEC §11)."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import resource
import signal
import sys
from pathlib import Path
from typing import Any, cast

import structlog
import trio

from .app import App
from .asgi import AsgiApp
from .front import Front
from .host import Host
from .storage import DataDirInUse, FileStorage

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


def configure_logging(fmt: str) -> None:
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.dict_tracebacks if fmt == "json" else structlog.dev.set_exc_info,
            renderer,
        ],
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)


#: Descriptors an actor in memory holds: its database, its WAL and its shared-memory index.
FILES_PER_ACTOR = 3
#: Descriptors kept for the rest: the host database, sockets, the interpreter's own.
FILES_RESERVED = 256


def max_active_for(max_active: int, open_file_limit: int) -> int:
    """``max_active``, lowered to what ``open_file_limit`` descriptors can hold."""
    if open_file_limit == resource.RLIM_INFINITY:
        return max_active
    return max(1, min(max_active, (open_file_limit - FILES_RESERVED) // FILES_PER_ACTOR))


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


def hypercorn_config(bind_host: str, port: int) -> Any:
    """How ``actorkeep serve`` configures hypercorn (the benchmarks use it too)."""
    from hypercorn.config import Config

    config = Config()
    config.bind = [f"{bind_host}:{port}"]
    config.accesslog = None  # structlog reports what matters; an access log costs per request
    config.errorlog = None
    config.graceful_timeout = 5.0
    config.keep_alive_timeout = 30.0
    return config


async def serve(
    app: App,
    app_spec: str,
    data: Path,
    bind_host: str,
    port: int,
    host_options: dict[str, Any],
    limited: dict[str, Any] | None = None,
) -> None:
    from hypercorn.trio import serve as hypercorn_serve

    limited = limited or {}
    host = Host(app, FileStorage(data), **host_options)
    config = hypercorn_config(bind_host, port)
    async with host.open():
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:

            async def shutdown_trigger() -> None:
                async for signum in signals:
                    log.info("shutting down", signal=signal.Signals(signum).name)
                    return

            async with trio.open_nursery() as nursery:
                urls = await nursery.start(
                    lambda task_status: hypercorn_serve(
                        cast(Any, AsgiApp(Front(host))),
                        config,
                        shutdown_trigger=shutdown_trigger,
                        task_status=task_status,
                    )
                )
                log.info(
                    "actorkeep serving",
                    app=app_spec,
                    urls=urls,
                    data=str(data),
                    classes=sorted(app.classes),
                    pid=os.getpid(),
                    max_active=host.max_active,
                    **limited,
                )
    log.info("stopped")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="actorkeep", description=__doc__)
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
    p.add_argument("--log-format", choices=["console", "json"], default="console")
    args = parser.parse_args(argv)
    configure_logging(args.log_format)
    if not 0 <= args.port <= 65535:
        parser.error("--port must be 0-65535")
    app = load_app(args.app)
    host_options: dict[str, Any] = {
        "access": parse_access(args.access),
        "idle_timeout": args.idle_timeout,
        "max_active": args.max_active,
        "max_pending": args.max_pending,
        "max_body": args.max_body,
    }
    data = Path(args.data).resolve()
    try:
        Host(app, FileStorage(data), **host_options)  # validate options before touching disk
    except ValueError as exc:
        raise SystemExit(f"actorkeep: {exc}") from None
    try:
        data.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SystemExit(
            f"actorkeep: cannot use {str(data)!r} as the data directory: {exc}"
        ) from None
    # Past the open-file limit actors would fail to open (500): evict before that instead.
    open_file_limit = _raise_open_file_limit()
    host_options["max_active"] = max_active_for(args.max_active, open_file_limit)
    limited: dict[str, Any] = {}
    if host_options["max_active"] < args.max_active:
        limited = {"max_active_asked": args.max_active, "open_file_limit": open_file_limit}
    try:
        trio.run(serve, app, args.app, data, args.host, args.port, host_options, limited)
    except* DataDirInUse as group:
        raise SystemExit(f"actorkeep: {group.exceptions[0]}") from None
    except* OSError as group:
        first = group.exceptions[0]
        raise SystemExit(f"actorkeep: cannot serve on {args.host}:{args.port}: {first}") from None


if __name__ == "__main__":
    main()
