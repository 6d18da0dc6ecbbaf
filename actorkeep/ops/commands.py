"""The CLI's operations commands: ``ls``, ``show``, ``sql``, ``alarms``, ``rm``, ``backup``,
``queue stats|dead|get|redrive|cancel`` and ``kv get|list`` (docs/operations.md).

Each works against a running host, through its admin API, and on a data directory no host
serves. Human-readable tables by default; ``--json`` prints the admin API's own document.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import functools
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..app import App
from .backup import check_destination
from .inspect import InspectError, address_prefix, page_size
from .source import Source, SourceError, open_source

COMMANDS = ("ls", "show", "sql", "alarms", "rm", "backup", "queue", "kv", "cluster")


def add_parsers(sub: Any) -> None:
    """Add the operations commands to the CLI's subcommands."""

    def command(name: str, help: str, within: Any = sub) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = within.add_parser(name, help=help, description=help)
        p.add_argument("--data", default="./data", help="data directory (default ./data)")
        p.add_argument(
            "--admin",
            metavar="URL",
            help="a host's admin API (http://HOST:PORT); by default the one the host serving "
            "--data wrote there, or the directory itself when no host serves it",
        )
        p.add_argument(
            "--admin-token", help="the admin API's token (default: $ACTORKEEP_ADMIN_TOKEN)"
        )
        p.add_argument("--json", action="store_true", help="print JSON, for scripts")
        return p

    p = command("ls", "list actors, in address order, a page at a time")
    p.add_argument("cls", nargs="?", metavar="CLASS", help="only this class's actors")
    p.add_argument("--prefix", default="", help="only names (or addresses) starting with this")
    paged(p, "actors", "ADDRESS")
    p = command("show", "one actor: its file, tables with row counts, and its alarm")
    p.add_argument("address", metavar="ADDRESS", help="CLASS/NAME")
    p = command("sql", "run one read-only SQL statement on an actor's database")
    p.add_argument("address", metavar="ADDRESS", help="CLASS/NAME")
    p.add_argument("statement", metavar="SQL")
    p.add_argument(
        "--param", action="append", default=[], help="a value for the next ? (repeatable)"
    )
    p = command("alarms", "list pending alarms, soonest first")
    p.add_argument("--due", action="store_true", help="only alarms due now")
    paged(p, "alarms", "CURSOR")
    p = command("rm", "delete an idle actor's database and its alarm, while the host runs or not")
    p.add_argument("address", metavar="ADDRESS", help="CLASS/NAME")
    p = command("backup", "copy every actor's database to DEST, while the host runs or not")
    p.add_argument("dest", metavar="DEST", help="a new or empty directory")
    add_ready_parsers(sub, command)
    command("cluster", "a cluster's hosts and who holds each partition, as a host sees it")


def add_ready_parsers(sub: Any, command: Callable[..., argparse.ArgumentParser]) -> None:
    """``actorkeep queue ...`` and ``actorkeep kv ...``."""
    about = "a queue's counts, dead letters and messages; redrive and cancel"
    queue = sub.add_parser("queue", help=about, description=about)
    actions = queue.add_subparsers(dest="action", required=True, metavar="ACTION")

    def on_queue(name: str, help: str) -> argparse.ArgumentParser:
        p = command(name, help, actions)
        p.add_argument("queue", metavar="QUEUE", help="the queue's address, CLASS/NAME")
        return p

    on_queue("stats", "messages by state, and the age of the oldest ready one")
    p = on_queue("dead", "dead letters, oldest first, with why they failed")
    paged(p, "dead letters", "ID")
    on_queue("get", "one message, wherever it is").add_argument("id", type=int, metavar="ID")
    app_help = "on a stopped host's directory: the app, whose host runs the change (MODULE:APP)"
    p = on_queue("redrive", "send dead letters back to the queue (every one, or the IDs given)")
    p.add_argument("ids", type=int, nargs="*", metavar="ID")
    p.add_argument("--all", action="store_true", help="every dead letter (no IDs given)")
    p.add_argument("--app", metavar="MODULE:APP", help=app_help)
    p = on_queue("cancel", "delete a waiting message")
    p.add_argument("id", type=int, metavar="ID")
    p.add_argument("--app", metavar="MODULE:APP", help=app_help)

    about = "read a KV namespace (its shard actors): one key, or keys by prefix"
    kv = sub.add_parser("kv", help=about, description=about)
    actions = kv.add_subparsers(dest="action", required=True, metavar="ACTION")

    def on_kv(name: str, help: str) -> argparse.ArgumentParser:
        p = command(name, help, actions)
        p.add_argument("cls", metavar="CLASS", help="the KV shard class (app.mount's name)")
        p.add_argument(
            "--shards", type=int, help="the shard count the app's ak.kv.Client uses (16)"
        )
        return p

    on_kv("get", "one key's value, version and expiry").add_argument("key", metavar="KEY")
    p = on_kv("list", "keys in byte order, a page at a time")
    p.add_argument("--prefix", default="", help="only keys starting with this")
    paged(p, "keys", "KEY")


def paged(p: argparse.ArgumentParser, what: str, cursor: str) -> None:
    """``--after`` and ``--limit`` of a command that lists ``what`` a page at a time."""
    p.add_argument("--after", metavar=cursor, help=f"the page after this {cursor.lower()}")
    p.add_argument("--limit", type=int, help=f"{what} per page (100; at most 1,000)")


def run(args: argparse.Namespace, load_app: Callable[[str], App]) -> int:
    """Run the operations command ``args.command``: its exit status. ``load_app`` imports the
    ``--app`` a queue write on a stopped host's directory runs with."""
    spec = getattr(args, "app", None)
    app = None if spec is None else functools.partial(load_app, spec)
    try:
        data = Path(args.data).resolve()
        with open_source(data, args.admin, args.admin_token, app) as source:
            answer = _ASK[args.command](source, args)
    except (InspectError, SourceError) as exc:
        print(f"actorkeep {args.command}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(answer, indent=2))
    else:
        _SHOW[args.command](answer)
    return 1 if answer.get("failed") else 0  # a backup that left files out


def _ask_ls(source: Source, args: argparse.Namespace) -> dict[str, Any]:
    return source.actors(address_prefix(args.cls, args.prefix), args.after, page_size(args.limit))


def _ask_show(source: Source, args: argparse.Namespace) -> dict[str, Any]:
    return source.show(args.address)


def _ask_sql(source: Source, args: argparse.Namespace) -> dict[str, Any]:
    return source.sql(args.address, args.statement, [_param(p) for p in args.param])


def _ask_alarms(source: Source, args: argparse.Namespace) -> dict[str, Any]:
    return source.alarms(args.due, args.after, page_size(args.limit))


def _ask_rm(source: Source, args: argparse.Namespace) -> dict[str, Any]:
    return source.remove(args.address)


def _ask_backup(source: Source, args: argparse.Namespace) -> dict[str, Any]:
    return source.backup(check_destination(Path(os.path.abspath(args.dest))))


def _ask_queue(source: Source, args: argparse.Namespace) -> dict[str, Any]:
    q, action = args.queue, args.action
    if action == "stats":
        return source.queue_stats(q)
    if action == "dead":
        return source.queue_dead(q, args.after and int(args.after), page_size(args.limit))
    if action == "get":
        return source.queue_get(q, args.id)
    if action == "redrive":
        if bool(args.ids) == args.all:
            raise InspectError("give the IDs of the dead letters to redrive, or --all")
        return source.queue_redrive(q, args.ids or None)
    return source.queue_cancel(q, args.id)


def _ask_kv(source: Source, args: argparse.Namespace) -> dict[str, Any]:
    if args.action == "get":
        return source.kv_get(args.cls, args.shards, args.key)
    return source.kv_list(args.cls, args.shards, args.prefix, args.after, page_size(args.limit))


def _param(text: str) -> object:
    """A ``--param`` value: a number if it reads as one, else the text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


_ASK: dict[str, Callable[[Source, argparse.Namespace], dict[str, Any]]] = {
    "ls": _ask_ls,
    "show": _ask_show,
    "sql": _ask_sql,
    "alarms": _ask_alarms,
    "rm": _ask_rm,
    "backup": _ask_backup,
    "queue": _ask_queue,
    "kv": _ask_kv,
    "cluster": lambda source, args: source.cluster(),
}


# -- printing ---------------------------------------------------------------------------------
def when(seconds: float | None) -> str:
    """A host time as an ISO date, to the second, in UTC."""
    if seconds is None:
        return "-"
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Columns padded to their widest cell."""
    cells = [[str(c) for c in header]] + [[_cell(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def _opt(value: object) -> str:
    """An optional name (a message's key, group or worker): ``-`` when there is none."""
    return "-" if value is None else str(value)


def _cell(value: object) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, dict) and "base64" in value:
        return f"<blob base64:{str(value['base64'])[:16]}...>"
    if isinstance(value, dict) and "float" in value:
        return str(value["float"])
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _show_ls(page: dict[str, Any]) -> None:
    rows = [
        (
            a["address"],
            when(a["created_at"]),
            "yes" if a["active"] else "",
            a["quarantined"] or "",
        )
        for a in page["actors"]
    ]
    print(table(("ADDRESS", "CREATED", "IN MEMORY", "QUARANTINED"), rows))
    if page["next"] is not None:
        print(f"(more: --after {page['next']})")


def _show_show(about: dict[str, Any]) -> None:
    alarm = about["alarm"]
    print(about["address"])
    print(f"  file       {about['file']} ({about['bytes']:,} bytes)")
    print(f"  created    {when(about['created_at'])}")
    print(f"  in memory  {'yes' if about['active'] else 'no'}")
    if about["quarantined"]:
        print(f"  QUARANTINED  {about['quarantined']}")
    where = about.get("cluster")
    if where is not None:
        print(
            f"  partition  {where['partition']} (epoch {where['epoch']}, held by {where['owner']})"
        )
    if alarm is None:
        print("  alarm      none")
    else:
        print(
            f"  alarm      {when(alarm['at'])} (set {when(alarm['scheduled_at'])}, "
            f"retries {alarm['retries']})"
        )
    rows = [
        (t["name"] + (" (runtime)" if t["internal"] else ""), _count(t["rows"]))
        for t in about["tables"]
    ]
    print("  " + table(("TABLE", "ROWS"), rows).replace("\n", "\n  "))


def _count(rows: int | None) -> str:
    return "over 1,000,000" if rows is None else f"{rows:,}"


def _show_sql(answer: dict[str, Any]) -> None:
    print(table(answer["columns"], answer["rows"]))
    if answer["truncated"]:
        print(f"(first {len(answer['rows']):,} rows)")


def _show_backup(answer: dict[str, Any]) -> None:
    print(f"copied {answer['actors']:,} actors ({answer['bytes']:,} bytes) to {answer['dest']}")
    for failure in answer["failed"]:
        print(f"  NOT COPIED {failure['file']}: {failure['error']}")
    if answer["failed"]:
        print("(serve the copy with `actorkeep serve --data DEST` only once these are dealt with)")


def _show_alarms(page: dict[str, Any]) -> None:
    now = page["now"]
    rows = [(when(a["at"]), "yes" if a["at"] <= now else "", a["address"]) for a in page["alarms"]]
    print(table(("AT", "DUE", "ADDRESS"), rows))
    if page["next"] is not None:
        print(f"(more: --after '{page['next']}')")


def _show_queue(answer: dict[str, Any]) -> None:
    if "ready" in answer:
        counts = [(answer[k], k) for k in ("ready", "delayed", "leased", "dead")]
        print(answer["queue"])
        print("  " + table(("MESSAGES", "STATE"), counts).replace("\n", "\n  "))
        age = answer["oldest_ready_age"]
        print(f"  oldest ready: {'-' if age is None else f'{age:.1f} s'}")
        keys, groups, schedules = answer["keys"], answer["groups"], answer["schedules"]
        print(f"  keys: {keys:,}   groups: {groups:,}   recurring sends: {schedules:,}")
    elif "items" in answer:
        rows = [
            (
                d["id"],
                d["attempts"],
                when(d["failed_at"]),
                d["reason"],
                _opt(d["worker"]),
                preview(d["body"]),
            )
            for d in answer["items"]
        ]
        print(table(("ID", "ATTEMPTS", "FAILED", "REASON", "WORKER", "BODY"), rows))
        if answer["next"] is not None:
            print(f"(more: --after {answer['next']})")
    elif "message" in answer:
        m = answer["message"]
        for k in ("id", "state", "attempts", "priority", "last_error"):
            print(f"{k:12} {_cell(m[k])}")
        for k in ("max_attempts", "key", "group", "worker"):
            print(f"{k:12} {_opt(m[k])}")
        for k in ("enqueued_at", "visible_at", "failed_at", "expires_at"):
            print(f"{k:12} {when(m[k])}")
        print(f"{'body':12} {preview(m['body'], 400)}")
    elif "redriven" in answer:
        print(f"redrove {answer['redriven']:,} dead letters of {answer['queue']}")
    else:
        done = "cancelled" if answer["cancelled"] else "not cancelled (not waiting, or gone)"
        print(f"message {answer['id']} of {answer['queue']}: {done}")


def _show_kv(answer: dict[str, Any]) -> None:
    entries = answer["entries"] if "entries" in answer else [answer["entry"]]
    if entries == [None]:
        print("(no such key)")
        return
    rows = [
        (preview(e["key"]), e["version"], when(e["expires_at"]), preview(e["value"]))
        for e in entries
    ]
    print(table(("KEY", "VERSION", "EXPIRES", "VALUE"), rows))
    if answer.get("next") is not None:
        print(f"(more: --after '{answer['next']}')")


def preview(value: object, width: int = 60) -> str:
    """A stored value as text: itself if it is text, else its size."""
    if isinstance(value, dict) and "base64" in value:
        return f"<{len(base64.b64decode(value['base64'])):,} bytes>"
    text = str(value["text"] if isinstance(value, dict) else value).replace("\n", " ")
    return text if len(text) <= width else text[: width - 3] + "..."


def _show_cluster(view: dict[str, Any]) -> None:
    rows = [
        (
            h["host_id"] + (" (this host)" if h["this"] else ""),
            h["address"] or "-",
            f"{h['seen_ago']:.1f} s ago",
            h["partitions"],
        )
        for h in view["hosts"]
    ]
    print(f"{view['partitions']:,} partitions, {view['unowned']:,} held by no host")
    print(table(("HOST", "INTERNAL ADDRESS", "SEEN", "PARTITIONS"), rows))


_SHOW: dict[str, Callable[[dict[str, Any]], None]] = {
    "ls": _show_ls,
    "show": _show_show,
    "sql": _show_sql,
    "alarms": _show_alarms,
    "rm": lambda answer: print(f"deleted {answer['deleted']} ({answer['bytes']:,} bytes)"),
    "backup": _show_backup,
    "queue": _show_queue,
    "kv": _show_kv,
    "cluster": _show_cluster,
}
