"""KV writes under kill -9 of a real host process (docs/reference.md §7 durability, issue 3)."""

from __future__ import annotations

import http.client
import threading
from pathlib import Path

import pytest

from .test_process import Server, serve

pytestmark = pytest.mark.slow

APP = "tests.apps.kv_app:app"


def put(server: Server, key: str, value: str, local: bool) -> int | None:
    """The version, or None when the host gave no answer (it was killed)."""
    try:
        reply = server.rpc("/store/s/_rpc/put", {"key": key, "value": value, "local": local})
    except (OSError, http.client.HTTPException):
        return None
    assert reply.status == 200, reply
    version: int = reply.json()
    return version


def shard_of(server: Server, key: str) -> str:
    shard: str = server.rpc("/store/s/_rpc/shard_of", {"key": key}).json()
    return shard


def test_acknowledged_kv_writes_survive_kill_9(tmp_path: Path) -> None:
    """Durable and local puts race a kill -9; after each restart every acknowledged write is
    there with its version, and no shard hands out a version it handed out before."""
    data = tmp_path / "data"
    acked: dict[str, tuple[str, int]] = {}
    lock = threading.Lock()
    for cycle in range(3):
        with serve(APP, data) as server:
            enough = threading.Event()

            def writer(
                t: int,
                server: Server = server,
                cycle: int = cycle,
                enough: threading.Event = enough,
            ) -> None:
                for i in range(10_000):
                    key, value = f"c{cycle}/t{t}/{i}", f"{cycle}-{t}-{i}"
                    version = put(server, key, value, local=i % 2 == 0)
                    if version is None:
                        return
                    with lock:
                        acked[key] = (value, version)
                        if len(acked) > 60 * (cycle + 1):
                            enough.set()

            threads = [threading.Thread(target=writer, args=(t,)) for t in range(6)]
            for th in threads:
                th.start()
            assert enough.wait(30), "the host did not take writes"
            server.kill()  # while writes are in flight
            for th in threads:
                th.join(30)
        with serve(APP, data) as server:
            highest: dict[str, int] = {}
            for key, (value, version) in acked.items():
                got = server.rpc("/store/s/_rpc/get", {"key": key}).json()
                assert got == [value, version], key
                shard = shard_of(server, key)
                highest[shard] = max(highest.get(shard, 0), version)
            assert len(highest) == 4
            for shard, top in highest.items():
                probe = next(
                    f"probe{cycle}-{j}"
                    for j in range(1000)
                    if shard_of(server, f"probe{cycle}-{j}") == shard
                )
                new_version = put(server, probe, "p", local=True)
                assert new_version is not None and new_version > top
    assert len(acked) > 180
