"""A queue in a real host process under kill -9 (docs/reference.md §8): sends and acks driven
over HTTP through app actors (``tests/apps/queue_app.py``), the host killed mid-stream and
restarted.

Checked after every kill, from the queue's file: no acknowledged send is lost, no acked
message comes back, and attempts never go down."""

from __future__ import annotations

import http.client
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from actorkeep.address import actor_path
from tests.test_process import CLIENT_TIMEOUT, Server, read_only, serve

pytestmark = pytest.mark.slow

APP = "tests.apps.queue_app:app"


@dataclass
class Ledger:
    sent: dict[int, str] = field(default_factory=dict)  # id -> body, for sends answered 200
    acked: set[int] = field(default_factory=set)  # ids whose ack answered True
    maybe_acked: set[int] = field(default_factory=set)  # ids whose ack got no answer
    attempts: dict[int, int] = field(default_factory=dict)  # id -> highest attempt leased
    lock: threading.Lock = field(default_factory=threading.Lock)


def post(conn: http.client.HTTPConnection, path: str, args: dict[str, object]) -> object:
    conn.request("POST", path, json.dumps(args).encode(), {"content-type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    assert resp.status == 200, (path, resp.status, data)
    return json.loads(data)


def stream(server: Server, ledger: Ledger, cycle: int, sends_before_kill: int) -> None:
    """Producers and consumers hammer the host until enough sends are answered, then kill -9."""
    enough = threading.Event()
    stop = threading.Event()
    count = [0]

    def producer(k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=CLIENT_TIMEOUT)
        n = 0
        try:
            while not stop.is_set():
                tag = f"c{cycle}-p{k}-{n}"
                n += 1
                try:
                    i = post(conn, f"/producer/p{k}/_rpc/send", {"tag": tag})
                except (OSError, http.client.HTTPException):
                    return  # killed: this send may or may not have applied
                assert isinstance(i, int)
                with ledger.lock:
                    ledger.sent[i] = tag
                    count[0] += 1
                    if count[0] >= sends_before_kill:
                        enough.set()
        finally:
            conn.close()

    def consumer(k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=CLIENT_TIMEOUT)
        try:
            while not stop.is_set():
                try:
                    leases = post(conn, f"/consumer/c{k}/_rpc/lease", {"max": 5})
                except (OSError, http.client.HTTPException):
                    return
                assert isinstance(leases, list)
                for i, attempt, _ in leases:
                    with ledger.lock:
                        ledger.attempts[i] = max(ledger.attempts.get(i, 0), attempt)
                    try:
                        acked = post(
                            conn, f"/consumer/c{k}/_rpc/ack", {"id": i, "attempt": attempt}
                        )
                    except (OSError, http.client.HTTPException):
                        with ledger.lock:
                            ledger.maybe_acked.add(i)
                        return
                    if acked:
                        with ledger.lock:
                            ledger.acked.add(i)
                if not leases:
                    time.sleep(0.005)
        finally:
            conn.close()

    threads = [threading.Thread(target=producer, args=(k,), daemon=True) for k in range(4)]
    threads += [threading.Thread(target=consumer, args=(k,), daemon=True) for k in range(2)]
    for t in threads:
        t.start()
    assert enough.wait(timeout=60), f"only {count[0]} sends answered"
    server.kill()
    stop.set()
    for t in threads:
        t.join(timeout=CLIENT_TIMEOUT + 5)
        assert not t.is_alive()


def check(data: Path, ledger: Ledger) -> dict[int, int]:
    """The invariants, read from the killed host's queue file; the live ``id -> attempts``."""
    conn = read_only(actor_path(data / "actors", "queue", "q"))
    try:
        live = {i: (a, b.decode()) for i, a, b in conn.execute(
            "SELECT id, attempts, body FROM actorkeep_queue")}  # fmt: skip
        dead = {i for (i,) in conn.execute("SELECT id FROM actorkeep_queue_dead")}
    finally:
        conn.close()
    for i, tag in ledger.sent.items():
        if i not in ledger.maybe_acked:
            assert i in live or i in ledger.acked or i in dead, f"acknowledged send {i} lost"
        if i in live:
            assert live[i][1] == tag
    for i in ledger.acked:
        assert i not in live, f"acked message {i} came back"
    for i, (attempts, _) in live.items():
        assert attempts >= ledger.attempts.get(i, 0), f"attempts of {i} went down"
    return {i: a for i, (a, _) in live.items()}


def test_kill_9_during_sends_and_acks(tmp_path: Path) -> None:
    data = tmp_path / "data"
    ledger = Ledger()
    for cycle in range(3):
        with serve(APP, data) as server:
            stream(server, ledger, cycle, sends_before_kill=150)
        check(data, ledger)
    assert len(ledger.sent) >= 450 and ledger.acked
    # drain what is left after the last kill: every lease comes with a higher attempt
    with serve(APP, data) as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=CLIENT_TIMEOUT)
        try:
            idle_since = time.monotonic()
            while time.monotonic() - idle_since < 3.0:  # leases of the killed host run out
                leases = post(conn, "/consumer/drain/_rpc/lease", {"max": 100})
                assert isinstance(leases, list)
                for i, attempt, _ in leases:
                    assert attempt > ledger.attempts.get(i, 0), (i, attempt)
                    ledger.attempts[i] = attempt
                    assert post(conn, "/consumer/drain/_rpc/ack", {"id": i, "attempt": attempt})
                    ledger.acked.add(i)
                if leases:
                    idle_since = time.monotonic()
                else:
                    time.sleep(0.05)
        finally:
            conn.close()
        assert server.get("/queue/q/actorkeep-queue/v1/stats").status == 403
        server.kill()
    assert check(data, ledger) == {}
    assert set(ledger.sent) <= ledger.acked | ledger.maybe_acked
