"""An actor's durable writes as SQLite writes them: the frames of its write-ahead log
(decision 0016). ``LogReader`` reads the frames the log has committed since its last read;
``apply`` lays frames over an image of the database, which is how an actor is restored.

A frame is one page as a transaction left it: ``(page number, page bytes)``, the last frame of a
transaction also giving the database's size in pages. The log's committed end is ``mxFrame`` of
the ``-shm`` index (what SQLite itself trusts), and a frame belongs to the log's current
generation when it carries the header's salts. When SQLite starts the log afresh after a
complete checkpoint, the salts change: everything of the old generation is in the database file
by then, and the caller must have read it before the checkpoint (the host reads before every
checkpoint).

The formats are SQLite's documented ones: the log's (big-endian: a 32-byte header, then frames
of a 24-byte header and a page) and the wal-index header at the start of ``-shm`` (two equal
copies of 48 bytes, in the machine's byte order).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

WAL_HEADER_BYTES = 32
FRAME_HEADER_BYTES = 24
_WAL_MAGIC = (0x377F0682, 0x377F0683)
_INDEX_HEADER_BYTES = 48  # one copy of the wal-index header; -shm holds two, one after the other


class LogFormatError(Exception):
    """The log or its index is not what SQLite writes (or changed while being read)."""


@dataclass(frozen=True)
class Frames:
    """What a read found: the frames of the transactions committed since the last read, in log
    order, each ``(page number, database size in pages after it or 0, page bytes)``: a
    transaction's last frame gives the size. A page may come more than once: the last wins.
    ``restarted``: the log began a new generation since the last read (whatever the last read
    had not seen of the old one is only in the database file)."""

    page_size: int
    pages: list[tuple[int, int, bytes]]
    restarted: bool

    @property
    def db_pages(self) -> int:
        """The database's size in pages after the last transaction read (0: none read)."""
        return self.pages[-1][1] if self.pages else 0


class LogReader:
    """Reads one database's log as it grows; open it once the connection has run a statement
    (the log exists). ``index_header(n)`` reads the first ``n`` bytes of ``-shm``: pass the
    host's (``FileDatabase.wal_index_header``), which reads through a descriptor kept beside
    SQLite's. Without it the reader keeps a descriptor of ``-shm`` of its own, which must then
    outlive every connection to the database: closing a descriptor of a file drops all of the
    process's locks on it, SQLite's too. (SQLite locks nothing in ``-wal``: the reader's own
    descriptor of it may close at any time.)"""

    def __init__(
        self,
        db_path: str | os.PathLike[str],
        index_header: Callable[[int], bytes] | None = None,
    ) -> None:
        self._shm: int | None = None
        self._wal = os.open(f"{os.fspath(db_path)}-wal", os.O_RDONLY)
        if index_header is None:
            try:
                self._shm = shm = os.open(f"{os.fspath(db_path)}-shm", os.O_RDONLY)
            except BaseException:
                os.close(self._wal)
                raise
            index_header = partial(_pread_start, shm)
        self._index_header = index_header
        self._salts: bytes | None = None  # the generation read so far
        self._next = 0  # the next frame of that generation to read

    def close(self) -> None:
        os.close(self._wal)
        if self._shm is not None:
            os.close(self._shm)

    def committed_frames(self) -> int:
        """``mxFrame``: how many frames of the current generation are committed."""
        data = self._index_header(2 * _INDEX_HEADER_BYTES)
        if len(data) < 2 * _INDEX_HEADER_BYTES or data[:48] != data[48:96]:
            raise LogFormatError("the -shm index header is missing or torn")
        if data[12] != 1:  # isInit
            raise LogFormatError("the -shm index is not initialised")
        (max_frame,) = struct.unpack_from("=I", data, 16)
        return int(max_frame)

    def read(self) -> Frames:
        """The frames committed since the last read (all of the log's at the first)."""
        header = os.pread(self._wal, WAL_HEADER_BYTES, 0)
        if len(header) < WAL_HEADER_BYTES:
            return Frames(0, [], False)  # nothing written yet
        magic, _version, page_size = struct.unpack_from(">III", header, 0)
        if magic not in _WAL_MAGIC or page_size < 512 or page_size & (page_size - 1):
            raise LogFormatError(f"not a SQLite log (magic {magic:#x}, page size {page_size})")
        salts = header[16:24]
        restarted = self._salts is not None and salts != self._salts
        if salts != self._salts:
            self._salts, self._next = salts, 0
        end = self.committed_frames()
        if end < self._next:
            raise LogFormatError(f"the log went back from frame {self._next} to {end}")
        frame_bytes = FRAME_HEADER_BYTES + page_size
        start = WAL_HEADER_BYTES + self._next * frame_bytes
        data = os.pread(self._wal, (end - self._next) * frame_bytes, start)
        if len(data) != (end - self._next) * frame_bytes:
            raise LogFormatError("the log is shorter than its index says")
        pages: list[tuple[int, int, bytes]] = []
        for at in range(0, len(data), frame_bytes):
            page, commit = struct.unpack_from(">II", data, at)
            if data[at + 8 : at + 16] != salts:
                raise LogFormatError(f"frame {self._next + at // frame_bytes} is of another log")
            pages.append((page, commit, data[at + FRAME_HEADER_BYTES : at + frame_bytes]))
        if pages and not pages[-1][1]:
            raise LogFormatError("the last committed frame is not a commit frame")
        self._next = end
        return Frames(page_size, pages, restarted)


def _pread_start(fd: int, size: int) -> bytes:
    return os.pread(fd, size, 0)


def apply(image: bytes, frames: Frames) -> bytes:
    """``image`` (a database file's bytes) with ``frames`` laid over it: the database as the
    transactions they hold left it."""
    if not frames.pages:
        return image
    out = bytearray(image)
    lay(out, frames)
    return bytes(out)


def lay(out: bytearray, frames: Frames) -> None:
    """Lay ``frames`` over the database file ``out``, in place (``apply`` without the copies:
    a restore lays many batches over one image)."""
    size = frames.page_size
    for page, commit, data in frames.pages:
        at = (page - 1) * size
        if len(out) < at + size:
            out.extend(bytes(at + size - len(out)))
        out[at : at + size] = data
        if commit:
            del out[commit * size :]  # a transaction that shrank the file ends it here


def squash(frames: Frames) -> Frames:
    """The same transactions as one: each page once, its last version, in page order, the
    last frame giving the database's size after them. ``apply`` makes the same file of either.
    A batch in which the database shrank (a commit smaller than one before it) is returned as
    it is: a page cut off and grown back unwritten reads as zeros only in order."""
    if not frames.pages:
        return frames
    latest: dict[int, bytes] = {}
    size = 0
    for page, commit, data in frames.pages:
        latest[page] = data
        if commit:
            if commit < size:
                return frames
            size = commit
    pages = sorted((page, data) for page, data in latest.items() if page <= size)
    if not pages:
        return frames
    squashed = [(page, 0, data) for page, data in pages]
    last_page, last_data = pages[-1]
    squashed[-1] = (last_page, size, last_data)
    return Frames(frames.page_size, squashed, frames.restarted)


_BATCH = struct.Struct(">II")  # page size, frame count
_FRAME = struct.Struct(">II")  # page number, database size after it or 0


def encode(frames: Frames) -> bytes:
    """``frames`` as one value for the store: the page size and count, then each frame's page
    number and size mark, then its page."""
    parts = [_BATCH.pack(frames.page_size, len(frames.pages))]
    for page, commit, data in frames.pages:
        parts.append(_FRAME.pack(page, commit))
        parts.append(data)
    return b"".join(parts)


def decode(data: bytes) -> Frames:
    """The frames ``encode`` made (``LogFormatError`` if ``data`` is not such a value)."""
    if len(data) < _BATCH.size:
        raise LogFormatError("a frame batch too short for its header")
    page_size, count = _BATCH.unpack_from(data, 0)
    if len(data) != _BATCH.size + count * (_FRAME.size + page_size):
        raise LogFormatError(f"a batch of {count} frames of {page_size} bytes has {len(data)}")
    pages = []
    at = _BATCH.size
    for _ in range(count):
        page, commit = _FRAME.unpack_from(data, at)
        at += _FRAME.size
        pages.append((page, commit, data[at : at + page_size]))
        at += page_size
    return Frames(page_size, pages, False)
