"""The sync worker: long-lived threads that run fsyncs, checkpoints and closes of databases,
so that the event loop never waits on the disk (decision 0015), and, where Linux allows it, an
io_uring that runs the fdatasyncs of write-ahead logs without any thread (decision 0026).

A job goes to the threads through one queue and its outcome comes back with
``TrioToken.run_sync_soon``: one hand-off each way, no thread started per job and no
capacity limiter (``trio.to_thread.run_sync`` costs about twice as much per call). Several
threads, so that the fsyncs of different actors overlap.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import outcome
import structlog
import trio
from trio.lowlevel import Abort, Task, TrioToken, current_task, reschedule, wait_task_rescheduled

from .ring import Done as RingDone
from .ring import FsyncRing
from .stats import Histogram

log = structlog.get_logger("actorkeep")

#: Sync threads per host: fsyncs of different files overlap up to this many at once.
SYNC_THREADS = 4

T = TypeVar("T")

#: Called on the trio thread once a sync ended: with None, or with its error.
Done = Callable[[BaseException | None], None]

#: ``(fn, then, what)``: ``then`` is the task waiting for ``fn``'s outcome, or a function to
#: call on the trio thread with ``fn``'s error or None once it has run (``_Then``), or None.
_Job = tuple[Callable[[], Any], "Task | _Then | None", str]


def _cannot_abort(_: Any) -> Abort:
    return Abort.FAILED  # a job that has started cannot be taken back: wait for its end


class Syncer:
    """Threads that run blocking storage jobs for the trio thread. Started by the first job
    (inside ``trio.run``); ``close()`` finishes every job given so far, then ends them."""

    def __init__(self, threads: int = SYNC_THREADS, ring: bool = True) -> None:
        self._size = threads
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._token: TrioToken | None = None
        #: How long each thread's syncs took (one histogram a thread: no lock between them),
        #: then the ring's.
        self.sync_times = [Histogram() for _ in range(threads + 1)]
        self._use_ring = ring
        self._ring: FsyncRing | None = None

    @property
    def ring(self) -> FsyncRing | None:
        """The io_uring for fdatasyncs, opened on first use; None where Linux offers none (or
        ``Syncer(ring=False)``): then ``datasync`` runs in a thread."""
        if self._use_ring and self._ring is None:
            self._use_ring = False  # one try
            self._ring = FsyncRing.open()
        return self._ring

    def start_datasync(self, ring: FsyncRing, path: str, done: RingDone) -> None:
        """Start the fdatasync of the file at ``path`` through ``ring`` (this syncer's), timed
        with the threads' syncs; ``done`` as ``FsyncRing.submit`` calls it."""
        started = time.perf_counter()  # a real fsync's duration: the simulator has no ring
        times = self.sync_times[-1]

        def ended(error: OSError | None) -> None:
            times.observe(time.perf_counter() - started)
            done(error)

        ring.submit(path, ended)

    def start(self, fn: Callable[[], object], done: Done, what: str = "sync") -> None:
        """``fn()`` in a sync thread, now; then ``done(None)`` or ``done(error)`` on the trio
        thread. Inside a trio run only."""
        self._ensure()
        self._jobs.put((fn, _Then(done), what))

    def _ensure(self) -> None:
        """Threads running, answering to the current trio run (``RuntimeError`` outside one)."""
        self._token = trio.lowlevel.current_trio_token()
        if self._threads:
            return
        for i in range(self._size):
            thread = threading.Thread(
                target=self._loop,
                args=(self.sync_times[i],),
                name=f"actorkeep-sync-{i}",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)

    async def run(self, fn: Callable[[], T], what: str = "sync") -> T:
        """``fn()`` in a sync thread; its value, or its exception. Not cancellable: a
        cancelled caller still waits for the job's end (an fsync cannot be undone)."""
        self._ensure()
        self._jobs.put((fn, current_task(), what))
        return await wait_task_rescheduled(_cannot_abort)  # type: ignore[no-any-return]

    def submit(
        self, fn: Callable[[], object], what: str, done: Callable[[], None] | None = None
    ) -> None:
        """``fn()`` in a sync thread, with nobody waiting (a failure is logged); then
        ``done()`` on the trio thread. Outside a trio run (a command-line tool closing a
        database), both run here and now."""
        try:
            self._ensure()
        except RuntimeError:
            try:
                fn()
            finally:
                if done is not None:
                    done()
            return
        self._jobs.put((fn, _Then(_logged(what, done)), what))

    def syncs(self) -> Histogram:
        """The durations of every sync so far, all threads together."""
        total = Histogram()
        for times in self.sync_times:
            total.add(times)
        return total

    def _loop(self, times: Histogram) -> None:
        while (job := self._jobs.get()) is not None:
            fn, then, what = job
            # A real fsync's duration, in a sync thread: the simulator has no such threads.
            started = time.perf_counter()
            result = outcome.capture(fn)
            if what == "sync":
                times.observe(time.perf_counter() - started)
            token = self._token
            assert token is not None
            # RunFinishedError: the run ended while the job ran, so nobody waits for it.
            with contextlib.suppress(trio.RunFinishedError):
                if isinstance(then, Task):
                    token.run_sync_soon(reschedule, then, result)
                elif then is not None:
                    error = result.error if isinstance(result, outcome.Error) else None
                    token.run_sync_soon(then, error)

    def close(self) -> None:
        """Run every job given so far, then stop the threads (blocks until they end)."""
        for _ in self._threads:
            self._jobs.put(None)
        for thread in self._threads:
            thread.join()
        self._threads = []
        self._token = None
        if self._ring is not None:
            self._ring.close()
            self._ring = None
            self._use_ring = True  # a later run opens a new one


async def started_and_ended(start: Callable[[Done], bool]) -> bool:
    """``start(done)``, then until ``done`` is called (raising the error it is given); False
    at once if ``start`` started nothing. Not cancellable, like ``Syncer.run``."""
    task = current_task()
    if not start(lambda error: reschedule(task, outcome.Value(error))):
        return False
    error = await wait_task_rescheduled(_cannot_abort)
    if error is not None:
        raise error
    return True


class _Then:
    """What runs on the trio thread after a job: ``done(error or None)``. An exception from
    it is logged: it must never end the trio run (``run_sync_soon`` would)."""

    __slots__ = ("_done",)

    def __init__(self, done: Done) -> None:
        self._done = done

    def __call__(self, error: BaseException | None) -> None:
        try:
            self._done(error)
        except Exception as exc:
            log.error("a step after a storage job failed", error=repr(exc))


def _logged(what: str, done: Callable[[], None] | None) -> Done:
    """A job nobody waits for: its failure is logged, then ``done()``."""

    def then(error: BaseException | None) -> None:
        if error is not None:
            log.error("storage job failed", job=what, error=repr(error))
        if done is not None:
            done()

    return then
