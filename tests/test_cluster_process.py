"""Two ``actorkeep serve --cluster`` processes over one real PostgreSQL (tests/pg.py): every
durable write acknowledged by a host killed with kill -9 is served by the other once the dead
host's leases have expired, and a planned stop hands its partitions over at once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.test_process import COUNTER_APP, Server, serve

pytestmark = pytest.mark.slow

TTL, MARGIN = 1.5, 0.5
COUNTERS = 16
ROUNDS = 3


def cluster_args(conninfo: str) -> tuple[str, ...]:
    return (
        "--cluster", conninfo, "--partitions", "16",
        "--lease-ttl", str(TTL), "--lease-margin", str(MARGIN),
    )  # fmt: skip


def first_answer(
    servers: list[Server], path: str, deadline: float, body: dict[str, int] | None = None
) -> tuple[int, object]:
    """Ask each host in turn until one serves ``path`` (the others answer 503): its answer."""
    end = time.monotonic() + deadline
    while True:
        for server in servers:
            reply = server.rpc(path, body) if body is not None else server.get(path)
            if reply.status != 503:
                return reply.status, reply.json()
        assert time.monotonic() < end, f"{path}: 503 from every host for {deadline} s"
        time.sleep(0.05)


@pytest.mark.parametrize("stop", ["kill -9", "SIGTERM"])
def test_acknowledged_durable_writes_move_to_the_surviving_host(
    pg_conninfo: str, tmp_path: Path, stop: str
) -> None:
    args = cluster_args(pg_conninfo)
    with (
        serve(COUNTER_APP, tmp_path / "a", *args) as a,
        serve(COUNTER_APP, tmp_path / "b", *args) as b,
    ):
        time.sleep(TTL)  # both hosts alive: each holds about half the partitions
        acked = {}
        for _ in range(ROUNDS):
            for i in range(COUNTERS):
                status, n = first_answer([a, b], f"/counter/c{i}/_rpc/incr_durable", 10, {"by": 1})
                assert status == 200, n
                acked[i] = n
        assert acked == dict.fromkeys(range(COUNTERS), ROUNDS)
        start = time.monotonic()
        if stop == "kill -9":
            a.kill()
        else:
            import signal

            assert a.stop(signal.SIGTERM) == 0
        for i in range(COUNTERS):
            status, body = first_answer([b], f"/counter/c{i}/", 4 * TTL)
            assert status == 200 and body == {"name": f"c{i}", "n": acked[i]}, (i, body)
        took = time.monotonic() - start
        print(f"{stop}: every counter served by the other host {took:.2f} s after")
        if stop == "SIGTERM":
            assert took < TTL  # handed over at once, not after the leases expired
        status, n = first_answer([b], "/counter/c0/_rpc/incr_durable", 5, {"by": 1})
        assert (status, n) == (200, ROUNDS + 1)  # and it writes on
