"""The cluster's store on a real PostgreSQL (tests/pg.py): partitions, leases decided by
PostgreSQL's clock, epochs that grow at every takeover, and commits fenced by them."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from actorkeep.cluster import (
    ClusterMismatch,
    ClusterStore,
    Fenced,
    Write,
    create,
    partition_of,
)
from actorkeep.cluster.store import COMMIT_FRAMES, COMMIT_ONE

TTL, MARGIN = 0.6, 0.2


def store(conninfo: str, host: str, clock: float | None = None) -> ClusterStore:
    return ClusterStore(conninfo, host, clock=time.monotonic if clock is None else lambda: clock)


def test_partition_of_is_stable_and_in_range() -> None:
    assert partition_of("kv/shard-3", 1024) == partition_of("kv/shard-3", 1024)
    seen = {partition_of(f"counter/c{i}", 16) for i in range(1000)}
    assert seen == set(range(16))  # every partition gets actors
    with pytest.raises(ValueError):
        partition_of("no-slash", 16)


def test_create_is_idempotent_and_the_partition_count_fixed(pg_conninfo: str) -> None:
    create(pg_conninfo, 8)
    create(pg_conninfo, 8)
    with pytest.raises(ClusterMismatch, match="8 partitions, not 16"):
        create(pg_conninfo, 16)
    with pytest.raises(ValueError):
        create(pg_conninfo, 0)
    s = store(pg_conninfo, "a")
    assert s.partitions == 8
    assert [s.lease_of(p) for p in range(8)] == [(None, 0)] * 8
    s.close()


def test_a_store_needs_a_created_cluster(pg_conninfo: str) -> None:
    with pytest.raises(ClusterMismatch, match="no cluster"):
        store(pg_conninfo, "a")


def test_one_owner_until_the_lease_expires_by_postgres_clock(pg_conninfo: str) -> None:
    create(pg_conninfo, 4)
    # The hosts' own clocks stand still: only PostgreSQL's clock decides expiry.
    a, b = store(pg_conninfo, "a", clock=100.0), store(pg_conninfo, "b", clock=5.0)
    lease = a.acquire(0, TTL, MARGIN)
    assert lease is not None and lease.epoch == 1
    assert lease.until == pytest.approx(100.0 + TTL - MARGIN)  # from before the request
    assert b.acquire(0, TTL, MARGIN) is None
    assert a.acquire(0, TTL, MARGIN) is None  # not even its owner takes it twice
    time.sleep(TTL + 0.1)
    taken = b.acquire(0, TTL, MARGIN)
    assert taken is not None and taken.epoch == 2
    assert a.renew([lease], TTL, MARGIN) == []  # lost: a must stop serving partition 0
    assert [x.epoch for x in b.renew([taken], TTL, MARGIN)] == [2]
    assert b.lease_of(0) == ("b", 2)
    a.close()
    b.close()


def test_a_fenced_owner_commits_nothing(pg_conninfo: str) -> None:
    create(pg_conninfo, 4)
    a, b = store(pg_conninfo, "a"), store(pg_conninfo, "b")
    p = partition_of("counter/x", 4)
    old = a.acquire(p, TTL, MARGIN)
    assert old is not None
    a.commit([Write(p, old.epoch, "counter/x", 1, b"one")])
    time.sleep(TTL + 0.1)  # a is paused past its lease...
    new = b.acquire(p, TTL, MARGIN)
    assert new is not None and new.epoch == old.epoch + 1
    with pytest.raises(Fenced) as fenced:  # ...and wakes up to write: refused
        a.commit([Write(p, old.epoch, "counter/x", 2, b"stale")])
    assert fenced.value.partitions == [p]
    b.commit([Write(p, new.epoch, "counter/x", 2, b"two")])
    assert b.frames("counter/x") == [(1, b"one"), (2, b"two")]
    assert b.frames("counter/x", after=1) == [(2, b"two")]
    a.close()
    b.close()


def test_a_commit_is_all_or_nothing_across_partitions(pg_conninfo: str) -> None:
    create(pg_conninfo, 2)
    a, b = store(pg_conninfo, "a"), store(pg_conninfo, "b")
    l0, l1 = a.acquire(0, TTL, MARGIN), a.acquire(1, TTL, MARGIN)
    assert l0 is not None and l1 is not None
    time.sleep(TTL + 0.1)
    assert a.renew([l0], TTL, MARGIN) == []  # expired; a renews nothing that lapsed
    assert b.acquire(1, TTL, MARGIN) is not None  # only partition 1 changes hands
    writes = [Write(0, l0.epoch, "c/zero", 1, b"0"), Write(1, l1.epoch, "c/one", 1, b"1")]
    with pytest.raises(Fenced) as fenced:
        a.commit(writes)
    assert fenced.value.partitions == [1]
    assert a.frames("c/zero") == [] and a.frames("c/one") == []
    with pytest.raises(ValueError, match="two epochs"):
        a.commit([Write(0, 1, "c/zero", 1, b""), Write(0, 2, "c/zero", 2, b"")])
    a.close()
    b.close()


def test_release_hands_a_partition_over_at_once(pg_conninfo: str) -> None:
    create(pg_conninfo, 2)
    a, b = store(pg_conninfo, "a"), store(pg_conninfo, "b")
    lease = a.acquire(1, 30.0, 1.0)
    assert lease is not None and b.acquire(1, 30.0, 1.0) is None
    a.release([lease])
    taken = b.acquire(1, 30.0, 1.0)
    assert taken is not None and taken.epoch == lease.epoch + 1
    with pytest.raises(Fenced):
        a.commit([Write(1, lease.epoch, "c/x", 1, b"late")])
    a.close()
    b.close()


def test_bad_lease_arguments_are_refused(pg_conninfo: str) -> None:
    create(pg_conninfo, 2)
    a = store(pg_conninfo, "a")
    for ttl, margin in ((0.5, 0.5), (1.0, 0.0), (0.0, -1.0), (4000.0, 1.0)):
        with pytest.raises(ValueError):
            a.acquire(0, ttl, margin)
    assert a.lease_of(0) == (None, 0)  # nothing taken
    with pytest.raises(ValueError):
        ClusterStore(pg_conninfo, "", clock=time.monotonic)
    a.close()


@pytest.mark.parametrize("statement", ["COMMIT_FRAMES", "COMMIT_ONE"])
def test_a_takeover_waits_for_a_commit_in_flight(pg_conninfo: str, statement: str) -> None:
    """The check of a commit holds a share lock on the lease row to its end, so a takeover's
    epoch bump is ordered after the commit: the new owner sees every frame the old one made.
    The commit's very statement runs here in a transaction held open, as if the commit were
    still in flight. (Without ``FOR SHARE`` in it the takeover goes ahead at once.)"""
    create(pg_conninfo, 1)
    a, b = store(pg_conninfo, "a"), store(pg_conninfo, "b")
    lease = a.acquire(0, TTL, MARGIN)
    assert lease is not None
    time.sleep(TTL + 0.1)
    took: list[object] = []
    with psycopg.connect(pg_conninfo) as raw:
        if statement == "COMMIT_FRAMES":
            params: dict[str, object] = {
                "parts": [0], "epochs": [lease.epoch], "n": 1,
                "addresses": ["c/x"], "seqs": [1], "partitions": [0],
                "frame_epochs": [lease.epoch], "data": [b"in flight"],
                "put_addresses": [], "put_partitions": [], "put_at": [], "dropped": [],
            }  # fmt: skip
            query = COMMIT_FRAMES
        else:
            params = {"partition": 0, "epoch": lease.epoch, "address": "c/x", "seq": 1}
            params["data"] = b"in flight"
            query = COMMIT_ONE
        assert raw.execute(query, params).fetchone() == ([0],)
        thread = threading.Thread(target=lambda: took.append(b.acquire(0, TTL, MARGIN)))
        thread.start()
        thread.join(0.5)
        assert thread.is_alive() and not took  # the takeover waits for the commit...
        raw.commit()
    thread.join(10)
    assert took and took[0] is not None  # ...then goes ahead, and sees what it committed
    assert b.frames("c/x") == [(1, b"in flight")]
    a.close()
    b.close()
