"""Take the dashboard's screenshots in docs/img/ (docs/operations.md): serve the operations
tests' app with an admin listener, give it some work, and photograph each page in Chromium.

    .venv/bin/python docs/screenshots.py
"""

from __future__ import annotations

import json
import signal
import sys
import tempfile
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.test_dashboard import CHROMIUM, FLAGS  # noqa: E402
from tests.test_ops import admin_url  # noqa: E402
from tests.test_process import Server  # noqa: E402

OUT = ROOT / "docs" / "img"


def main() -> None:
    OUT.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        server = Server("tests.test_ops_ready:app", data, ("--admin", "127.0.0.1:0"))
        try:
            url = admin_url(data)

            def call(method: str, **fields: object) -> object:
                resp = server.rpc(f"/producer/p/_rpc/{method}", fields)
                assert resp.status == 200, resp.body
                return json.loads(resp.body)

            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
                page = browser.new_page(viewport={"width": 1100, "height": 720})
                bodies = [
                    json.dumps({"order": 1000 + i, "email": f"user{i}@example.com"})
                    for i in range(40)
                ]
                call("put", items={f"user/{i}": f"plan=pro;seats={i}" for i in range(8)})
                # Counts that change between looks: sends, leases that run out, redrives.
                for step in range(12):
                    chunk = range(step * 3, step * 3 + 3)
                    call(
                        "send",
                        bodies=[bodies[i] for i in chunk],
                        keys=[f"order-{1000 + i}" for i in chunk],
                        groups=[f"user-{i % 4}" if i % 2 else None for i in chunk],
                    )
                    if step % 3 == 0:
                        call("lease", n=2, worker=f"billing-{step % 2 + 1}")
                    if step == 8:
                        call("lease", n=1, visibility=600.0, worker="billing-3")
                    page.goto(url + "/queues/queue/jobs")
                    time.sleep(1.1)
                for name, path in [
                    ("overview", "/"),
                    ("actors", "/actors?class=kv"),
                    (
                        "actor",
                        "/actors/queue/jobs?sql=SELECT+id,+attempts,+reason+FROM+"
                        "actorkeep_queue_dead+LIMIT+5",
                    ),
                    ("queue", "/queues/queue/jobs"),
                    ("message", "/queues/queue/jobs/messages/8"),
                    ("kv", "/kv?class=kv&shards=4&prefix=user/"),
                ]:
                    page.goto(url + path)
                    page.screenshot(path=str(OUT / f"dashboard-{name}.png"), full_page=True)
                page.goto(url + "/queues/queue/jobs")
                page.get_by_role("link", name="Redrive").first.click()
                page.screenshot(path=str(OUT / "dashboard-confirm.png"))
                browser.close()
        finally:
            server.stop(signal.SIGTERM)
            server.close()
    print(f"wrote {sorted(p.name for p in OUT.glob('dashboard-*.png'))}")


if __name__ == "__main__":
    main()
