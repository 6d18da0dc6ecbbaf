"""Crash suite: the jobs example under mixed HTTP load, killed with SIGKILL at random moments.

Every cycle starts ``actorkeep serve tests.apps.crash_app:app`` (the jobs example with short
webhook-queue timings, see that module) on a free port of 127.0.0.1 over the same data
directory, and then:

1. **Alarms.** Sending nothing, it waits until the webhook queue has delivered or dead-lettered
   every message that was in it at the last kill (only the host's alarms can make that happen),
   then checks the queue accounting: every acknowledged send was delivered to
   ``deliverer/main`` or dead-lettered, exactly one of the two, each message once.
2. **Reads.** A sample of KV settings and counters read over HTTP must match the files.
3. **Load.** Client threads (``http.client``, one keep-alive connection each) drive durable KV
   puts through ``api/<n>``, compare-and-set counters through ``tally/<n>``, and webhook sends
   through ``api/<n>`` that the queue pushes to the deliverer. After a random time the host is
   killed with SIGKILL while requests are in flight.
4. **Files.** From the killed host's files: every acknowledged KV write is there with its
   version, or superseded by a later write; no version names two values; no counter went back,
   lost an acknowledged increment or gained one nobody sent; no acknowledged send is missing.

After the last kill the host is started once more, drained and checked as in 1 and 2, and
stopped with SIGTERM. The random choices (kill times, keys, failing jobs) come from ``--seed``,
which is printed; when the kill lands relative to the requests in flight is up to the threads
and the OS, so a seed does not replay a run exactly.

    python bench/crash.py [--cycles 20] [--seed N] [--data DIR] [--app MODULE:APP]

``tests/test_crash.py`` runs ``run()`` with 3 cycles; the checks are plain functions over a
``Ledger`` (what clients were told) and a ``Snapshot`` (what the files hold), unit-tested there
with fabricated inconsistent states.
"""

from __future__ import annotations

# Run as a script, this file's directory comes first on sys.path, where bench/http.py and
# bench/queue.py would shadow the standard library modules of those names. Put the repository
# root there instead, before anything else is imported.
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _HERE:
    sys.path[0] = os.path.dirname(_HERE)

import argparse
import contextlib
import http.client
import itertools
import json
import random
import shutil
import signal
import sqlite3
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from actorkeep.address import actor_path
from actorkeep.kv import shard_for
from tests.test_process import Server

APP = "tests.apps.crash_app:app"
SHARDS = 4  # the jobs example's KV shard count
PUT_KEYS = 16  # settings keys shared by the put threads: writes supersede each other
COUNTERS = 3  # counter keys shared by the bump threads: compare-and-set conflicts
FAIL_RATE = 0.05  # webhook jobs whose delivery always fails: retried, then dead-lettered
THREADS = {"put": 2, "bump": 2, "send": 2}
ACKS_BEFORE_KILL = 30  # answered requests per cycle before the kill timer starts
KILL_AFTER = (0.2, 1.5)  # then the kill comes after a uniform random time in this range (s)
CLIENT_TIMEOUT = 10.0
LOAD_TIMEOUT = 60.0  # for ACKS_BEFORE_KILL answers
DRAIN_TIMEOUT = 60.0  # for the queue to empty after a restart (visibility 3 s, backoff <= 2 s)
SAMPLE_READS = 8

Log = Callable[[str], None]


class Inconsistent(AssertionError):
    """The files or the host disagree with what clients were told."""

    def __init__(self, when: str, problems: list[str]) -> None:
        shown = "\n  ".join(problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        super().__init__(f"{when}: {len(problems)} problem(s):\n  {shown}{more}")
        self.problems = problems


# -- what clients were told, and what the files hold ------------------------------------------


@dataclass
class Ledger:
    """What the clients sent and what the host acknowledged. ``lock`` guards it under load."""

    put_tried: dict[bytes, set[bytes]] = field(default_factory=dict)  # key -> values sent
    put_acked: dict[bytes, dict[bytes, int]] = field(default_factory=dict)  # key -> value -> ver
    bump_acked: dict[bytes, list[tuple[int, int]]] = field(default_factory=dict)  # [(n, ver)]
    bump_unanswered: dict[bytes, int] = field(default_factory=dict)
    send_tried: dict[str, bool] = field(default_factory=dict)  # tag -> fails on delivery
    send_acked: dict[int, str] = field(default_factory=dict)  # job id -> tag
    unanswered: int = 0  # requests cut off by a kill: applied or not, nobody knows
    errors: list[str] = field(default_factory=list)  # answers no request should get
    # Every (shard, version) seen so far, in an answer or in a file, and what it named.
    versions: dict[tuple[int, int], tuple[bytes, bytes]] = field(default_factory=dict)
    counter_floor: dict[bytes, int] = field(default_factory=dict)  # last value seen on disk
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def acks(self) -> int:
        puts = sum(len(v) for v in self.put_acked.values())
        bumps = sum(len(v) for v in self.bump_acked.values())
        return puts + bumps + len(self.send_acked)


@dataclass
class Snapshot:
    """The rows that matter, read from the data directory with read-only connections."""

    kv: dict[bytes, tuple[bytes, int, int]] = field(
        default_factory=dict
    )  # key -> value, ver, shard
    seq: dict[int, int] = field(default_factory=dict)  # shard -> versions reserved up to
    queued: dict[int, bytes] = field(default_factory=dict)  # webhook id -> body
    dead: dict[int, bytes] = field(default_factory=dict)  # id -> body
    delivered: dict[int, list[tuple[int, bytes]]] = field(default_factory=dict)  # [(attempt, b)]


def _rows(path: Path, table: str, columns: str) -> list[tuple[Any, ...]]:
    if not path.exists():
        return []
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=CLIENT_TIMEOUT)
    try:
        found = conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (table,)).fetchone()
        return conn.execute(f"SELECT {columns} FROM {table}").fetchall() if found else []
    finally:
        conn.close()


def queued_ids(data: Path) -> set[int]:
    path = actor_path(data / "actors", "queue", "webhooks")
    return {i for (i,) in _rows(path, "actorkeep_queue", "id")}


def read_snapshot(data: Path) -> Snapshot:
    root = data / "actors"
    snap = Snapshot()
    for shard in range(SHARDS):
        path = actor_path(root, "kv", f"shard-{shard}")
        for key, value, version in _rows(path, "actorkeep_kv", "key, value, version"):
            snap.kv[bytes(key)] = (bytes(value), version, shard)
        for (seq,) in _rows(path, "actorkeep_kv_meta", "seq"):
            snap.seq[shard] = seq
    queue = actor_path(root, "queue", "webhooks")
    snap.queued = {i: bytes(b) for i, b in _rows(queue, "actorkeep_queue", "id, body")}
    snap.dead = {i: bytes(b) for i, b in _rows(queue, "actorkeep_queue_dead", "id, body")}
    deliverer = actor_path(root, "deliverer", "main")
    for job, attempt, body in _rows(deliverer, "deliveries", "job, attempt, body"):
        snap.delivered.setdefault(job, []).append((attempt, body.encode()))
    return snap


# -- the checks ---------------------------------------------------------------------------------


def check_versions(ledger: Ledger, snap: Snapshot) -> list[str]:
    """No version names two values; no version is above its shard's durable reservation."""
    problems: list[str] = []
    named: list[tuple[str, int, int, bytes, bytes]] = []
    for key, values in ledger.put_acked.items():
        named += [("put answer", shard_for(key, SHARDS), v, key, val) for val, v in values.items()]
    for key, acks in ledger.bump_acked.items():
        named += [("bump answer", shard_for(key, SHARDS), v, key, b"%d" % n) for n, v in acks]
    named += [("file", shard, v, key, val) for key, (val, v, shard) in snap.kv.items()]
    for source, shard, version, key, value in named:
        known = ledger.versions.setdefault((shard, version), (key, value))
        if known != (key, value):
            problems.append(
                f"version reused: kv/shard-{shard} version {version} named {known!r} and now "
                f"({key!r}, {value!r}) in a {source}"
            )
        seq = snap.seq.get(shard)
        if source == "file" and (seq is None or version > seq):
            problems.append(
                f"kv/shard-{shard}: version {version} of {key!r} is above the durable "
                f"reservation {seq}: a restart could hand it out again"
            )
    return problems


def check_puts(ledger: Ledger, snap: Snapshot) -> list[str]:
    """Every acknowledged put is there with its version, or superseded by a later write."""
    problems: list[str] = []
    for key, acked in ledger.put_acked.items():
        if not acked:
            continue
        top_value, top_version = max(acked.items(), key=lambda item: item[1])
        row = snap.kv.get(key)
        if row is None:
            problems.append(f"{key!r}: lost; acknowledged at version {top_version}")
            continue
        value, version, _ = row
        if version < top_version:
            problems.append(
                f"{key!r}: version {version} on disk, older than the acknowledged {top_version}"
            )
        elif version == top_version and value != top_value:
            problems.append(
                f"{key!r}: version {version} holds {value!r}, acknowledged as {top_value!r}"
            )
        elif value in acked and acked[value] != version:
            problems.append(
                f"{key!r}: {value!r} has version {version}, acknowledged as {acked[value]}"
            )
        elif value not in ledger.put_tried.get(key, set()):
            problems.append(f"{key!r}: holds {value!r}, which no client sent")
    return problems


def check_counters(ledger: Ledger, snap: Snapshot) -> list[str]:
    """Counters never go back, never lose an acknowledged increment, never gain an unsent one."""
    problems: list[str] = []
    for key in ledger.bump_acked.keys() | ledger.bump_unanswered.keys():
        acks = sorted(ledger.bump_acked.get(key, []))
        values = [n for n, _ in acks]
        if len(set(values)) != len(values):
            dup = sorted({n for n in values if values.count(n) > 1})
            problems.append(f"{key!r}: values {dup} were each acknowledged to two increments")
        for (n1, v1), (n2, v2) in itertools.pairwise(acks):
            if n1 < n2 and v1 >= v2:
                problems.append(f"{key!r}: value {n2} has version {v2}, not above {n1}'s {v1}")
        row = snap.kv.get(key)
        n_disk = 0 if row is None else int(row[0])
        if acks:
            top_n, top_v = acks[-1]
            if n_disk < top_n:
                problems.append(f"{key!r}: {n_disk} on disk, but increment to {top_n} was acked")
            elif n_disk == top_n and row is not None and row[1] != top_v:
                problems.append(
                    f"{key!r}: {n_disk} at version {row[1]}, acknowledged at version {top_v}"
                )
        sent = len(acks) + ledger.bump_unanswered.get(key, 0)
        if n_disk > sent:
            problems.append(f"{key!r}: {n_disk} on disk, but only {sent} increments were sent")
        floor = ledger.counter_floor.get(key, 0)
        if n_disk < floor:
            problems.append(f"{key!r}: went back from {floor} to {n_disk}")
        ledger.counter_floor[key] = max(floor, n_disk)
    return problems


def tag_of(body: bytes) -> str | None:
    try:
        event = json.loads(body)
    except ValueError:
        return None
    tag = event.get("tag") if isinstance(event, dict) else None
    return tag if isinstance(tag, str) else None


def check_queue(ledger: Ledger, snap: Snapshot, settled: bool) -> list[str]:
    """Every acknowledged send is queued, delivered or dead-lettered; never both of the last
    two; each send one message. ``settled``: the queue has drained, so each message must have
    ended delivered (a job that succeeds) or dead-lettered (a job that fails), exactly once."""
    problems: list[str] = []
    places: dict[int, set[str]] = {}
    tag_by_id: dict[int, str] = {}
    ids_of: dict[str, set[int]] = {}
    sources: list[tuple[str, dict[int, bytes]]] = [
        ("queued", snap.queued),
        ("dead", snap.dead),
        ("delivered", {job: rows[0][1] for job, rows in snap.delivered.items()}),
    ]
    for place, bodies in sources:
        for i, body in bodies.items():
            tag = tag_of(body)
            if tag is None or tag not in ledger.send_tried:
                problems.append(f"message {i} ({place}) holds {body!r}, which no client sent")
                continue
            if i in ledger.send_acked and ledger.send_acked[i] != tag:
                problems.append(
                    f"message {i} holds {tag!r}, acknowledged as {ledger.send_acked[i]!r}"
                )
            if tag_by_id.setdefault(i, tag) != tag:
                problems.append(f"message {i} holds {tag!r} ({place}) and {tag_by_id[i]!r}")
            places.setdefault(i, set()).add(place)
            ids_of.setdefault(tag, set()).add(i)
    for job, rows in snap.delivered.items():
        if len({body for _, body in rows}) > 1:
            problems.append(f"message {job} was delivered with different bodies: {rows}")
    for tag, ids in ids_of.items():
        if len(ids) > 1:
            problems.append(f"{tag!r} was sent once but is messages {sorted(ids)}")
    for i in ledger.send_acked:
        if i not in places:
            problems.append(f"message {i}: acknowledged send lost (not queued, delivered or dead)")
    for i, where in sorted(places.items()):
        fails = ledger.send_tried[tag_by_id[i]]
        if {"dead", "delivered"} <= where:
            problems.append(f"message {i}: both delivered and dead-lettered")
        if {"dead", "queued"} <= where:
            problems.append(f"message {i}: both queued and dead-lettered")
        if fails and "delivered" in where:
            problems.append(f"message {i}: a job that always fails was recorded as delivered")
        if not fails and "dead" in where:
            problems.append(f"message {i}: a job that succeeds was dead-lettered")
        if settled and "queued" in where:
            problems.append(f"message {i}: still queued after the queue drained")
    return problems


def check_all(ledger: Ledger, snap: Snapshot, settled: bool) -> list[str]:
    return (
        check_versions(ledger, snap)
        + check_puts(ledger, snap)
        + check_counters(ledger, snap)
        + check_queue(ledger, snap, settled)
    )


# -- the load -------------------------------------------------------------------------------


def exchange(
    conn: http.client.HTTPConnection, method: str, path: str, body: bytes, json_body: bool
) -> tuple[int, bytes] | None:
    """One request on a keep-alive connection; None when no answer came (the host died)."""
    headers = {"content-type": "application/json"} if json_body else {}
    try:
        conn.request(method, path, body, headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    except (OSError, http.client.HTTPException):
        return None


class Load:
    """Client threads, each looping over one kind of request until its first unanswered one.

    ``unknown_ok``: a 500 or 503 answer counts as a request whose outcome is unknown (as one
    cut off by a kill) and the thread goes on: in a cluster, a call in flight to a host that
    was killed may have applied or not, and the caller is told so with one of those."""

    def __init__(
        self,
        port: int | list[int],
        ledger: Ledger,
        rng: random.Random,
        cycle: int,
        unknown_ok: bool = False,
        threads: int | None = None,
    ) -> None:
        self.ports = [port] if isinstance(port, int) else port
        self.unknown_ok = unknown_ok
        per_kind = THREADS if threads is None else dict.fromkeys(THREADS, threads // len(THREADS))
        self.ledger = ledger
        self.cycle = cycle
        self.answered = 0
        self.enough = threading.Event()
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(
                target=self._client,
                args=(kind, t, random.Random(rng.getrandbits(64))),
                name=f"crash-{kind}-{t}",
                daemon=True,
            )
            for kind, count in per_kind.items()
            for t in range(count)
        ]

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=CLIENT_TIMEOUT + 5)
        hung = [t.name for t in self.threads if t.is_alive()]
        if hung and exc[0] is None:
            raise AssertionError(f"client threads still running after the kill: {hung}")

    def _client(self, kind: str, t: int, rng: random.Random) -> None:
        step = {"put": self._put, "bump": self._bump, "send": self._send}[kind]
        port = self.ports[t % len(self.ports)]
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=CLIENT_TIMEOUT)
        try:
            for i in range(1_000_000):
                if self.stop.is_set() or not step(conn, t, i, rng):
                    return
                with self.ledger.lock:
                    self.answered += 1
                    if self.answered >= ACKS_BEFORE_KILL:
                        self.enough.set()
        finally:
            conn.close()

    def _unexpected(self, what: str, status: int, body: bytes) -> bool:
        with self.ledger.lock:
            self.ledger.errors.append(f"{what}: {status} {body[:200]!r}")
        return False

    def _unknown(self, status: int, counter: bytes | None = None) -> bool | None:
        """A 500 or 503 under ``unknown_ok``: counted as unanswered, True (go on); else None."""
        if not (self.unknown_ok and status in (500, 503)):
            return None
        with self.ledger.lock:
            self.ledger.unanswered += 1
            if counter is not None:
                unanswered = self.ledger.bump_unanswered
                unanswered[counter] = unanswered.get(counter, 0) + 1
        return True

    def _put(self, conn: http.client.HTTPConnection, t: int, i: int, rng: random.Random) -> bool:
        name = f"crash-{rng.randrange(PUT_KEYS)}"
        key, value = f"settings/{name}".encode(), f"c{self.cycle}.w{t}.{i}".encode()
        with self.ledger.lock:
            self.ledger.put_tried.setdefault(key, set()).add(value)
        got = exchange(conn, "PUT", f"/api/w{t}/settings/{name}", value, False)
        if got is None:
            with self.ledger.lock:
                self.ledger.unanswered += 1
            return False
        status, body = got
        if status != 200:
            unknown = self._unknown(status)
            return unknown if unknown is not None else self._unexpected(f"PUT {name}", status, body)
        version = json.loads(body)["version"]
        with self.ledger.lock:
            self.ledger.put_acked.setdefault(key, {})[value] = version
        return True

    def _bump(self, conn: http.client.HTTPConnection, t: int, i: int, rng: random.Random) -> bool:
        key = f"counter-{rng.randrange(COUNTERS)}"
        args = json.dumps({"key": key}).encode()
        got = exchange(conn, "POST", f"/tally/b{t}/_rpc/bump", args, True)
        if got is None:
            with self.ledger.lock:
                self.ledger.unanswered += 1
                unanswered = self.ledger.bump_unanswered
                unanswered[key.encode()] = unanswered.get(key.encode(), 0) + 1
            return False
        status, body = got
        if status != 200:
            unknown = self._unknown(status, key.encode())
            return unknown if unknown is not None else self._unexpected(f"bump {key}", status, body)
        n, version = json.loads(body)
        with self.ledger.lock:
            self.ledger.bump_acked.setdefault(key.encode(), []).append((n, version))
        return True

    def _send(self, conn: http.client.HTTPConnection, t: int, i: int, rng: random.Random) -> bool:
        tag = f"c{self.cycle}.s{t}.{i}"
        fails = i == 0 or rng.random() < FAIL_RATE  # at least one dead letter per thread
        event = {"type": "crash", "tag": tag, **({"fail": True} if fails else {})}
        with self.ledger.lock:
            self.ledger.send_tried[tag] = fails
        got = exchange(conn, "POST", f"/api/s{t}/events", json.dumps(event).encode(), True)
        if got is None:
            with self.ledger.lock:
                self.ledger.unanswered += 1
            return False
        status, body = got
        if status != 202:
            unknown = self._unknown(status)
            return unknown if unknown is not None else self._unexpected(f"send {tag}", status, body)
        job = json.loads(body)["job"]
        with self.ledger.lock:
            self.ledger.send_acked[job] = tag
        return True


# -- the cycles -----------------------------------------------------------------------------


@dataclass
class Report:
    seed: int
    cycles: int = 0
    puts: int = 0  # acknowledged durable KV puts
    bumps: int = 0  # acknowledged compare-and-set increments
    sends: int = 0  # acknowledged webhook sends
    delivered: int = 0  # messages delivered to the consumer (at the end)
    dead: int = 0  # messages dead-lettered (at the end)
    redelivered: int = 0  # messages delivered more than once (a crash between work and ack)
    queued_at_kill: list[int] = field(default_factory=list)  # messages in the queue at each kill
    unanswered: int = 0
    restart_s: list[float] = field(default_factory=list)  # spawn to first health answer
    drain_s: list[float] = field(default_factory=list)  # healthy again to an empty queue
    cycle_s: list[float] = field(default_factory=list)
    total_s: float = 0.0

    @property
    def acks(self) -> int:
        return self.puts + self.bumps + self.sends

    def summary(self) -> str:
        def spread(xs: list[float]) -> str:
            if not xs:
                return "-"
            return f"median {statistics.median(xs):.2f} s, max {max(xs):.2f} s"

        return (
            f"seed {self.seed}: {self.cycles} kill -9 cycles in {self.total_s:.1f} s "
            f"({spread(self.cycle_s)} per cycle); verified {self.acks} acknowledged writes "
            f"({self.puts} durable puts, {self.bumps} CAS increments, {self.sends} sends) after "
            f"every kill; {self.delivered} delivered, {self.dead} dead-lettered, "
            f"{self.redelivered} redelivered, {sum(self.queued_at_kill)} queued at the kills, "
            f"{self.unanswered} requests cut off; restart {spread(self.restart_s)}; queue "
            f"drained by alarms after a restart in {spread(self.drain_s)}"
        )


def _verify(when: str, ledger: Ledger, snap: Snapshot, settled: bool) -> None:
    problems = list(ledger.errors) + check_all(ledger, snap, settled)
    if problems:
        raise Inconsistent(when, problems)


def _start(app: str, data: Path, report: Report) -> Server:
    started = time.monotonic()
    server = Server(app, data, ())
    report.restart_s.append(time.monotonic() - started)
    return server


def _request(
    server: Server, method: str, path: str, args: Any = None, raw: bytes | None = None
) -> Any:
    """One request; the decoded JSON answer, or ``Inconsistent`` for an error status."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=CLIENT_TIMEOUT)
    try:
        if raw is not None:
            conn.request(method, path, raw)
        else:
            body = json.dumps(args).encode() if args is not None else None
            conn.request(method, path, body, {"content-type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
    finally:
        conn.close()
    if resp.status >= 300:
        raise Inconsistent(f"{method} {path}", [f"answered {resp.status}: {data[:300]!r}"])
    return json.loads(data)


def _drain(server: Server, data: Path, report: Report) -> None:
    """Wait, sending nothing, until the webhook queue is empty: the alarms must do it."""
    started = time.monotonic()
    while queued_ids(data):
        if server.proc.poll() is not None:
            raise Inconsistent("drain", [f"the host exited ({server.proc.returncode})"])
        if time.monotonic() - started > DRAIN_TIMEOUT:
            left = sorted(queued_ids(data))
            problem = f"{len(left)} messages still queued {DRAIN_TIMEOUT} s after the restart"
            raise Inconsistent("drain", [f"{problem} (alarms not firing?): {left[:10]}"])
        time.sleep(0.05)
    report.drain_s.append(time.monotonic() - started)


def _check_over_http(server: Server, ledger: Ledger, snap: Snapshot, rng: random.Random) -> None:
    """The restarted host serves what the files hold."""
    problems: list[str] = []
    shown = _request(server, "GET", "/deliverer/main/deliveries")
    got = {(d["job"], d["attempt"]) for d in shown}
    want = {(job, a) for job, rows in snap.delivered.items() for a, _ in rows}
    if got != want:
        problems.append(f"/deliverer/main/deliveries differs from its file: {got ^ want}")
    puts = sorted(k for k in ledger.put_acked if k in snap.kv)
    for key in rng.sample(puts, min(SAMPLE_READS, len(puts))):
        name = key.decode().removeprefix("settings/")
        entry = _request(server, "GET", f"/api/reader/settings/{name}")
        value, version, _ = snap.kv[key]
        if (entry["value"].encode(), entry["version"]) != (value, version):
            problems.append(f"GET {name}: {entry}, the file holds {value!r} at {version}")
    for key in sorted(ledger.bump_acked):
        got_n = _request(server, "POST", "/tally/reader/_rpc/read", {"key": key.decode()})
        row = snap.kv.get(key)
        want_n = None if row is None else [int(row[0]), row[1]]
        if got_n != want_n:
            problems.append(f"read {key!r}: {got_n}, the file holds {want_n}")
    if problems:
        raise Inconsistent("reads over HTTP after the restart", problems)


def _settle(
    server: Server, data: Path, ledger: Ledger, report: Report, rng: random.Random, when: str
) -> Snapshot:
    _drain(server, data, report)
    snap = read_snapshot(data)
    _verify(f"{when}, after the queue drained", ledger, snap, settled=True)
    _check_over_http(server, ledger, snap, rng)
    return snap


def run(
    data: Path,
    cycles: int,
    seed: int,
    app: str = APP,
    log: Log = print,
) -> Report:
    """``cycles`` kill -9 cycles over ``data``; raises ``Inconsistent`` at the first problem."""
    rng = random.Random(seed)
    ledger = Ledger()
    report = Report(seed)
    begun = time.monotonic()
    server: Server | None = None
    try:
        for cycle in range(cycles + 1):
            cycle_begun = time.monotonic()
            server = _start(app, data, report)
            when = f"cycle {cycle}"
            if cycle == 0:  # the deliverer posts nothing until the endpoint is set
                key, endpoint = b"settings/endpoint", b"https://hooks.example/crash"
                ledger.put_tried[key] = {endpoint}
                reply = _request(server, "PUT", "/api/main/settings/endpoint", raw=endpoint)
                ledger.put_acked[key] = {endpoint: reply["version"]}
            else:
                _settle(server, data, ledger, report, rng, when)
            if cycle == cycles:
                break
            with Load(server.port, ledger, rng, cycle) as load:
                if not load.enough.wait(LOAD_TIMEOUT):
                    few = f"only {load.answered} answers in {LOAD_TIMEOUT} s"
                    raise Inconsistent(when, [few, *ledger.errors])
                time.sleep(rng.uniform(*KILL_AFTER))  # the random moment of the kill
                if server.proc.poll() is not None:
                    raise Inconsistent(when, [f"the host exited ({server.proc.returncode})"])
                server.kill()
            snap = read_snapshot(data)
            report.queued_at_kill.append(len(snap.queued))
            _verify(f"{when}, after kill -9", ledger, snap, settled=False)
            report.cycles += 1
            report.cycle_s.append(time.monotonic() - cycle_begun)
            drained = f", queue drained in {report.drain_s[-1]:.2f} s" if cycle else ""
            log(
                f"cycle {cycle + 1}/{cycles}: restart {report.restart_s[-1]:.2f} s{drained}; "
                f"killed with {len(snap.queued)} messages queued; checked {ledger.acks} "
                f"acknowledged writes; {time.monotonic() - cycle_begun:.1f} s"
            )
        assert server is not None
        code = server.stop(signal.SIGTERM, timeout=10.0)
        if code != 0:
            raise Inconsistent("stop", [f"SIGTERM: exit code {code}"])
    except BaseException:
        if server is not None:
            server.close()
            tail = "\n".join(server.stderr().splitlines()[-40:])
            log(f"--- seed {seed}; the last host's stderr ({server.log}) ends with:\n{tail}")
        raise
    finally:
        if server is not None:
            server.close()
    snap = read_snapshot(data)
    _verify("after SIGTERM", ledger, snap, settled=True)
    report.puts = sum(len(v) for v in ledger.put_acked.values())
    report.bumps = sum(len(v) for v in ledger.bump_acked.values())
    report.sends = len(ledger.send_acked)
    report.delivered = len(snap.delivered)
    report.dead = len(snap.dead)
    report.redelivered = sum(1 for rows in snap.delivered.values() if len(rows) > 1)
    report.unanswered = ledger.unanswered
    report.total_s = time.monotonic() - begun
    return report


@contextlib.contextmanager
def _data_dir(given: str | None) -> Iterator[Path]:
    if given is not None:
        yield Path(given)
        return
    tmp = Path(tempfile.mkdtemp(prefix="actorkeep-crash-"))
    yield tmp / "data"
    shutil.rmtree(tmp)  # kept (and named in the output) when the run fails


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=20, help="kill -9 cycles (default 20)")
    parser.add_argument("--seed", type=int, default=None, help="default: a random one")
    parser.add_argument("--data", default=None, help="new data directory (default: temporary)")
    parser.add_argument("--app", default=APP, help=f"MODULE:APP to serve (default {APP})")
    args = parser.parse_args()
    if args.cycles < 1:
        parser.error("--cycles must be at least 1")
    if args.data is not None and Path(args.data).exists() and any(Path(args.data).iterdir()):
        parser.error("--data must name an empty or missing directory: the checks know only "
                     "what this run wrote")  # fmt: skip
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    print(f"crash suite: seed {seed}, {args.cycles} cycles, app {args.app}", flush=True)
    with _data_dir(args.data) as data:
        print(f"data directory: {data}", flush=True)
        try:
            report = run(data, args.cycles, seed, args.app, lambda line: print(line, flush=True))
        except Inconsistent as exc:
            print(f"FAILED (seed {seed}, data kept in {data}): {exc}", flush=True)
            raise SystemExit(1) from None
    print(report.summary())


if __name__ == "__main__":
    main()
