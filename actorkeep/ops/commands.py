"""The CLI's operations commands: ``ls``, ``show``, ``sql``, ``alarms``, ``rm`` and ``backup``
(docs/operations.md).

Each works against a running host, through its admin API, and on a data directory no host
serves. Human-readable tables by default; ``--json`` prints the admin API's own document.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .backup import check_destination
from .inspect import InspectError, address_prefix, page_size
from .source import Source, SourceError, open_source

COMMANDS = ("ls", "show", "sql", "alarms", "rm", "backup")


def add_parsers(sub: Any) -> None:
    """Add the operations commands to the CLI's subcommands."""

    def command(name: str, help: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=help, description=help)
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
    p = command("rm", "delete an actor's database and its alarm (no host may serve --data)")
    p.add_argument("address", metavar="ADDRESS", help="CLASS/NAME")
    p = command("backup", "copy every actor's database to DEST, while the host runs or not")
    p.add_argument("dest", metavar="DEST", help="a new or empty directory")


def paged(p: argparse.ArgumentParser, what: str, cursor: str) -> None:
    """``--after`` and ``--limit`` of a command that lists ``what`` a page at a time."""
    p.add_argument("--after", metavar=cursor, help=f"the page after this {cursor.lower()}")
    p.add_argument("--limit", type=int, help=f"{what} per page (100; at most 1,000)")


def run(args: argparse.Namespace) -> int:
    """Run the operations command ``args.command``: its exit status."""
    try:
        with open_source(Path(args.data).resolve(), args.admin, args.admin_token) as source:
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


_SHOW: dict[str, Callable[[dict[str, Any]], None]] = {
    "ls": _show_ls,
    "show": _show_show,
    "sql": _show_sql,
    "alarms": _show_alarms,
    "rm": lambda answer: print(f"deleted {answer['deleted']} ({answer['bytes']:,} bytes)"),
    "backup": _show_backup,
}
