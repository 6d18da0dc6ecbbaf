"""The alarm index of a cluster host (decision 0017): the runtime's ``AlarmIndex`` seam, kept
in PostgreSQL by partition and mirrored in memory for the scheduler's scans.

A change (``put``, ``remove``) applies to the mirror at once and waits in ``pending``; the next
group commit takes every pending change with it, in the same statement as the frames it
carries (``ClusterStore.commit``). The runtime's invariant (runtime/alarms.py: an entry durable
no later than the alarm row it guards) therefore holds with ``sync`` doing nothing: an actor's
alarm row reaches PostgreSQL only in its frames, which go in a commit that takes, at the latest,
the entry put before the row was written. A change whose commit failed with its outcome unknown
waits again; one for a partition fenced meanwhile is dropped (the new owner has its own).

When the host takes a partition, it loads the partition's entries (``load``; the scheduler is
poked so that due alarms fire at once); when it loses one, they leave the mirror (``drop``).
Scans see only partitions the host holds by its own clock.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Callable, Iterable

from .keeper import LeaseKeeper
from .partitions import partition_of
from .records import AlarmChange


class ClusterAlarmIndex:
    """``address -> at`` for the actors of the partitions this host holds."""

    def __init__(self, keeper: LeaseKeeper, partitions: int) -> None:
        self._keeper = keeper
        self._partitions = partitions
        self._db = sqlite3.connect(":memory:", isolation_level=None)
        self._db.execute(
            "CREATE TABLE alarms (address TEXT PRIMARY KEY, partition INTEGER NOT NULL, "
            "at REAL NOT NULL)"
        )
        self._db.execute("CREATE INDEX alarms_due ON alarms (at, address)")
        self._db.execute("CREATE INDEX alarms_partition ON alarms (partition)")
        self.pending: dict[str, AlarmChange] = {}
        #: The epoch under which each partition's entries were loaded.
        self.loaded: dict[int, int] = {}
        self._poke: Callable[[float], None] = lambda at: None
        self._retry: Callable[[], None] = lambda: None
        # partition: the addresses changed here while its entries were being read (``load``)
        self._loading: dict[int, set[str]] = {}
        # Partitions whose due entries a scan passed over (the lease lapsed by this host's
        # clock, or the partition being handed over): the scheduler is woken for them if a
        # tick gives them back (``ticked``).
        self._skipped: set[int] = set()

    # -- the runtime's seam ---------------------------------------------------------------
    def put(self, address: str, at: float) -> None:
        self._change(address, at)

    def remove(self, address: str) -> None:
        self._change(address, None)

    def _change(self, address: str, at: float | None) -> None:
        partition = partition_of(address, self._partitions)
        # Held at the last tick, even if it lapsed by this host's clock since: a commit then
        # waits for the renewal (ClusterStorage.until_renewed), and the change must go with it.
        lease = self._keeper.last(partition)
        if lease is None:
            return  # not this host's to change: the owner keeps the entry
        if at is None:
            self._db.execute("DELETE FROM alarms WHERE address = ?", (address,))
        else:
            self._db.execute(
                "INSERT INTO alarms VALUES (?, ?, ?) ON CONFLICT(address) DO UPDATE SET "
                "at = excluded.at",
                (address, partition, at),
            )
        self.pending[address] = AlarmChange(partition, lease.epoch, address, at)
        touched = self._loading.get(partition)
        if touched is not None:
            touched.add(address)

    def get(self, address: str) -> float | None:
        row = self._db.execute("SELECT at FROM alarms WHERE address = ?", (address,)).fetchone()
        return None if row is None else float(row[0])

    def due(
        self, now: float, after: tuple[float, str] | None, limit: int
    ) -> list[tuple[str, float]]:
        """Due entries of the partitions held by this host's clock and not being handed over
        (a partition whose lease ran out waits for the next tick to drop it, or renew it)."""
        found: list[tuple[str, float]] = []
        accepts = self._keeper.accepts
        while True:
            if after is None:
                rows = self._db.execute(
                    "SELECT address, at, partition FROM alarms WHERE at <= ? "
                    "ORDER BY at, address LIMIT ?",
                    (now, limit),
                ).fetchall()
            else:
                rows = self._db.execute(
                    "SELECT address, at, partition FROM alarms WHERE at <= ? AND "
                    "(at, address) > (?, ?) ORDER BY at, address LIMIT ?",
                    (now, after[0], after[1], limit),
                ).fetchall()
            for address, at, partition in rows:
                if accepts(partition) is None:
                    self._skipped.add(partition)
                    continue
                found.append((address, at))
                if len(found) == limit:
                    return found
            if len(rows) < limit:
                return found
            after = (rows[-1][1], rows[-1][0])

    def next_after(self, now: float) -> tuple[float, str] | None:
        row = self._db.execute(
            "SELECT at, address FROM alarms WHERE at > ? ORDER BY at, address LIMIT 1", (now,)
        ).fetchone()
        return None if row is None else (float(row[0]), str(row[1]))

    async def sync(self) -> None:
        """Nothing to wait for: pending entries go with the next commit (see above)."""

    def watch(self, poke: Callable[[float], None], retry: Callable[[], None]) -> None:
        self._poke = poke
        self._retry = retry

    # -- what the cluster storage calls ---------------------------------------------------
    def answered(self) -> None:
        """The store answered again after failing: alarm events that failed on it meanwhile
        are tried now."""
        self._retry()

    def take(self) -> list[AlarmChange]:
        """The pending changes, for a commit."""
        changes = list(self.pending.values())
        self.pending.clear()
        return changes

    def failed(self, changes: Iterable[AlarmChange], fenced: set[int]) -> None:
        """A commit that took ``changes`` failed with its outcome unknown: those of partitions
        not fenced, and not changed again since, wait for the next one. (Not only those held
        by this host's clock: a write under the same epoch may still commit, and its alarm
        row with it; a change whose epoch moved on is fenced at its next commit.)"""
        for change in changes:
            if change.partition in fenced or change.address in self.pending:
                continue
            self.pending[change.address] = change

    def loading(self, partitions: Iterable[int]) -> None:
        """``load`` of these partitions is coming: remember what changes here meanwhile."""
        for partition in partitions:
            self._loading[partition] = set()

    def load(self, partition: int, epoch: int, entries: Iterable[tuple[str, float]]) -> None:
        """The entries PostgreSQL held for a partition just taken (at ``epoch``), read since
        ``loading``: what changed here since then wins over what was read."""
        touched = self._loading.pop(partition, set())
        touched |= {
            a for a, c in self.pending.items() if c.partition == partition and c.epoch == epoch
        }  # (a change under an older epoch is fenced at its commit: the store's entry stands)
        for (address,) in self._db.execute(
            "SELECT address FROM alarms WHERE partition = ?", (partition,)
        ).fetchall():
            if address not in touched:
                self._db.execute("DELETE FROM alarms WHERE address = ?", (address,))
        earliest = math.inf
        for address, at in entries:
            if address in touched:
                continue
            self._db.execute("INSERT INTO alarms VALUES (?, ?, ?)", (address, partition, at))
            earliest = min(earliest, at)
        self.loaded[partition] = epoch
        if earliest < math.inf:
            self._poke(earliest)

    def ticked(self) -> None:
        """After a tick: wake the scheduler for the due entries of partitions a scan passed
        over that this host serves again (its renewal came late, or a hand-over was called
        off); forget those it no longer holds."""
        keeper = self._keeper
        back = {p for p in self._skipped if keeper.accepts(p) is not None}
        self._skipped = {p for p in self._skipped - back if keeper.last(p) is not None}
        if not back:
            return
        marks = ",".join("?" * len(back))
        (earliest,) = self._db.execute(
            f"SELECT min(at) FROM alarms WHERE partition IN ({marks})", sorted(back)
        ).fetchone()
        if earliest is not None:
            self._poke(float(earliest))

    def drop(self, partition: int) -> None:
        """A partition this host no longer holds: its entries leave the mirror. Its pending
        changes stay: a write of this host under that epoch may still commit, and they with
        it, or be fenced with it."""
        self._db.execute("DELETE FROM alarms WHERE partition = ?", (partition,))
        self.loaded.pop(partition, None)
        self._loading.pop(partition, None)
