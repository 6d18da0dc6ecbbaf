"""WebSockets in a cluster of two ``actorkeep serve --cluster`` processes over a real
PostgreSQL: a socket taken by the host that does not own its room is relayed to the owner
(both see each other's messages), and when the owner is killed with kill -9 the relayed socket
closes with 1012; the client reconnects and the surviving host serves the room's history."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
from trio_websocket import ConnectionClosed, WebSocketConnection, open_websocket_url

from actorkeep.cluster.partitions import partition_of
from tests.test_cluster_process import cluster_args, first_answer
from tests.test_process import Server, serve

pytestmark = pytest.mark.slow

APP = "examples.chat.app:app"
ROOMS = [f"r{i}" for i in range(64)]


def owner(conninfo: str, address: str, servers: list[Server]) -> Server | None:
    """The host that owns ``address`` now, if any."""
    with psycopg.connect(conninfo) as conn:
        row = conn.execute(
            "SELECT h.address FROM actorkeep_leases l JOIN actorkeep_hosts h "
            "ON h.host_id = l.owner WHERE l.partition = %s AND l.expires_at > clock_timestamp()",
            (partition_of(address, 16),),
        ).fetchone()
    for server in servers:
        found = re.search(r"internal='?([^\s']+)", server.wait_for_line("actorkeep serving"))
        if row is not None and found is not None and found.group(1) == row[0]:
            return server
    return None


async def next_of(ws: WebSocketConnection, kind: str) -> dict[str, Any]:
    """The next message of type ``kind`` (others skipped)."""
    while True:
        message: dict[str, Any] = json.loads(await ws.get_message())
        if message["type"] == kind:
            return message


def test_a_socket_is_relayed_to_the_owner_and_closes_with_1012_when_it_dies(
    pg_conninfo: str, tmp_path: Path
) -> None:
    args = cluster_args(pg_conninfo)
    with serve(APP, tmp_path / "a", *args) as a, serve(APP, tmp_path / "b", *args) as b:
        first_answer([a, b], "/room/r0/messages", deadline=20)
        deadline = time.monotonic() + 30  # the hosts share the partitions out
        while not (theirs := [r for r in ROOMS if owner(pg_conninfo, f"room/{r}", [a, b]) is b]):
            assert time.monotonic() < deadline, "b owns none of the rooms"
            time.sleep(0.2)
        room = theirs[0]

        async def chat() -> None:
            via_a = f"ws://127.0.0.1:{a.port}/room/{room}/ws?user=ann"
            on_b = f"ws://127.0.0.1:{b.port}/room/{room}/ws?user=bob"
            async with open_websocket_url(via_a) as ann, open_websocket_url(on_b) as bob:
                assert (await next_of(ann, "history"))["messages"] == []
                await next_of(bob, "history")
                await ann.send_message(json.dumps({"text": "from a"}))
                await bob.send_message(json.dumps({"text": "from b"}))
                for ws in (ann, bob):
                    texts = {(await next_of(ws, "message"))["text"] for _ in range(2)}
                    assert texts == {"from a", "from b"}
                b.kill()  # the owner dies: the relayed socket closes with 1012
                with trio.fail_after(10), pytest.raises(ConnectionClosed) as closed:
                    while True:
                        await ann.get_message()
                assert closed.value.reason is not None and closed.value.reason.code == 1012
            # The client reconnects; once b's lease is gone, a serves the room from the store.
            with trio.fail_after(20):
                while True:
                    try:
                        async with open_websocket_url(via_a) as again:
                            history = (await next_of(again, "history"))["messages"]
                            break
                    except Exception:  # 503 while nobody serves the room yet
                        await trio.sleep(0.2)
            assert {m["text"] for m in history} == {"from a", "from b"}

        trio.run(chat)
        assert owner(pg_conninfo, f"room/{room}", [a]) is a
        assert a.stop(signal.SIGTERM) == 0
