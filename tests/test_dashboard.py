"""The dashboard, end to end: a served app, its admin listener, and headless Chromium driven by
Playwright loading every page, running SQL, redriving a dead letter and cancelling a message by
clicking; the listener's rules for browsers (token cookie, cross-site posts, foreign names)."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.test_ops import admin_url
from tests.test_process import Server, http_request

APP = "tests.test_ops_ready:app"
CHROMIUM = "/usr/bin/chromium"
# As root, without a sandbox; and nothing that reaches for the network beyond loopback.
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail("Chromium is missing: `make test` installs it (Debian's chromium)")
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield launched
        launched.close()


def serve(tmp_path: Path, *args: str) -> tuple[Server, str, list[int]]:
    """The test app with two dead letters, one leased message and two ready; KV keys."""
    server = Server(APP, tmp_path / "data", ("--admin", "127.0.0.1:0", *args))

    def call(method: str, **fields: object) -> object:
        resp = server.rpc(f"/producer/p/_rpc/{method}", fields)
        assert resp.status == 200, resp.body
        return json.loads(resp.body)

    keys = [None, None, None, "order-4", None]
    groups = [None, None, "user-7", None, None]
    ids = call(
        "send", bodies=["first body", "second body", "c", "d", "e"], keys=keys, groups=groups
    )
    assert isinstance(ids, list)
    call("lease", n=2, worker="w-7")
    time.sleep(1.2)  # both leases run out on their one attempt: dead letters
    call("lease", n=1, visibility=600.0)
    call("put", items={"user/1": "ann", "user/2": "bob", "team/1": "x"})
    return server, admin_url(tmp_path / "data"), ids


def test_every_page_loads_and_a_dead_letter_is_redriven_by_clicking(
    tmp_path: Path, browser: Browser
) -> None:
    server, url, ids = serve(tmp_path)
    page: Page = browser.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    try:
        page.goto(url + "/")
        expect(page.locator("h1")).to_have_text("Overview")
        classes = page.locator("table").first
        for name in ("producer", "queue", "kv"):
            expect(classes).to_contain_text(name)

        page.locator("nav").get_by_role("link", name="Actors").click()
        page.select_option("select[name=class]", "producer")
        page.get_by_role("button", name="Search").click()
        expect(page.locator("table")).to_contain_text("producer/p")
        page.get_by_role("link", name="producer/p").click()
        expect(page.locator("h1")).to_have_text("producer/p")
        page.fill("textarea[name=sql]", "SELECT 6 * 7 AS answer")
        page.get_by_role("button", name="Run").click()
        expect(page.locator("table").last).to_contain_text("42")
        page.fill("textarea[name=sql]", "DELETE FROM actorkeep_actor")
        page.get_by_role("button", name="Run").click()
        expect(page.locator(".error")).to_contain_text("only reads are allowed")

        page.locator("nav").get_by_role("link", name="Alarms").click()
        expect(page.locator("h1")).to_have_text("Alarms")
        expect(page.locator("table")).to_contain_text("queue/jobs")

        page.locator("nav").get_by_role("link", name="Queues").click()
        expect(page.locator("table")).to_contain_text("queue/jobs")
        page.get_by_role("link", name="queue/jobs").click()
        dead = page.locator("table").last
        expect(dead).to_contain_text("first body")
        expect(dead).to_contain_text("second body")
        expect(dead).to_contain_text("w-7")  # who held them
        expect(page.locator(".cards")).to_contain_text("1keys")
        expect(page.locator(".cards")).to_contain_text("1groups")
        # One sample a second at most: a look a second later draws a line per state.
        page.wait_for_timeout(1100)
        page.reload()
        expect(page.locator("svg.chart polyline")).to_have_count(4)
        dead = page.locator("table").last

        # Redrive the first dead letter: a confirmation page, then the list without it.
        dead.locator("tr", has_text="first body").get_by_role("link", name="Redrive").click()
        expect(page.locator("h1")).to_contain_text(f"Redrive message {ids[0]} of queue/jobs?")
        page.get_by_role("button", name="Redrive").click()
        expect(page.locator(".notice")).to_have_text("redrove 1 dead letter(s)")
        dead = page.locator("table").last
        expect(dead).not_to_contain_text("first body")
        expect(dead).to_contain_text("second body")

        # Cancel a waiting message, found by its id.
        page.fill("input[name=id]", str(ids[3]))
        page.get_by_role("button", name="Show").click()
        expect(page.locator("h1")).to_have_text(f"Message {ids[3]}")
        expect(page.locator("table")).to_contain_text("ready")
        expect(page.locator("table")).to_contain_text("order-4")
        page.get_by_role("link", name="Cancel").click()
        page.get_by_role("button", name="Cancel").click()
        expect(page.locator(".notice")).to_have_text(f"cancelled message {ids[3]}")
        counts = page.locator(".cards")
        expect(counts).to_contain_text("1dead letters")

        page.locator("nav").get_by_role("link", name="KV").click()
        page.fill("input[name=shards]", "4")
        page.fill("input[name=prefix]", "user/")
        page.get_by_role("button", name="List").click()
        table = page.locator("table")
        expect(table).to_contain_text("user/1")
        expect(table).to_contain_text("bob")
        expect(table).not_to_contain_text("team/1")
        assert errors == []
    finally:
        page.close()
        server.stop(signal.SIGTERM)
        server.close()
    # What the clicks did, as the queue itself tells it.
    from tests.test_ops import cli_json

    stats = cli_json("queue", "stats", "queue/jobs", "--data", str(tmp_path / "data"))
    assert (stats["dead"], stats["ready"]) == (1, 2)  # e and the redriven one; d cancelled


def test_with_a_token_the_pages_want_it_once(tmp_path: Path, browser: Browser) -> None:
    server, url, _ = serve(tmp_path, "--admin-token", "s3cret")
    page = browser.new_page()
    try:
        page.goto(url + "/queues")
        expect(page.locator("h1")).to_have_text("Admin token")
        page.fill("input[name=token]", "wrong")
        page.get_by_role("button", name="Enter").click()
        expect(page.locator(".error")).to_have_text("wrong token")
        page.fill("input[name=token]", "s3cret")
        page.get_by_role("button", name="Enter").click()
        expect(page.locator("h1")).to_have_text("Overview")
        page.goto(url + "/queues")
        expect(page.locator("table")).to_contain_text("queue/jobs")
    finally:
        page.close()
        server.stop(signal.SIGTERM)
        server.close()


def test_the_listener_refuses_what_other_sites_send(tmp_path: Path) -> None:
    """A page elsewhere may make the operator's browser post to the loopback listener, or
    point its own name at 127.0.0.1: both are refused, and nothing is redriven."""
    server, url, ids = serve(tmp_path)
    port = int(url.rpartition(":")[2])
    try:
        form = {"content-type": "application/x-www-form-urlencoded"}
        path = "/queues/queue/jobs/redrive"
        foreign = {**form, "origin": "http://evil.example", "host": f"127.0.0.1:{port}"}
        assert http_request(port, "POST", path, b"all=1", foreign).status == 403
        fetched = {**form, "sec-fetch-site": "cross-site"}
        assert http_request(port, "POST", path, b"all=1", fetched).status == 403
        api = {"content-type": "text/plain", "origin": "http://evil.example"}
        body = b'{"ids": null}'
        assert http_request(port, "POST", "/api/queues/queue/jobs/redrive", body, api).status == 403
        rebound = {"host": f"evil.example:{port}"}
        assert http_request(port, "GET", "/api/queues", headers=rebound).status == 403
        same = {**form, "origin": f"http://127.0.0.1:{port}", "host": f"127.0.0.1:{port}"}
        done = http_request(port, "POST", path, f"id={ids[0]}".encode(), same)
        assert done.status == 303 and "redrove+1" in done.headers["location"]
        # Every page escapes what actors store: a body of markup stays text.
        sent = server.rpc("/producer/p/_rpc/send", {"bodies": ["<script>x</script>"]})
        (script,) = json.loads(sent.body)
        shown = http_request(port, "GET", f"/queues/queue/jobs/messages/{script}")
        assert b"<script>x" not in shown.body and b"&lt;script&gt;x" in shown.body
        assert "default-src 'none'" in shown.headers["content-security-policy"]
    finally:
        server.stop(signal.SIGTERM)
        server.close()
