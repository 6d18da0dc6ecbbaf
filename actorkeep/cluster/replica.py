"""One actor's database as the cluster keeps it (decision 0016): an image in the store, then
each batch of frames its log commits, shipped under its partition's epoch; and the restore that
puts them back together on whichever host owns the actor next."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from .frames import LogFormatError, LogReader, decode, encode, lay, squash
from .records import Store, Write


class Replica:
    """The shipping side for one open database. ``start`` once its connection has run a
    statement (its log exists); ``ship`` before every sync point and every checkpoint."""

    def __init__(self, store: Store, address: str, partition: int) -> None:
        self._store = store
        self.address = address
        self.partition = partition
        self._reader: LogReader | None = None
        self._seq = 0  # the last batch shipped
        self._restart_expected = False

    def start(self, conn: sqlite3.Connection, path: str | os.PathLike[str], epoch: int) -> None:
        """Begin shipping ``conn``'s database. An actor the store knows nothing of gets its
        image now (what the file holds, log included); one restored from the store goes on
        from its last batch."""
        found = held(self._store, self.address)
        self.resume(path, found.last)
        if not found.known:
            self._store.compact(self.partition, epoch, self.address, 0, conn.serialize())

    def resume(
        self,
        path: str | os.PathLike[str],
        seq: int,
        index_header: Callable[[int], bytes] | None = None,
    ) -> None:
        """Begin shipping a database whose file holds what the store holds up to batch
        ``seq`` (restored from it, or about to send its first image). ``index_header``: see
        ``LogReader``."""
        self._seq = seq
        reader = LogReader(path, index_header)
        try:
            reader.read()  # what the file already holds
        except BaseException:
            reader.close()
            raise
        self._reader = reader

    @property
    def seq(self) -> int:
        """The last batch shipped (or restored from)."""
        return self._seq

    def expect_restart(self) -> None:
        """The log may start afresh from now on, once: everything before was shipped (the
        host checkpoints only after a ship)."""
        self._restart_expected = True

    def ship(self, epoch: int) -> Write | None:
        """The frames committed since the last ship, as a write for ``ClusterStore.commit``
        (which may take many actors' at once); None if there are none. A write that is not
        committed (``Fenced``, or an error) must not be shipped again: the actor's owner has
        changed or its state is unknown, and the host drops the actor."""
        assert self._reader is not None, "start() first"
        frames = self._reader.read()
        if frames.restarted:
            # Expected until it is seen: a sync may ship (nothing) between the checkpoint's
            # own ship and the write after it that starts the log afresh.
            if not self._restart_expected:
                raise LogFormatError(
                    f"{self.address}: its log started afresh with frames never shipped"
                )
            self._restart_expected = False
        if not frames.pages:
            return None
        self._seq += 1
        return Write(self.partition, epoch, self.address, self._seq, encode(squash(frames)))

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None


@dataclass(frozen=True)
class Held:
    """What the cluster holds of an actor, put together: ``image``, its database file (the
    stored image with every batch after it laid over; empty if none); ``last``, the last batch
    in it; ``batches``, how many were laid over the stored image; ``known``, whether the
    cluster holds anything of it."""

    image: bytes
    last: int
    batches: int
    known: bool


class Loads(Protocol):
    """What a restore reads (``Store.load``)."""

    def load(self, address: str) -> tuple[int, bytes, list[tuple[int, bytes]]]: ...


def held(store: Loads, address: str) -> Held:
    """What the cluster holds of the actor at ``address`` (one snapshot of the store)."""
    seq, image, batches = store.load(address)
    known = bool(image or batches)
    if not batches:
        return Held(image, seq, 0, known)
    out = bytearray(image)  # one copy for all the batches, not two each
    del image
    for expected, (got, data) in enumerate(batches, start=seq + 1):
        if got != expected:  # never laid over what it was written on top of
            raise LogFormatError(f"{address}: batch {expected} is missing (next is {got})")
        lay(out, decode(data))
    return Held(bytes(out), batches[-1][0], len(batches), known)


def restore(store: Store, address: str) -> bytes:
    """The actor's database file as the cluster holds it (empty if it holds nothing)."""
    return held(store, address).image


def compact(store: Store, address: str, partition: int, epoch: int) -> int:
    """Fold the actor's batches into its image (so that a restore reads one value); how many
    batches were folded. Fenced like a commit."""
    found = held(store, address)
    if found.batches:
        store.compact(partition, epoch, address, found.last, found.image)
    return found.batches
