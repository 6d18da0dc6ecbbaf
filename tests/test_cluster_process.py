"""``actorkeep serve --cluster`` processes over one real PostgreSQL (tests/pg.py): every durable
write acknowledged by a host killed with kill -9 is served by the other once the dead host's
leases have expired, a planned stop hands its partitions over at once, a paused host answers
nothing once its lease ran out, and a rolling restart of three hosts answers only 200 and 503."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.test_process import COUNTER_APP, Server, serve

pytestmark = pytest.mark.slow

CLUSTER_APP = "tests.apps.cluster_app:app"
TTL, MARGIN = 1.5, 0.5
COUNTERS = 16
ROUNDS = 3


def cluster_args(conninfo: str) -> tuple[str, ...]:
    return (
        "--cluster", conninfo, "--partitions", "16",
        "--lease-ttl", str(TTL), "--lease-margin", str(MARGIN),
    )  # fmt: skip


def owner_port(conninfo: str, i: int, servers: list[Server]) -> int | None:
    """The HTTP port of the host that owns ``counter/c<i>`` now."""
    import re

    import psycopg

    from actorkeep.cluster.partitions import partition_of

    with psycopg.connect(conninfo) as conn:
        row = conn.execute(
            "SELECT h.address FROM actorkeep_leases l JOIN actorkeep_hosts h "
            "ON h.host_id = l.owner WHERE l.partition = %s AND l.expires_at > clock_timestamp()",
            (partition_of(f"counter/c{i}", 16),),
        ).fetchone()
    for server in servers:
        found = re.search(r"internal='?([^\s']+)", server.wait_for_line("actorkeep serving"))
        if row is not None and found is not None and found.group(1) == row[0]:
            return server.port
    return None


def first_answer(
    servers: list[Server], path: str, deadline: float, body: dict[str, int] | None = None
) -> tuple[int, Any]:
    """Ask each host in turn until one serves ``path`` (the others answer 503): its answer."""
    end = time.monotonic() + deadline
    while True:
        for server in servers:
            reply = server.rpc(path, body) if body is not None else server.get(path)
            if reply.status != 503:
                return reply.status, reply.json()
        assert time.monotonic() < end, f"{path}: 503 from every host for {deadline} s"
        time.sleep(0.05)


def increment(servers: list[Server], i: int, deadline: float) -> tuple[int, int]:
    """One durable increment of ``counter/c<i>``, asked of each host in turn until one
    acknowledges it: the count it answered, and how many 503 ``OutcomeUnknown`` came first
    (each may have applied: the host lost its lease, or its commit's answer, while it ran)."""
    end = time.monotonic() + deadline
    unknown = 0
    while True:
        for server in servers:
            reply = server.rpc(f"/counter/c{i}/_rpc/incr_durable", {"by": 1})
            if reply.status == 200:
                return reply.json(), unknown
            assert reply.status == 503, reply
            unknown += reply.json()["error"] == "OutcomeUnknown"
        assert time.monotonic() < end, f"c{i}: 503 from every host for {deadline} s"
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
        acked, unknown = {}, dict.fromkeys(range(COUNTERS), 0)
        for _ in range(ROUNDS):
            for i in range(COUNTERS):
                acked[i], unsure = increment([a, b], i, 10)
                unknown[i] += unsure
        for i in range(COUNTERS):
            assert ROUNDS <= acked[i] <= ROUNDS + unknown[i], (i, acked[i], unknown[i])
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
        n, unsure = increment([b], 0, 5)
        assert acked[0] + 1 <= n <= acked[0] + 1 + unsure  # and it writes on


def test_a_paused_host_answers_nothing_once_its_lease_ran_out(
    pg_conninfo: str, tmp_path: Path
) -> None:
    """SIGSTOP one host past its leases while one of its actors runs a slow read; the other
    host takes its partitions over and writes on. After SIGCONT the paused host, with stale
    beliefs, never answers with what it held: the read that was running gets 503 (its lease
    ran out by the host's own clock before its reply could leave), and every answer from
    either host is the acknowledged count."""
    import signal
    import threading

    args = cluster_args(pg_conninfo)
    with (
        serve(CLUSTER_APP, tmp_path / "a", *args) as a,
        serve(CLUSTER_APP, tmp_path / "b", *args) as b,
    ):
        time.sleep(TTL)
        acked = {}
        for i in range(COUNTERS):
            acked[i], _ = increment([a, b], i, 10)
        mine = [i for i in range(COUNTERS) if owner_port(pg_conninfo, i, [a, b]) == a.port]
        assert mine, "a serves nothing"
        assert len(mine) >= 2, mine
        running: list[int] = []
        writing: list[int] = []
        slow = threading.Thread(
            target=lambda: running.append(
                a.rpc(f"/counter/c{mine[0]}/_rpc/count_after", {"seconds": 0.5}).status
            )
        )
        slow_write = threading.Thread(
            target=lambda: writing.append(
                a.rpc(f"/counter/c{mine[-1]}/_rpc/incr_after", {"seconds": 0.5}).status
            )
        )
        slow.start()
        slow_write.start()
        time.sleep(0.2)  # the read and the write run on a...
        a.proc.send_signal(signal.SIGSTOP)  # ...when a stops
        try:
            for i in mine:  # b takes them over once a's leases expire, and writes on
                n, unsure = increment([b], i, 4 * TTL)
                assert acked[i] + 1 <= n <= acked[i] + 1 + unsure, (i, n, unsure)
                acked[i] = n
        finally:
            a.proc.send_signal(signal.SIGCONT)
        slow.join(15)
        slow_write.join(15)
        assert running == [503], running  # no answer left a after its lease ran out
        assert writing == [503], writing  # nor for the write, fenced: b's counts stay (below)
        wrong = []
        end = time.monotonic() + 3 * TTL
        while time.monotonic() < end:  # a wakes up: it rejoins, and takes a share again
            for i in mine:
                for server in (a, b):
                    reply = server.get(f"/counter/c{i}/")
                    if reply.status == 200 and reply.json()["n"] != acked[i]:
                        wrong.append((server.port, i, reply.json()))
                    assert reply.status in (200, 503), reply
        assert wrong == []  # never a count it held before the pause (nor one past b's)
        for i in range(COUNTERS):  # and every counter is served by one of them
            status, body = first_answer([a, b], f"/counter/c{i}/", 4 * TTL)
            assert status == 200 and body["n"] == acked[i], (i, body)


def test_a_rolling_restart_under_load_answers_nothing_but_200_and_503(
    pg_conninfo: str, tmp_path: Path
) -> None:
    """All three hosts are restarted in turn (SIGTERM, then a new process on the same
    directory) while a client keeps incrementing counters through the hosts in turn (each
    forwards to the owner): no answer but 200 or 503, and every acknowledged increment is in
    the final counts (a 503 may or may not have applied: a host that closes answers what it
    was running with 503)."""
    import signal
    import threading

    args = cluster_args(pg_conninfo)
    first = [Server(COUNTER_APP, tmp_path / name, args) for name in "abc"]
    hosts = list(first)
    try:
        time.sleep(TTL)
        acked = dict.fromkeys(range(COUNTERS), 0)
        unsure = dict.fromkeys(range(COUNTERS), 0)
        other: list[object] = []
        stop = threading.Event()

        def client() -> None:
            i = 0
            while not stop.is_set():
                i = (i + 1) % COUNTERS
                for server in list(hosts):
                    try:
                        reply = server.rpc(f"/counter/c{i}/_rpc/incr_durable", {"by": 1})
                    except OSError:
                        continue  # that host is restarting
                    if reply.status == 200:
                        acked[i] += 1
                        break
                    if reply.status != 503:
                        other.append((reply.status, reply.body))
                    unsure[i] += 1

        thread = threading.Thread(target=client)
        thread.start()
        try:
            for k in (0, 1, 2):
                time.sleep(1.0)
                assert hosts[k].stop(signal.SIGTERM, timeout=15) == 0
                hosts[k] = Server(COUNTER_APP, hosts[k].data, args)
            time.sleep(2 * TTL)
        finally:
            stop.set()
            thread.join(30)
        print(f"rolling restart: {sum(acked.values())} acknowledged, {sum(unsure.values())} 503")
        assert other == []
        assert sum(acked.values()) > 50
        for i in range(COUNTERS):
            status, body = first_answer(hosts, f"/counter/c{i}/", 4 * TTL)
            assert status == 200, body
            assert acked[i] <= body["n"] <= acked[i] + unsure[i], (i, acked[i], body, unsure[i])
    finally:
        for server in [*hosts, *first]:
            server.close()
