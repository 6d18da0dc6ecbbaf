"""Group commit to the cluster's store (decision 0016): the writes of every actor that asks while
a commit is in flight go together in the next one, one PostgreSQL transaction for all.

A write whose partition has a newer owner fails alone: the batch is committed again without the
fenced partitions' writes, so one stale actor never fails the others.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any

import outcome
import trio

from ..errors import HostClosed
from .store import ClusterStore, Fenced, Write

#: ``run(fn)``: ``fn()`` in a thread, awaited (the store blocks): the host's sync threads.
RunInThread = Callable[[Callable[[], Any]], Awaitable[Any]]
#: ``spawn(fn)``: start the task ``fn()`` (the host's nursery).
Spawn = Callable[[Callable[[], Awaitable[None]]], None]


class Committer:
    """Commits writes for many actors, one transaction per batch, one batch at a time."""

    def __init__(self, store: ClusterStore, run: RunInThread, spawn: Spawn) -> None:
        self._store = store
        self._run = run
        self._spawn = spawn
        self._pending: list[tuple[Write, trio.Event, list[outcome.Outcome[None]]]] = []
        self._busy = False
        #: Transactions committed, and writes in them (for measurements).
        self.transactions = 0
        self.writes = 0

    async def commit(self, write: Write) -> None:
        """Until ``write`` is committed (``Fenced`` if its partition has a newer owner; the
        store's error if the commit failed, when its outcome is unknown)."""
        done = trio.Event()
        box: list[outcome.Outcome[None]] = []
        self._pending.append((write, done, box))
        if not self._busy:
            self._busy = True
            self._spawn(self._drain)
        await done.wait()
        box[0].unwrap()

    async def _drain(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                writes = [w for w, _, _ in batch]
                try:
                    results = await self._run(partial(self._commit, writes))
                except BaseException as exc:  # cancelled (the host closes), or no thread
                    for _, done, box in batch:  # an outcome is unwrapped once: one each
                        box.append(outcome.Error(_as_error(exc)))
                        done.set()
                    raise
                for (_, done, box), result in zip(batch, results, strict=True):
                    box.append(result)
                    done.set()
        finally:
            self._busy = False

    def _commit(self, writes: Sequence[Write]) -> list[outcome.Outcome[None]]:
        """In a thread: commit ``writes``, dropping fenced partitions and committing the rest
        again; the outcome of each write."""
        fenced: set[int] = set()
        while True:
            live = [w for w in writes if w.partition not in fenced]
            try:
                if live:
                    self._store.commit(live)
            except Fenced as exc:
                fenced.update(exc.partitions)
                continue
            except Exception as exc:  # the outcome is unknown: every write of the batch fails
                return [outcome.Error(exc) for _ in writes]
            if live:
                self.transactions += 1
                self.writes += len(live)
            return [
                outcome.Error(Fenced([w.partition]))
                if w.partition in fenced
                else outcome.Value(None)
                for w in writes
            ]


def _as_error(exc: BaseException) -> Exception:
    return exc if isinstance(exc, Exception) else HostClosed("the host closed during a commit")
