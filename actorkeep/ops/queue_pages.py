"""The dashboard's queue pages: every queue's counts, one queue's counts over time and dead
letters, one message, and the confirmation before a redrive or cancel (docs/operations.md)."""

from __future__ import annotations

import collections
from typing import Any

from ..http import Response
from ..runtime.host import Host
from . import pages
from .inspect import InspectError
from .pages import blob, button, cell, esc, href, link, query_int, table, tag, when
from .ready import Ready, queue_classes

#: Samples kept per queue for its chart (an hour at the queue page's 5 s refresh).
HISTORY = 720


class QueuePages:
    """The queue pages of ``host`` (whose queues ``ready`` calls), and the counts over time
    they chart."""

    def __init__(self, host: Host, ready: Ready) -> None:
        self.host = host
        self.ready = ready
        self.history: dict[str, collections.deque[tuple[float, dict[str, int]]]] = {}

    def record(self, counts: list[dict[str, Any]]) -> None:
        """Keep the counts of queues just asked (at most one sample a second each)."""
        now = self.host.clock.now()
        for q in counts:
            if "error" in q:
                continue
            samples = self.history.get(q["queue"])
            if samples is None:
                if len(self.history) >= 1000:
                    continue
                samples = self.history[q["queue"]] = collections.deque(maxlen=HISTORY)
            if samples and now - samples[-1][0] < 1.0:
                continue
            samples.append((now, {s: q[s] for s in pages.STATE_COLOURS}))

    async def post(self, address: str, action: str, form: dict[str, str]) -> Response:
        """A confirmed redrive or cancel; back to the queue's page with what it did."""
        ready = self.ready
        if action == "redrive":
            ids = None if form.get("all") == "1" else [pages.form_id(form)]
            done = await ready.redrive(address, ids)
            notice = f"redrove {done['redriven']} dead letter(s)"
        else:
            message_id = pages.form_id(form)
            cancelled = (await ready.cancel(address, message_id))["cancelled"]
            notice = (
                f"cancelled message {message_id}"
                if cancelled
                else f"message {message_id} is not in the queue: nothing cancelled"
            )
        target = pages.link(f"/queues/{address}", done=notice)
        return Response(303, {"location": target, "cache-control": "no-store"})

    async def queues(self) -> Response:
        answer = await self.ready.queues()
        self.record(answer["queues"])
        rows = []
        for q in answer["queues"]:
            name = f'<a href="{href("/queues/" + q["queue"])}">{esc(q["queue"])}</a>'
            if "error" in q:
                rows.append(
                    (name, f'<span class="tag bad">{esc(q["error"])}</span>', "", "", "", "")
                )
                continue
            dead = f'<span class="{"tag bad" if q["dead"] else ""}">{q["dead"]:,}</span>'
            age = q["oldest_ready_age"]
            rows.append(
                (
                    name,
                    f"{q['ready']:,}",
                    f"{q['delayed']:,}",
                    f"{q['leased']:,}",
                    dead,
                    "-" if age is None else f"{age:.1f} s",
                )
            )
        classes = ", ".join(queue_classes(self.host)) or "none"
        body = (
            "<h1>Queues</h1>"
            + f"<p class=muted>queue classes: {esc(classes)}</p>"
            + table(
                ("QUEUE", "READY", "DELAYED", "LEASED", "DEAD", "OLDEST READY"),
                rows,
                numeric=(1, 2, 3, 4, 5),
            )
            + ("<p class=muted>first 100 queues</p>" if answer["truncated"] else "")
        )
        return pages.page("Queues", "/queues", body, refresh=5)

    async def queue_page(self, parts: list[str], query: dict[str, str]) -> Response:
        address, rest = "/".join(parts[:2]), parts[2:]
        if rest == ["confirm"]:
            return self.confirm(address, query)
        if len(rest) == 2 and rest[0] == "messages":
            return await self.message(address, rest[1], query)
        if rest:
            return pages.error_page(404, "no such page")
        ready = self.ready
        stats = await ready.stats(address)
        self.record([stats])
        dead = await ready.dead(address, query_int(query, "after"), 50)
        confirm, find = f"/queues/{address}/confirm", f"/queues/{address}/messages/find"
        notice = f"<div class=notice>{esc(query['done'])}</div>" if "done" in query else ""
        rows = [
            (
                str(d["id"]),
                str(d["attempts"]),
                when(d["failed_at"]),
                esc(d["reason"]),
                _opt(d["worker"]),
                blob(d["body"]),
                button(link(confirm, action="redrive", id=d["id"]), "Redrive"),
            )
            for d in dead["items"]
        ]
        more = ""
        if dead["next"] is not None:
            more = button(link("/queues/" + address, after=dead["next"]), "Next page", "quiet")
        redrive_all = (
            button(link(confirm, action="redrive", all=1), "Redrive all", "danger")
            if stats["dead"]
            else ""
        )
        age = stats["oldest_ready_age"]
        body = (
            notice
            + f"<h1>{esc(address)}</h1>"
            + pages.cards(
                [
                    ("ready", f"{stats['ready']:,}", False),
                    ("delayed", f"{stats['delayed']:,}", False),
                    ("leased", f"{stats['leased']:,}", False),
                    ("dead letters", f"{stats['dead']:,}", stats["dead"] > 0),
                    ("oldest ready", "-" if age is None else f"{age:.1f} s", False),
                    ("keys", f"{stats['keys']:,}", False),
                    ("groups", f"{stats['groups']:,}", False),
                    ("recurring sends", f"{stats['schedules']:,}", False),
                ]
            )
            + "<h2>Messages by state</h2>"
            + pages.chart(list(self.history.get(address, ())))
            + "<h2>Find a message</h2>"
            + f'<form class=inline method=get action="{href(find)}">'
            + "<input name=id type=number min=1 placeholder=id required>"
            + "<button>Show</button></form>"
            + f"<h2>Dead letters</h2><p>{redrive_all}</p>"
            + table(
                ("ID", "ATTEMPTS", "FAILED", "REASON", "WORKER", "BODY", ""), rows, numeric=(0, 1)
            )
            + more
        )
        return pages.page(address, "/queues", body, refresh=None if rows else 5)

    async def message(self, address: str, which: str, query: dict[str, str]) -> Response:
        """``messages/<id>``, or ``messages/find?id=`` (the page's form)."""
        message_id = query_int(query if which == "find" else {"id": which}, "id")
        if message_id is None:
            raise InspectError("want the message's id")
        m = (await self.ready.get(address, message_id))["message"]
        facts = [
            (
                "state",
                tag(m["state"], "bad" if m["state"] == "dead" else ""),
            ),
            ("attempts", esc(m["attempts"])),
            ("max attempts", _opt(m["max_attempts"])),
            ("priority", esc(m["priority"])),
            ("key", _opt(m["key"])),
            ("group", _opt(m["group"])),
            ("worker", _opt(m["worker"])),
            ("sent", when(m["enqueued_at"])),
            (
                "visible at" if m["state"] != "dead" else "failed",
                when(m["visible_at"] or m["failed_at"]),
            ),
            ("expires", when(m["expires_at"])),
            ("last error", cell(m["last_error"], 400)),
            ("body", blob(m["body"], 2000)),
        ]
        confirm = f"/queues/{address}/confirm"
        if m["state"] == "dead":
            action = button(link(confirm, action="redrive", id=message_id), "Redrive")
        else:
            action = button(link(confirm, action="cancel", id=message_id), "Cancel", "danger")
        body = (
            f'<p><a href="{href("/queues/" + address)}">{esc(address)}</a></p>'
            f"<h1>Message {message_id}</h1>"
            + table(("", ""), [(f"<b>{esc(k)}</b>", v) for k, v in facts])
            + f"<p>{action}</p>"
        )
        return pages.page(f"Message {message_id}", "/queues", body)

    def confirm(self, address: str, query: dict[str, str]) -> Response:
        action = query.get("action")
        if action not in ("redrive", "cancel"):
            raise InspectError("want action=redrive or action=cancel")
        if action == "redrive" and query.get("all") == "1":
            what, fields = "every dead letter", {"all": "1"}
        else:
            message_id = query_int(query, "id")
            if message_id is None:
                raise InspectError("want the message's id")
            what = f"message {message_id}"
            fields = {"id": str(message_id)}
        verb = "Redrive" if action == "redrive" else "Cancel"
        effect = (
            "It goes back to the queue as a new message, with a new id and no attempts."
            if action == "redrive"
            else "It is deleted, and never delivered."
        )
        body = (
            f"<h1>{verb} {esc(what)} of {esc(address)}?</h1><p>{effect}</p>"
            + f'<form method=post action="{href(f"/queues/{address}/{action}")}">'
            + pages.hidden(fields)
            + f'<button class=danger>{verb}</button> <a class="button quiet" '
            + f'href="{href("/queues/" + address)}">Back</a></form>'
        )
        return pages.page(f"{verb}?", "/queues", body)


def _opt(value: object) -> str:
    """An optional name or number: ``-`` when there is none."""
    return "-" if value is None else esc(value)
