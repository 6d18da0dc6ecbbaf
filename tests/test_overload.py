"""Overload of one hot actor in a real host process (docs/reference.md §2 overload, §13: 503
and Retry-After).

``actorkeep serve tests.apps.overload_app:app --max-pending 3``; 40 client threads flood
``slow/hot``, whose every event holds it for 0.2 s, while another thread keeps asking
``slow/cold``. The excess is refused with 503 and Retry-After, and nothing else; refused
requests leave no trace; accepted ones wait at most for the few events ahead of them; the cold
actor answers throughout; the hot one answers normally as soon as the flood stops.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.test_process import CLIENT_TIMEOUT, serve

pytestmark = pytest.mark.slow

APP = "tests.apps.overload_app:app"
MAX_PENDING = 3
HOLD = 0.2  # seconds each hot event takes
FLOODERS = 40
ENOUGH_REFUSED = 100  # the flood stops once this many requests were refused...
ENOUGH_ACCEPTED = 10  # ...and this many accepted
FLOOD_TIMEOUT = 60.0
# An accepted request waits for at most MAX_PENDING events ahead of it plus the running one:
# (MAX_PENDING + 1) * HOLD = 0.8 s. Without the limit, 40 clients would wait up to 40 * HOLD =
# 8 s. The bound sits between the two with room for a busy machine.
ACCEPTED_LATENCY_BOUND = 3.0
COLD_LATENCY_BOUND = 2.0


@dataclass
class Seen:
    accepted: list[int] = field(default_factory=list)  # the counts 200 answers carried
    accepted_latency: list[float] = field(default_factory=list)
    refused: list[tuple[dict[str, str], bytes]] = field(default_factory=list)  # 503s
    other: list[str] = field(default_factory=list)  # anything else: must stay empty
    cold_latency: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def work(
    conn: http.client.HTTPConnection, address: str, seconds: float
) -> tuple[int, dict[str, str], bytes]:
    body = json.dumps({"seconds": seconds}).encode()
    conn.request("POST", f"/{address}/_rpc/work", body, {"content-type": "application/json"})
    resp = conn.getresponse()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()


def test_a_flooded_actor_refuses_the_excess_and_recovers(tmp_path: Path) -> None:
    data = tmp_path / "data"
    seen = Seen()
    stop = threading.Event()
    enough = threading.Event()

    with serve(APP, data, "--max-pending", str(MAX_PENDING)) as server:

        def flooder() -> None:
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=CLIENT_TIMEOUT)
            try:
                while not stop.is_set():
                    started = time.monotonic()
                    try:
                        status, headers, body = work(conn, "slow/hot", HOLD)
                    except (OSError, http.client.HTTPException) as exc:
                        with seen.lock:
                            seen.other.append(f"no answer: {exc!r}")
                        return
                    with seen.lock:
                        if status == 200:
                            seen.accepted.append(json.loads(body))
                            seen.accepted_latency.append(time.monotonic() - started)
                        elif status == 503:
                            seen.refused.append((headers, body))
                        else:
                            seen.other.append(f"{status} {body!r}")
                        if len(seen.refused) >= ENOUGH_REFUSED and (
                            len(seen.accepted) >= ENOUGH_ACCEPTED
                        ):
                            enough.set()
            finally:
                conn.close()

        def cold() -> None:
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=CLIENT_TIMEOUT)
            try:
                while not stop.is_set():
                    started = time.monotonic()
                    status, _, body = work(conn, "slow/cold", 0.0)
                    with seen.lock:
                        if status == 200:
                            seen.cold_latency.append(time.monotonic() - started)
                        else:
                            seen.other.append(f"cold: {status} {body!r}")
                    time.sleep(0.01)  # a steady trickle, not a second flood
            except (OSError, http.client.HTTPException) as exc:
                with seen.lock:
                    seen.other.append(f"cold: no answer: {exc!r}")
            finally:
                conn.close()

        threads = [threading.Thread(target=flooder, daemon=True) for _ in range(FLOODERS)]
        threads.append(threading.Thread(target=cold, daemon=True))
        try:
            for t in threads:
                t.start()
            flooded = enough.wait(FLOOD_TIMEOUT)
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=CLIENT_TIMEOUT + 5)
        assert not any(t.is_alive() for t in threads), "a client thread hangs"
        assert seen.other == []
        assert flooded, (len(seen.accepted), len(seen.refused))

        # The excess: 503, Retry-After in whole seconds, the error body.
        for headers, body in seen.refused:
            assert int(headers["retry-after"]) >= 1, headers
            assert headers["content-type"] == "application/json"
            error = json.loads(body)
            assert error["error"] == "Overloaded" and "slow/hot" in error["message"], error
        # Accepted requests all ran, once each, and waited only for the few ahead of them.
        assert sorted(seen.accepted) == list(range(1, len(seen.accepted) + 1))
        assert max(seen.accepted_latency) < ACCEPTED_LATENCY_BOUND, max(seen.accepted_latency)
        # The cold actor answered throughout.
        assert len(seen.cold_latency) >= 5, seen.cold_latency
        assert max(seen.cold_latency) < COLD_LATENCY_BOUND, max(seen.cold_latency)

        # Recovery: the flood is over and the hot actor answers at once, with the next count;
        # nothing refused was applied.
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=CLIENT_TIMEOUT)
        try:
            for i in range(1, MAX_PENDING + 3):
                status, _, body = work(conn, "slow/hot", 0.0)
                assert (status, json.loads(body)) == (200, len(seen.accepted) + i)
        finally:
            conn.close()
        assert server.proc.poll() is None
        print(
            f"flood: {len(seen.accepted)} accepted (max wait "
            f"{max(seen.accepted_latency):.2f} s), {len(seen.refused)} refused with 503; "
            f"cold actor: {len(seen.cold_latency)} answers, max "
            f"{max(seen.cold_latency) * 1000:.0f} ms"
        )
