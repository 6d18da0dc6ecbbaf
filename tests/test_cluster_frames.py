"""Reading an actor's committed log frames and restoring its database from them
(actorkeep/cluster/frames.py), against real SQLite files."""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actorkeep.cluster.frames import Frames, LogFormatError, LogReader, apply, squash

from .walutil import open_db, rows


def restore(base: bytes, shipped: list[Frames]) -> bytes:
    """The database file that ``base`` and the frames ``shipped`` make."""
    image = base
    for frames in shipped:
        image = apply(image, frames)
    return image


def opened(image: bytes) -> list[tuple[int, bytes]]:
    """The rows of ``image`` written to a file and opened afresh (checked whole first)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "restored.sqlite"
        path.write_bytes(image)
        conn = sqlite3.connect(path)
        try:
            assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            return rows(conn)
        finally:
            conn.close()


class Shipped:
    """A database as the host runs it, the image it started from, and every read of its log
    since (the first one at once: the image already holds what it finds)."""

    def __init__(self, path: Path) -> None:
        self.conn = open_db(path)
        self.base = self.conn.serialize()
        self.reader = LogReader(path)
        self.reads = [self.reader.read()]

    def read(self) -> Frames:
        frames = self.reader.read()
        self.reads.append(frames)
        return frames

    def restore(self) -> bytes:
        return restore(self.base, self.reads)

    def close(self) -> None:
        self.reader.close()
        self.conn.close()


def checkpoint(conn: sqlite3.Connection) -> None:
    """A complete checkpoint; the next write starts the log afresh."""
    assert conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()[0] == 0


def test_frames_since_the_last_read_restore_the_database(tmp_path: Path) -> None:
    db = Shipped(tmp_path / "a.sqlite")
    for i in range(50):
        db.conn.execute("INSERT INTO kv VALUES (?, ?)", (i, bytes([i]) * 3000))  # overflow pages
    frames = db.read()
    assert frames.pages and frames.page_size == 4096
    assert db.read().pages == []  # nothing new
    db.conn.execute("DELETE FROM kv WHERE k % 2 = 0")
    db.conn.execute("UPDATE kv SET v = x'00' WHERE k = 1")
    db.read()
    image = db.restore()
    assert image == db.conn.serialize()  # byte for byte what SQLite itself reads
    assert opened(image) == rows(db.conn)
    db.close()


def test_a_new_generation_of_the_log_is_seen(tmp_path: Path) -> None:
    db = Shipped(tmp_path / "a.sqlite")
    db.conn.execute("INSERT INTO kv VALUES (1, x'01')")
    db.read()  # before the checkpoint, as the host does
    checkpoint(db.conn)
    db.conn.execute("INSERT INTO kv VALUES (2, x'02')")  # starts the log afresh
    again = db.read()
    assert again.restarted and again.pages
    image = db.restore()
    assert image == db.conn.serialize()
    assert opened(image) == [(1, b"\x01"), (2, b"\x02")]
    db.close()


def test_a_checkpoint_before_the_read_loses_what_was_not_read(tmp_path: Path) -> None:
    """Why the host reads before every checkpoint: the frames of the old generation are then
    only in the database file, and a restore from the frames alone misses them."""
    db = Shipped(tmp_path / "a.sqlite")
    db.conn.execute("INSERT INTO kv VALUES (1, ?)", (b"1" * 20_000,))  # overflow pages
    checkpoint(db.conn)  # not read first
    db.conn.execute("INSERT INTO kv VALUES (2, x'02')")  # rewrites the leaf, not the overflow
    assert db.read().restarted
    assert db.restore() != db.conn.serialize()
    db.close()


def test_a_transaction_that_shrinks_the_file_is_restored_to_its_size(tmp_path: Path) -> None:
    db = Shipped(tmp_path / "a.sqlite")
    db.conn.executemany("INSERT INTO kv VALUES (?, ?)", [(i, b"x" * 4000) for i in range(40)])
    db.read()
    grown = db.restore()
    db.conn.execute("DELETE FROM kv WHERE k > 0")
    db.conn.execute("VACUUM")
    db.read()
    image = db.restore()
    assert len(image) < len(grown)  # the file shrank...
    assert image == db.conn.serialize()  # ...and the restored one with it
    db.close()


def test_what_is_not_a_log_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "a.sqlite"
    conn = open_db(path)
    reader = LogReader(path)
    Path(f"{path}-wal").write_bytes(b"not a log" * 10)
    with pytest.raises(LogFormatError):
        reader.read()
    reader.close()
    conn.close()


ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(0, 40), st.integers(0, 6000)),
        st.tuples(st.just("delete"), st.integers(0, 40), st.just(0)),
        st.tuples(st.just("batch"), st.integers(0, 40), st.integers(1, 30)),
        st.tuples(st.just("read"), st.just(0), st.just(0)),
        st.tuples(st.just("checkpoint"), st.just(0), st.just(0)),
        st.tuples(st.just("vacuum"), st.just(0), st.just(0)),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(ops)
def test_any_history_restores_exactly(
    tmp_path_factory: pytest.TempPathFactory, history: list[tuple[str, int, int]]
) -> None:
    db = Shipped(tmp_path_factory.mktemp("frames") / "a.sqlite")
    conn = db.conn
    for op, k, n in history:
        if op == "put":
            conn.execute("INSERT OR REPLACE INTO kv VALUES (?, ?)", (k, bytes([k % 256]) * n))
        elif op == "delete":
            conn.execute("DELETE FROM kv WHERE k = ?", (k,))
        elif op == "batch":
            with conn:
                conn.execute("BEGIN")
                for j in range(n):
                    conn.execute("INSERT OR REPLACE INTO kv VALUES (?, ?)", (k + j, b"b" * 100))
        elif op == "read":
            db.read()
        elif op == "checkpoint":
            db.read()
            checkpoint(conn)
        else:
            conn.execute("VACUUM")  # rewrites every page, and may shrink the file
    db.read()
    assert db.restore() == conn.serialize()
    # Each read as one transaction (what the host ships) makes the same file.
    assert restore(db.base, [squash(frames) for frames in db.reads]) == conn.serialize()
    db.close()


def test_a_squashed_batch_holds_each_page_once(tmp_path: Path) -> None:
    db = Shipped(tmp_path / "a.sqlite")
    for i in range(50):  # 50 transactions writing the same few pages
        db.conn.execute("INSERT OR REPLACE INTO kv VALUES (?, ?)", (i % 3, b"x" * 100))
    frames = db.read()
    squashed = squash(frames)
    assert len(frames.pages) >= 50 and len(squashed.pages) <= 4
    assert [p for p, _, _ in squashed.pages] == sorted({p for p, _, _ in frames.pages})
    assert squashed.pages[-1][1] == frames.pages[-1][1]
    assert not any(commit for _, commit, _ in squashed.pages[:-1])
    assert db.restore() == restore(db.base, [squash(f) for f in db.reads]) == db.conn.serialize()
    a, b, c = (bytes([x]) * 512 for x in b"abc")
    shrinking = Frames(512, [(1, 0, a), (3, 3, b), (2, 0, c), (1, 2, a)], False)
    assert squash(shrinking) is shrinking  # a page cut off and grown back: kept in order
    growing = Frames(512, [(1, 0, a), (2, 2, b), (3, 0, c), (1, 3, b)], False)
    assert squash(growing).pages == [(1, 0, b), (2, 0, b), (3, 3, c)]
    assert apply(b"", squash(growing)) == apply(b"", growing) == b + b + c
    db.close()
