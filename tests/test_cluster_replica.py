"""An actor's database shipped to a real PostgreSQL as log frames under its partition's epoch,
and restored from there on another host (actorkeep/cluster/replica.py)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from actorkeep.cluster import ClusterStore, Fenced, create, frames, partition_of, replica
from actorkeep.cluster.frames import Frames, LogFormatError, decode, encode
from actorkeep.cluster.replica import Replica, compact, held, restore

from .walutil import open_db, rows

ADDRESS = "counter/c1"
TTL, MARGIN = 0.6, 0.2


def put(conn: sqlite3.Connection, k: int, size: int = 100) -> None:
    conn.execute("INSERT OR REPLACE INTO kv VALUES (?, ?)", (k, bytes([k % 256]) * size))


def shipping(
    conninfo: str, tmp_path: Path
) -> tuple[ClusterStore, int, int, sqlite3.Connection, Replica]:
    """A cluster of 16 partitions, ``ADDRESS``'s leased by host "a", and its database shipped
    from a first image: the store, the partition, the epoch, the connection, the replica."""
    create(conninfo, 16)
    store = ClusterStore(conninfo, "a", clock=time.monotonic)
    part = partition_of(ADDRESS, 16)
    lease = store.acquire(part, 30.0, 1.0)
    assert lease is not None
    conn = open_db(tmp_path / "a.sqlite")
    replica = Replica(store, ADDRESS, part)
    replica.start(conn, tmp_path / "a.sqlite", lease.epoch)
    return store, part, lease.epoch, conn, replica


def test_an_actor_is_restored_from_what_was_shipped(pg_conninfo: str, tmp_path: Path) -> None:
    store, part, epoch, conn, replica = shipping(pg_conninfo, tmp_path)  # its first image
    assert restore(store, ADDRESS) == conn.serialize()
    for batch in range(5):
        for k in range(batch * 10, batch * 10 + 10):
            put(conn, k, 3000)
        write = replica.ship(epoch)
        assert write is not None and write.seq == batch + 1
        store.commit([write])
        if batch == 2:  # a checkpoint, with the frames shipped first as the host must
            assert replica.ship(epoch) is None
            replica.expect_restart()
            conn.execute("PRAGMA wal_checkpoint(RESTART)")
    assert restore(store, ADDRESS) == conn.serialize()
    assert compact(store, ADDRESS, part, epoch) == 5
    assert store.frames(ADDRESS) == []  # folded into the image
    assert restore(store, ADDRESS) == conn.serialize()
    put(conn, 999)
    write = replica.ship(epoch)
    assert write is not None and write.seq == 6  # numbering goes on past the compaction
    store.commit([write])
    assert restore(store, ADDRESS) == conn.serialize()
    replica.close()
    conn.close()


def test_a_restart_stays_expected_across_a_ship_that_saw_none(
    pg_conninfo: str, tmp_path: Path
) -> None:
    """A checkpoint ships, says the log may start afresh, and checkpoints; a sync of the gate
    may ship (nothing) before the write that starts the log afresh. The ship after that write
    must take the new log, not refuse it as frames never shipped (seen under 32 callers)."""
    store, _, epoch, conn, replica = shipping(pg_conninfo, tmp_path)
    put(conn, 1)
    write = replica.ship(epoch)
    assert write is not None
    store.commit([write])
    replica.expect_restart()
    conn.execute("PRAGMA wal_checkpoint(RESTART)")
    assert replica.ship(epoch) is None  # nothing new, and the log has not started afresh yet
    put(conn, 2)  # this write starts it afresh
    write = replica.ship(epoch)
    assert write is not None
    store.commit([write])
    assert restore(store, ADDRESS) == conn.serialize()
    put(conn, 3)
    conn.execute("PRAGMA wal_checkpoint(RESTART)")
    put(conn, 4)  # a restart nobody announced: frames of 3 may be lost to the log
    with pytest.raises(LogFormatError):
        replica.ship(epoch)
    replica.close()
    conn.close()


def test_a_new_owner_restores_and_the_old_one_is_fenced(pg_conninfo: str, tmp_path: Path) -> None:
    create(pg_conninfo, 16)
    a, b = (ClusterStore(pg_conninfo, h, clock=time.monotonic) for h in ("a", "b"))
    part = partition_of(ADDRESS, 16)
    old = a.acquire(part, TTL, MARGIN)
    assert old is not None
    conn = open_db(tmp_path / "a.sqlite")
    replica = Replica(a, ADDRESS, part)
    replica.start(conn, tmp_path / "a.sqlite", old.epoch)
    put(conn, 1)
    a.commit([w for w in [replica.ship(old.epoch)] if w])
    acknowledged = conn.serialize()
    time.sleep(TTL + 0.1)  # host a is cut off; b takes the partition over
    new = b.acquire(part, TTL, MARGIN)
    assert new is not None
    put(conn, 2)  # a, unaware, writes on...
    stale = replica.ship(old.epoch)
    assert stale is not None
    with pytest.raises(Fenced):
        a.commit([stale])  # ...and can never commit it
    image = restore(b, ADDRESS)
    assert image == acknowledged  # b has everything a committed, nothing it did not
    (tmp_path / "b.sqlite").write_bytes(image)
    moved = open_db(tmp_path / "b.sqlite")
    assert rows(moved) == [(1, b"\x01" * 100)]
    put(moved, 3)
    replica_b = Replica(b, ADDRESS, part)
    replica_b.start(moved, tmp_path / "b.sqlite", new.epoch)
    put(moved, 4)
    write = replica_b.ship(new.epoch)
    assert write is not None and write.seq == 2  # after a's one committed batch
    b.commit([write])
    assert restore(b, ADDRESS) == moved.serialize()
    for r, c in ((replica, conn), (replica_b, moved)):
        r.close()
        c.close()


def test_many_actors_commit_in_one_transaction(pg_conninfo: str, tmp_path: Path) -> None:
    create(pg_conninfo, 4)
    store = ClusterStore(pg_conninfo, "a", clock=time.monotonic)
    leases = {p: store.acquire(p, 30.0, 1.0) for p in range(4)}
    actors = []
    for i in range(6):
        address = f"counter/c{i}"
        part = partition_of(address, 4)
        lease = leases[part]
        assert lease is not None
        conn = open_db(tmp_path / f"{i}.sqlite")
        replica = Replica(store, address, part)
        replica.start(conn, tmp_path / f"{i}.sqlite", lease.epoch)
        put(conn, i)
        actors.append((address, lease.epoch, conn, replica))
    writes = [w for _, epoch, _, r in actors if (w := r.ship(epoch))]
    assert len(writes) == 6
    store.commit(writes)  # one transaction: the group commit of six actors
    for address, _, conn, replica in actors:
        assert restore(store, address) == conn.serialize()
        replica.close()
        conn.close()


def test_a_log_that_started_afresh_unshipped_is_refused(pg_conninfo: str, tmp_path: Path) -> None:
    """A checkpoint the replica was not told of (frames may have gone into the file unread)
    fails the next ship: the actor must be restored, not go on with a hole in its batches."""
    _, _, epoch, conn, replica = shipping(pg_conninfo, tmp_path)
    put(conn, 1)
    conn.execute("PRAGMA wal_checkpoint(RESTART)")
    put(conn, 2)
    with pytest.raises(LogFormatError, match="started afresh"):
        replica.ship(epoch)
    replica.close()
    conn.close()


def test_a_damaged_batch_is_refused() -> None:
    with pytest.raises(LogFormatError):
        decode(b"\x00\x00\x10\x00\x00\x00\x00\x02short")


class _Loads:
    """A store's ``load`` that answers with what it was given."""

    def __init__(self, seq: int, image: bytes, batches: list[tuple[int, bytes]]) -> None:
        self.answer = (seq, image, batches)

    def load(self, address: str) -> tuple[int, bytes, list[tuple[int, bytes]]]:
        return self.answer


def test_a_restore_copies_the_image_once_whatever_its_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A restore lays every batch over one copy of the image: it used to copy the image twice
    a batch, so a large actor with its 64 batches not yet folded took 128 copies of itself."""
    size = 4096
    image = b"".join(bytes([n]) * size for n in range(1, 4))  # three pages
    batches = [
        (seq, encode(Frames(size, [(2, 3, bytes([100 + seq]) * size)], False)))
        for seq in range(6, 56)
    ]
    copies = 0

    class Counted(bytearray):
        def __init__(self, *args: Any) -> None:
            nonlocal copies
            copies += 1
            super().__init__(*args)

    monkeypatch.setattr(replica, "bytearray", Counted, raising=False)
    monkeypatch.setattr(frames, "bytearray", Counted, raising=False)
    found = held(_Loads(5, image, batches), "c/x")
    assert found.image == image[:size] + bytes([155]) * size + image[2 * size :]
    assert (found.last, found.batches, found.known) == (55, 50, True)
    assert copies == 1
