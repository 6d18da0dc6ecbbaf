"""examples/chat end to end: a real host process, and two pages in headless Chromium (Playwright)
that chat in one room, then reconnect after the host restarts and see the history."""

from __future__ import annotations

import signal
from pathlib import Path

from playwright.sync_api import Browser, Page, expect

from tests.test_dashboard import browser  # noqa: F401 (the fixture)
from tests.test_process import Server

APP = "examples.chat.app:app"


def open_page(browser: Browser, server: Server, user: str) -> Page:  # noqa: F811
    page = browser.new_page()
    page.goto(f"http://127.0.0.1:{server.port}/room/lobby/?user={user}")
    expect(page.locator("#status")).to_have_text("connected")
    return page


def say(page: Page, text: str) -> None:
    page.get_by_role("textbox", name="message").fill(text)
    page.get_by_role("button", name="Send").click()


def test_two_pages_chat_and_reconnect_after_a_restart(
    tmp_path: Path,
    browser: Browser,  # noqa: F811
) -> None:
    server = Server(APP, tmp_path / "data", ())
    try:
        ann = open_page(browser, server, "ann")
        bob = open_page(browser, server, "bob")
        say(ann, "hello bob")
        for page in (ann, bob):
            expect(page.locator("#log")).to_contain_text("ann: hello bob")
        say(bob, "hi ann")
        expect(ann.locator("#log li")).to_have_count(2)
        expect(ann.locator("#log li").last).to_have_text("bob: hi ann")

        # A graceful stop closes the sockets with 1001. The page's status shows the last close,
        # which is 1006 once its first reconnect (after 0.5 s) finds no host: so the code is
        # read from the socket that was open.
        for page in (ann, bob):
            page.evaluate(
                "() => { window.firstClose = new Promise(done => "
                "socket.addEventListener('close', event => done(event.code))); }"
            )
        assert server.stop(signal.SIGTERM) == 0
        for page in (ann, bob):
            assert page.evaluate("window.firstClose") == 1001
            expect(page.locator("#status")).to_contain_text("disconnected (")
        server.start_again(())
        for page in (ann, bob):
            expect(page.locator("#status")).to_have_text("connected", timeout=15_000)
            expect(page.locator("#log li")).to_have_count(2)  # the history, from the room's file
            expect(page.locator("#log")).to_contain_text("ann: hello bob")
        say(ann, "still here")
        expect(bob.locator("#log li").last).to_have_text("ann: still here")
        # Bad input from a page gets an answer, and the room goes on.
        ann.evaluate("socket.send('not json')")
        expect(ann.locator("#log li").last).to_contain_text('want {"text"')
        bob.close()
        expect(ann.locator("#log li").last).to_have_text("bob left")
        ann.close()
    finally:
        server.close()
