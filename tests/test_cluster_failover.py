"""Faults of a three-host cluster with real processes: kill -9 of a host under the crash suite's
mixed load (bench/cluster_crash.py, one cycle here), and kill -9 of PostgreSQL's primary with
its synchronous standby promoted under durable writes: nothing acknowledged is lost."""

from __future__ import annotations

import http.client
import json
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from bench import cluster_crash
from tests.pg import Server as PgServer
from tests.pg import multi_host, running_pair
from tests.test_process import COUNTER_APP, serve

pytestmark = pytest.mark.slow

TTL, MARGIN = 1.5, 0.5


def test_kill_9_of_a_host_under_mixed_load_loses_nothing_acknowledged(
    pg_conninfo: str, tmp_path: Path
) -> None:
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    report = cluster_crash.run(pg_conninfo, tmp_path, cycles=1, seed=seed)
    print(report.summary())
    assert report.cycles == 1 and report.acks > cluster_crash.TAKEOVER_ACKS


@pytest.fixture
def pg_pair() -> Iterator[tuple[PgServer, PgServer]]:
    roots = [Path(tempfile.mkdtemp(prefix="actorkeep-pg-")) for _ in range(2)]
    try:
        with running_pair(*roots) as pair:
            yield pair
    finally:
        for root in roots:
            shutil.rmtree(root, ignore_errors=True)


class Writers:
    """Client threads doing durable increments of their own counters through every host in
    turn; what each was told."""

    def __init__(self, ports: list[int], threads: int = 6) -> None:
        self.ports = ports
        self.acked: dict[str, list[int]] = {}
        self.unknown: dict[str, int] = {}
        self.refused = 0  # 503 before anything ran: tried again
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(threads)]

    def __enter__(self) -> Writers:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)

    @property
    def acks(self) -> int:
        with self.lock:
            return sum(len(v) for v in self.acked.values())

    def _run(self, i: int) -> None:
        name = f"w{i}"
        body = json.dumps({"by": 1}).encode()
        n = 0
        while not self.stop.is_set():
            port = self.ports[n % len(self.ports)]
            n += 1
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
            try:
                conn.request(
                    "POST", f"/counter/{name}/_rpc/incr_durable", body,
                    {"content-type": "application/json"},
                )  # fmt: skip
                resp = conn.getresponse()
                data = resp.read()
            except (OSError, http.client.HTTPException):
                status, data = 0, b""
            else:
                status = resp.status
            finally:
                conn.close()
            with self.lock:
                if status == 200:
                    self.acked.setdefault(name, []).append(json.loads(data))
                elif status == 503 and b"not served by this host" in data:
                    self.refused += 1  # nobody owned it within the retry window: not run
                else:  # a commit whose outcome is unknown, a lost connection: may have applied
                    self.unknown[name] = self.unknown.get(name, 0) + 1
            if status != 200:
                time.sleep(0.05)


def test_kill_9_of_the_postgres_primary_loses_nothing_acknowledged(
    pg_pair: tuple[PgServer, PgServer], tmp_path: Path
) -> None:
    """The hosts connect with a multi-host conninfo (primary, then standby, read-write only).
    The primary is killed under durable writes, the standby promoted: the hosts connect to it
    on their own, the writes go on, and every count a client was told is there."""
    primary, standby = pg_pair
    primary.sql("CREATE DATABASE failover")
    conninfo = multi_host(primary, standby, dbname="failover")
    args = (
        "--cluster", conninfo, "--partitions", "16",
        "--lease-ttl", str(TTL), "--lease-margin", str(MARGIN),
    )  # fmt: skip
    with ExitStack() as stack:
        hosts = [
            stack.enter_context(serve(COUNTER_APP, tmp_path / f"h{i}", *args)) for i in range(3)
        ]
        with Writers([h.port for h in hosts]) as writers:
            end = time.monotonic() + 30
            while writers.acks < 60:
                assert time.monotonic() < end, "no load"
                time.sleep(0.05)
            primary.kill()
            killed_at, before = time.monotonic(), writers.acks
            time.sleep(0.5)
            standby.promote()
            while writers.acks < before + 60:
                assert time.monotonic() - killed_at < 60, "the writes did not resume"
                time.sleep(0.05)
            resumed = time.monotonic() - killed_at
        print(f"writes resumed {resumed:.2f} s after the primary's kill -9")
        for name, values in writers.acked.items():
            assert len(set(values)) == len(values), f"{name}: a count acknowledged twice"
            reply = None
            for _ in range(100):
                reply = hosts[0].get(f"/counter/{name}/")
                if reply.status == 200:
                    break
                time.sleep(0.05)
            assert reply is not None and reply.status == 200, reply
            final = reply.json()["n"]
            assert max(values) <= final, (name, max(values), final)  # nothing acknowledged lost
            assert final <= len(values) + writers.unknown.get(name, 0), (name, final)
