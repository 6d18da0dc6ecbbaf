"""The dashboard's HTML: one layout, tables, forms and a chart, rendered on the server with
nothing fetched from elsewhere (decision 0021). Every value shown goes through ``esc``."""

from __future__ import annotations

import datetime
import html
from collections.abc import Iterable, Mapping, Sequence
from urllib.parse import quote, urlencode

from ..http import Response
from .inspect import InspectError

NAV = (
    ("/", "Overview"),
    ("/actors", "Actors"),
    ("/alarms", "Alarms"),
    ("/queues", "Queues"),
    ("/kv", "KV"),
    ("/cluster", "Cluster"),
)

STYLE = """
:root { --ink: #1d2330; --muted: #6b7385; --line: #e3e6ec; --soft: #f5f6f9; --accent: #2f5fd0;
  --ok: #1f8a4c; --warn: #b46a00; --bad: #c0392b; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif;
  color: var(--ink); background: #fff; }
header { display: flex; align-items: center; gap: 24px; padding: 10px 24px;
  border-bottom: 1px solid var(--line); background: var(--soft); }
header b { font-size: 15px; letter-spacing: .02em; }
header nav a { margin-right: 16px; color: var(--muted); text-decoration: none; }
header nav a.here { color: var(--ink); font-weight: 600; }
main { padding: 18px 24px 40px; max-width: 1200px; }
h1 { font-size: 20px; margin: 4px 0 14px; }
h2 { font-size: 15px; margin: 26px 0 8px; }
a { color: var(--accent); }
.cards { display: flex; flex-wrap: wrap; gap: 12px; margin-bottom: 8px; }
.card { border: 1px solid var(--line); border-radius: 8px; padding: 10px 14px; min-width: 140px; }
.card .n { font-size: 22px; font-weight: 600; }
.card .l { color: var(--muted); font-size: 12px; }
.card.bad .n { color: var(--bad); }
table { border-collapse: collapse; width: 100%; margin: 4px 0 8px; }
th, td { text-align: left; padding: 6px 10px; border-bottom: 1px solid var(--line);
  vertical-align: top; }
th { font-size: 12px; color: var(--muted); font-weight: 600; background: var(--soft); }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
code, pre, td.mono { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 13px; }
pre { background: var(--soft); padding: 8px 10px; border-radius: 6px; overflow-x: auto;
  white-space: pre-wrap; word-break: break-all; margin: 0; }
form.inline { display: flex; gap: 8px; align-items: center; flex-wrap: wrap; margin: 8px 0; }
input, select, textarea, button { font: inherit; padding: 5px 8px; border: 1px solid #c9ced8;
  border-radius: 6px; background: #fff; }
textarea { width: 100%; min-height: 70px; font-family: ui-monospace, monospace; }
button, .button { background: var(--accent); color: #fff; border-color: var(--accent);
  cursor: pointer; text-decoration: none; padding: 5px 10px; border-radius: 6px;
  display: inline-block; }
button.danger, .button.danger { background: var(--bad); border-color: var(--bad); }
.button.quiet { background: #fff; color: var(--ink); border: 1px solid #c9ced8; }
.muted { color: var(--muted); }
.notice { border-left: 4px solid var(--ok); background: #eef8f1; padding: 8px 12px;
  margin: 0 0 14px; }
.error { border-left: 4px solid var(--bad); background: #fcefed; padding: 8px 12px;
  margin: 0 0 14px; }
.tag { font-size: 12px; padding: 1px 7px; border-radius: 10px; background: var(--soft);
  border: 1px solid var(--line); }
.tag.bad { color: var(--bad); border-color: #f0c4bf; }
.tag.ok { color: var(--ok); border-color: #bfe3cc; }
svg.chart { border: 1px solid var(--line); border-radius: 8px; background: #fff; }
.legend span { margin-right: 14px; font-size: 12px; }
.legend i { display: inline-block; width: 10px; height: 10px; border-radius: 2px;
  margin-right: 4px; vertical-align: -1px; }
"""

#: The chart's colour of each queue state.
STATE_COLOURS = {"ready": "#2f5fd0", "delayed": "#8e6ad8", "leased": "#1f8a4c", "dead": "#c0392b"}


def esc(value: object) -> str:
    """``value`` as HTML text."""
    return html.escape(str(value), quote=True)


def link(path: str, **query: object) -> str:
    """The URL of ``path`` (each segment quoted) with ``query`` (None and "" left out)."""
    wanted = {k: v for k, v in query.items() if v is not None and v != ""}
    return quote(path, safe="/") + ("?" + urlencode(wanted) if wanted else "")


def href(path: str, **query: object) -> str:
    """``link`` as an HTML attribute value."""
    return esc(link(path, **query))


def button(url: str, label: str, kind: str = "") -> str:
    """A link that looks like a button (``kind``: "danger" or "quiet")."""
    return f'<a class="button {kind}" href="{esc(url)}">{esc(label)}</a>'


def tag(text: object, kind: str = "") -> str:
    """A small label (``kind``: "ok" or "bad")."""
    return f'<span class="tag {kind}">{esc(text)}</span>'


def page(
    title: str,
    here: str,
    body: str,
    status: int = 200,
    refresh: int | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    """A whole page: the navigation, ``body``; ``refresh``: reload every that many seconds."""
    nav = "".join(
        f'<a href="{p}"{" class=here" if p == here else ""}>{esc(label)}</a>' for p, label in NAV
    )
    meta = f'<meta http-equiv="refresh" content="{refresh}">' if refresh else ""
    document = (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"{meta}<title>{esc(title)} · actorkeep</title><style>{STYLE}</style></head>"
        f"<body><header><b>actorkeep</b><nav>{nav}</nav></header><main>{body}</main></body></html>"
    )
    return Response(
        status,
        {
            "content-type": "text/html; charset=utf-8",
            "cache-control": "no-store",
            # No scripts, no frames, nothing from elsewhere: the page is all there is.
            "content-security-policy": "default-src 'none'; style-src 'unsafe-inline'; "
            "img-src 'self'; form-action 'self'; frame-ancestors 'none'",
            "x-content-type-options": "nosniff",
            "referrer-policy": "same-origin",  # "no-referrer" would make form posts Origin: null
            **(headers or {}),
        },
        document.encode(),
    )


def error_page(status: int, message: str, here: str = "") -> Response:
    return page(
        "Error", here, f"<h1>Error {status}</h1><div class=error>{esc(message)}</div>", status
    )


def table(header: Sequence[str], rows: Iterable[Sequence[str]], numeric: Sequence[int] = ()) -> str:
    """A table of cells already rendered as HTML; ``numeric``: columns aligned right."""
    head = "".join(
        f"<th{' class=num' if i in numeric else ''}>{esc(h)}</th>" for i, h in enumerate(header)
    )
    body = "".join(
        "<tr>"
        + "".join(f"<td{' class=num' if i in numeric else ''}>{c}</td>" for i, c in enumerate(row))
        + "</tr>"
        for row in rows
    )
    if not body:
        body = f'<tr><td colspan="{len(header)}" class=muted>none</td></tr>'
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def cards(items: Iterable[tuple[str, object, bool]]) -> str:
    """Big numbers: (label, value, whether it is bad news)."""
    return (
        "<div class=cards>"
        + "".join(
            f'<div class="card{" bad" if bad else ""}"><div class=n>{esc(value)}</div>'
            f"<div class=l>{esc(label)}</div></div>"
            for label, value, bad in items
        )
        + "</div>"
    )


def when(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def blob(value: object, width: int = 120) -> str:
    """A body, key or value (``{"text": ...}`` or ``{"base64": ...}``) as HTML."""
    if isinstance(value, dict) and "text" in value:
        text = str(value["text"])
        cut = text if len(text) <= width else text[: width - 1] + "…"
        return f"<code>{esc(cut)}</code>"
    if isinstance(value, dict) and "base64" in value:
        size = len(str(value["base64"])) * 3 // 4
        return f"<span class=muted>binary, about {size:,} bytes</span>"
    return esc(value)


def cell(value: object, width: int = 80) -> str:
    """A SQL value as HTML."""
    if value is None:
        return "<span class=muted>NULL</span>"
    if isinstance(value, dict) and "base64" in value:
        return blob(value)
    text = str(value)
    return esc(text if len(text) <= width else text[: width - 1] + "…")


def hidden(fields: Mapping[str, object]) -> str:
    return "".join(
        f'<input type=hidden name="{esc(k)}" value="{esc(v)}">' for k, v in fields.items()
    )


def chart(
    samples: Sequence[tuple[float, dict[str, int]]], width: int = 760, height: int = 180
) -> str:
    """Counts by state over time: one line per state, as inline SVG."""
    if len(samples) < 2:
        return (
            "<p class=muted>The chart fills in as the counts are asked: this page refreshes "
            "every 5 s while it is open, and each Prometheus scrape adds a point.</p>"
        )
    pad = 30
    t0, t1 = samples[0][0], samples[-1][0]
    top = max(1, *(max(counts.values()) for _, counts in samples))
    span = max(t1 - t0, 1e-9)

    def x(t: float) -> float:
        return pad + (t - t0) / span * (width - 2 * pad)

    def y(n: int) -> float:
        return height - pad + 10 - n / top * (height - 2 * pad)

    lines = []
    for state, colour in STATE_COLOURS.items():
        points = " ".join(f"{x(t):.1f},{y(c.get(state, 0)):.1f}" for t, c in samples)
        lines.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{points}">'
            f"<title>{state}</title></polyline>"
        )
    axis = (
        f'<line x1="{pad}" y1="{y(0):.1f}" x2="{width - pad}" y2="{y(0):.1f}" stroke="#c9ced8"/>'
        f'<text x="4" y="{y(top) + 4:.1f}" font-size="11" fill="#6b7385">{top:,}</text>'
        f'<text x="4" y="{y(0) + 4:.1f}" font-size="11" fill="#6b7385">0</text>'
        f'<text x="{pad}" y="{height - 4}" font-size="11" fill="#6b7385">{when(t0)}</text>'
        f'<text x="{width - pad}" y="{height - 4}" font-size="11" fill="#6b7385" '
        f'text-anchor="end">{when(t1)}</text>'
    )
    legend = "".join(
        f'<span><i style="background:{c}"></i>{s}</span>' for s, c in STATE_COLOURS.items()
    )
    return (
        f'<svg class=chart role=img aria-label="messages by state" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}">{axis}{"".join(lines)}</svg>'
        f"<div class=legend>{legend}</div>"
    )


def query_int(query: Mapping[str, str], key: str) -> int | None:
    """``query[key]`` as an int, None if absent or empty (``InspectError`` if not a number)."""
    value = query.get(key)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise InspectError(f"{key} must be an integer, got {value!r}") from None


def form_id(form: Mapping[str, str]) -> int:
    """The message id a form names (``InspectError`` if none)."""
    found = query_int(form, "id")
    if found is None:
        raise InspectError("want the message's id")
    return found
