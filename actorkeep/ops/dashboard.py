"""The dashboard: the admin listener's pages for people (docs/operations.md).

Overview, actors by class and prefix, one actor with a read-only SQL box, alarms, queues (counts
over time, dead letters, redrive and cancel after a confirmation page) and KV by prefix. Every
page is rendered here from what the admin API answers; the only writes are the queue's redrive
and cancel, each a POST from a confirmation page (decision 0021).
"""

from __future__ import annotations

import collections
import hmac
from typing import Any, Protocol

import trio

from ..http import Response, parse_query
from ..runtime.host import Host
from ..wire import kv as kv_wire
from . import pages
from .cluster_view import ClusterView
from .inspect import InspectError
from .pages import blob, button, cell, esc, href, link, query_int, table, when
from .queue_pages import QueuePages
from .ready import Ready, speaks


class Admin(Protocol):
    """What the pages read: the admin API's answers (``AdminFront``)."""

    host: Host
    ready: Ready

    cluster: ClusterView | None

    async def actors(self, query: dict[str, str]) -> dict[str, Any]: ...

    async def alarms(self, query: dict[str, str]) -> dict[str, Any]: ...

    async def show(self, address: str, forward: bool = True) -> dict[str, Any]: ...

    async def sql(
        self, address: str, sql: str, params: list[Any], forward: bool = True
    ) -> dict[str, Any]: ...


COOKIE = "actorkeep_admin"
MAX_FORM = 4096


class Dashboard:
    """The pages of ``front``'s host."""

    def __init__(self, front: Admin) -> None:
        self.front = front
        self.queue_pages = QueuePages(front.host, front.ready)
        self.record = self.queue_pages.record
        #: (monotonic time, events by class, errors by class) at each overview.
        self._rates: collections.deque[tuple[float, dict[str, tuple[int, int]]]] = (
            collections.deque(maxlen=120)
        )

    async def handle(self, method: str, path: str, query: dict[str, str], body: bytes) -> Response:
        """One page, or one of the dashboard's two forms."""
        try:
            if method == "POST":
                return await self._post(path, body)
            if method != "GET":
                return pages.error_page(405, "the dashboard takes GET, and POST from its forms")
            if path == "/":
                return self.overview()
            if path == "/favicon.ico":
                return Response(204, {"cache-control": "max-age=86400"})
            if path == "/actors":
                return await self.actors(query)
            if path.startswith("/actors/"):
                return await self.actor(path[len("/actors/") :], query)
            if path == "/alarms":
                return await self.alarms(query)
            if path == "/queues":
                return await self.queue_pages.queues()
            if path.startswith("/queues/"):
                return await self.queue_pages.queue_page(path[len("/queues/") :].split("/"), query)
            if path == "/kv":
                return await self.kv(query)
            if path == "/cluster":
                return await self.cluster(query)
        except InspectError as exc:
            return pages.error_page(exc.status, str(exc))
        return pages.error_page(404, "no such page")

    async def _post(self, path: str, body: bytes) -> Response:
        if len(body) > MAX_FORM:
            return pages.error_page(413, "form too large")
        form = parse_query(body.decode("utf-8", "replace"))
        parts = path.split("/")
        if len(parts) == 5 and parts[1] == "queues" and parts[4] in ("redrive", "cancel"):
            return await self.queue_pages.post(f"{parts[2]}/{parts[3]}", parts[4], form)
        return pages.error_page(404, "no such form")

    def overview(self) -> Response:
        host = self.front.host
        stats = host.stats
        totals = {}
        for name, of_class in stats.classes.items():
            events = sum(h.count for h in of_class.latency.values())
            totals[name] = (events, sum(of_class.failed.values()))
        now = trio.current_time()
        self._rates.append((now, totals))
        base = next((s for s in self._rates if now - s[0] <= 60 and s[0] < now - 0.5), None)
        active = collections.Counter(a.actor_class.name for a in host.activations)
        rows = []
        for name in sorted(host.classes):
            c = host.classes[name]
            events, errors = totals.get(name, (0, 0))
            rate = "-"
            if base is not None:
                before = base[1].get(name, (0, 0))[0]
                rate = f"{(events - before) / (now - base[0]):.1f}"
            rows.append(
                (
                    f'<a href="{href("/actors", **{"class": name})}">{esc(name)}</a>',
                    esc(c.cls.__module__ + "." + c.cls.__qualname__),
                    esc(c.access)
                    + (" · allow " + esc(", ".join(sorted(c.allow))) if c.allow else ""),
                    f"{active.get(name, 0):,}",
                    f"{events:,}",
                    f'<span class="{"tag bad" if errors else ""}">{errors:,}</span>',
                    rate,
                )
            )
        all_events = sum(e for e, _ in totals.values())
        all_errors = sum(f for _, f in totals.values())
        window = "" if base is None else f" (last {now - base[0]:.0f} s)"
        rate_all = "-"
        if base is not None:
            rate_all = f"{(all_events - sum(e for e, _ in base[1].values())) / (now - base[0]):.1f}"
        body = (
            "<h1>Overview</h1>"
            + pages.cards(
                [
                    ("actors in memory", f"{len(host.activations):,}", False),
                    ("events", f"{all_events:,}", False),
                    ("failed events", f"{all_errors:,}", all_errors > 0),
                    ("events/s" + window, rate_all, False),
                    ("503s (inbox full)", f"{stats.inbox_full:,}", stats.inbox_full > 0),
                    ("quarantined", f"{len(host.quarantined):,}", bool(host.quarantined)),
                ]
            )
            + "<h2>Actor classes</h2>"
            + table(
                ("CLASS", "PYTHON CLASS", "ACCESS", "IN MEMORY", "EVENTS", "FAILED", "EVENTS/S"),
                rows,
                numeric=(3, 4, 5, 6),
            )
            + "<p class=muted>Events/s are measured between two looks at this page; it "
            "refreshes every 5 s.</p>"
        )
        return pages.page("Overview", "/", body, refresh=5)

    async def actors(self, query: dict[str, str]) -> Response:
        host = self.front.host
        wanted = query.get("class", "")
        answer = await self.front.actors(query)
        options = "".join(
            f'<option value="{esc(n)}"{" selected" if n == wanted else ""}>{esc(n)}</option>'
            for n in ["", *sorted(host.classes)]
        )
        form = (
            '<form class=inline method=get action="/actors">'
            f"<label>class <select name=class>{options}</select></label>"
            f'<label>prefix <input name=prefix value="{esc(query.get("prefix", ""))}"></label>'
            "<button>Search</button></form>"
        )
        rows = [
            (
                f'<a href="{href("/actors/" + a["address"])}">{esc(a["address"])}</a>',
                when(a["created_at"]),
                '<span class="tag ok">in memory</span>' if a["active"] else "",
                f'<span class="tag bad">{esc(a["quarantined"])}</span>' if a["quarantined"] else "",
            )
            for a in answer["actors"]
        ]
        more = ""
        if answer["next"] is not None:
            nxt = href("/actors", **{**query, "after": answer["next"]})
            more = f'<a class="button quiet" href="{nxt}">Next page</a>'
        body = (
            "<h1>Actors</h1>" + form + table(("ADDRESS", "CREATED", "", "QUARANTINED"), rows) + more
        )
        return pages.page("Actors", "/actors", body)

    async def actor(self, address: str, query: dict[str, str]) -> Response:
        about = await self.front.show(address)
        alarm = about["alarm"]
        facts = [
            ("file", f"<code>{esc(about['file'])}</code> ({about['bytes']:,} bytes)"),
            ("created", when(about["created_at"])),
            ("in memory", "yes" if about["active"] else "no"),
            (
                "alarm",
                "none"
                if alarm is None
                else f"{when(alarm['at'])} (set {when(alarm['scheduled_at'])}, "
                f"retries {alarm['retries']})",
            ),
        ]
        where = about.get("cluster")
        if where is not None:
            held = esc(where["owner"] or "no host")
            facts.append(("partition", f"{where['partition']} (epoch {where['epoch']}, {held})"))
        if about["quarantined"]:
            facts.append(
                ("quarantined", f'<span class="tag bad">{esc(about["quarantined"])}</span>')
            )
        tables = [
            (
                esc(t["name"]) + (' <span class="tag">runtime</span>' if t["internal"] else ""),
                "over 1,000,000" if t["rows"] is None else f"{t['rows']:,}",
            )
            for t in about["tables"]
        ]
        sql = query.get("sql", "")
        if not sql:
            user = [t["name"] for t in about["tables"] if not t["internal"]]
            sql = f'SELECT * FROM "{user[0]}" LIMIT 50' if user else "SELECT 1"
        result = ""
        if "sql" in query:
            try:
                answer = await self.front.sql(address, query["sql"], [])
            except InspectError as exc:
                result = f"<div class=error>{esc(exc)}</div>"
            else:
                rows = [[cell(v) for v in row] for row in answer["rows"]]
                result = table(answer["columns"], rows)
                if answer["truncated"]:
                    result += f"<p class=muted>first {len(rows):,} rows</p>"
        body = (
            f"<h1>{esc(address)}</h1>"
            + table(("", ""), [(f"<b>{esc(k)}</b>", v) for k, v in facts])
            + "<h2>Tables</h2>"
            + table(("TABLE", "ROWS"), tables, numeric=(1,))
            + "<h2>Read-only SQL</h2>"
            + f'<form method=get action="{href("/actors/" + address)}">'
            + f"<textarea name=sql>{esc(sql)}</textarea>"
            + "<p><button>Run</button> <span class=muted>one statement; nothing it runs can "
            "write</span></p></form>" + result
        )
        return pages.page(address, "/actors", body)

    async def alarms(self, query: dict[str, str]) -> Response:
        answer = await self.front.alarms(query)
        now = answer["now"]
        rows = [
            (
                when(a["at"]),
                '<span class="tag bad">due</span>' if a["at"] <= now else "",
                f'<a href="{href("/actors/" + a["address"])}">{esc(a["address"])}</a>',
            )
            for a in answer["alarms"]
        ]
        due = query.get("due") == "1"
        switch = (
            '<a href="/alarms">all alarms</a>' if due else '<a href="/alarms?due=1">only due</a>'
        )
        more = ""
        if answer["next"] is not None:
            more = button(
                link("/alarms", **{**query, "after": answer["next"]}), "Next page", "quiet"
            )
        body = (
            f"<h1>Alarms{' due' if due else ''}</h1><p>{switch} · now {when(now)}</p>"
            + table(("AT", "", "ACTOR"), rows)
            + more
        )
        return pages.page("Alarms", "/alarms", body)

    async def kv(self, query: dict[str, str]) -> Response:
        host = self.front.host
        classes = sorted(n for n in host.classes if speaks(host, n, kv_wire.GET))
        wanted = query.get("class") or (classes[0] if classes else "")
        options = "".join(
            f"<option{' selected' if n == wanted else ''}>{esc(n)}</option>" for n in classes
        )
        shards = query_int(query, "shards")
        form = (
            '<form class=inline method=get action="/kv">'
            f"<label>class <select name=class>{options}</select></label>"
            "<label>shards <input name=shards type=number min=1 "
            f'value="{esc(shards or 16)}"></label>'
            f'<label>prefix <input name=prefix value="{esc(query.get("prefix", ""))}"></label>'
            "<button>List</button></form>"
        )
        listing = "<p class=muted>no KV shard class in this app</p>"
        if wanted:
            page = await self.front.ready.kv_list(
                wanted, shards, query.get("prefix", ""), query.get("after"), 100
            )
            rows = [
                (blob(e["key"]), str(e["version"]), when(e["expires_at"]), blob(e["value"]))
                for e in page["entries"]
            ]
            listing = table(("KEY", "VERSION", "EXPIRES", "VALUE"), rows, numeric=(1,))
            if page["next"] is not None:
                nxt = href("/kv", **{**query, "class": wanted, "after": page["next"]})
                listing += f'<a class="button quiet" href="{nxt}">Next page</a>'
        body = (
            "<h1>KV</h1>"
            + form
            + "<p class=muted>shards: the count the app's <code>ak.kv.Client</code> uses "
            "(16 unless it says otherwise)</p>" + listing
        )
        return pages.page("KV", "/kv", body)

    async def cluster(self, query: dict[str, str]) -> Response:
        if self.front.cluster is None:
            body = (
                "<h1>Cluster</h1><p>This host is not in a cluster: it serves every actor of its "
                "data directory itself (<code>actorkeep serve --cluster</code> makes one).</p>"
            )
            return pages.page("Cluster", "/cluster", body)
        view = await self.front.cluster.overview()
        hosts = [
            (
                esc(h["host_id"]) + (" " + pages.tag("this host", "ok") if h["this"] else ""),
                f"<code>{esc(h['address'] or '-')}</code>",
                f"{h['seen_ago']:.1f} s ago",
                f"{h['partitions']:,}",
            )
            for h in view["hosts"]
        ]
        leases = [
            (
                str(x["partition"]),
                esc(x["owner"] or "-"),
                str(x["epoch"]),
                "-" if x["expires_in"] is None else f"{x['expires_in']:.1f} s",
            )
            for x in view["leases"]
        ]
        found = ""
        address = query.get("address", "")
        if address:
            where = await self.front.cluster.where(address)
            owner = where["owner"] or "no host (its lease lapsed: another host takes it soon)"
            found = (
                f"<div class=notice>{esc(address)} is in partition {where['partition']} "
                f"(epoch {where['epoch']}), held by {esc(owner)}</div>"
            )
        body = (
            "<h1>Cluster</h1>"
            + pages.cards(
                [
                    ("hosts", f"{len(view['hosts']):,}", False),
                    ("partitions", f"{view['partitions']:,}", False),
                    ("held by this host", f"{view['held_here']:,}", False),
                    ("held by no host", f"{view['unowned']:,}", view["unowned"] > 0),
                ]
            )
            + "<h2>Where does an actor live?</h2>"
            + '<form class=inline method=get action="/cluster">'
            + f'<input name=address placeholder="class/name" value="{esc(address)}">'
            + "<button>Find</button></form>"
            + found
            + "<h2>Hosts</h2>"
            + table(("HOST", "INTERNAL ADDRESS", "SEEN", "PARTITIONS"), hosts, numeric=(3,))
            + f"<details><summary>Every partition ({view['partitions']:,})</summary>"
            + table(("PARTITION", "OWNER", "EPOCH", "LEASE LEFT"), leases, numeric=(0, 2, 3))
            + "</details>"
        )
        return pages.page("Cluster", "/cluster", body, refresh=None if address else 5)

    # -- login, when the listener has a token -----------------------------------------------
    def login(self, method: str, body: bytes, token: bytes) -> Response:
        """The token form; a right token sets the cookie the pages then carry."""
        if method == "POST":
            given = parse_query(body[:MAX_FORM].decode("utf-8", "replace")).get("token", "")
            if hmac.compare_digest(f"Bearer {given}".encode(), token):
                cookie = f"{COOKIE}={given}; HttpOnly; SameSite=Strict; Path=/"
                return Response(303, {"location": "/", "set-cookie": cookie})
        wrong = "<div class=error>wrong token</div>" if method == "POST" else ""
        body_html = (
            f"<h1>Admin token</h1>{wrong}"
            '<form method=post action="/login" class=inline>'
            '<input name=token type=password autofocus placeholder="admin token">'
            "<button>Enter</button></form>"
        )
        return pages.page("Log in", "", body_html, status=401 if method == "POST" else 200)
