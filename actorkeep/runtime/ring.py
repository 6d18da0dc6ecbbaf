"""fdatasync through Linux's io_uring, for the trio thread (decision 0026).

A sync handed to a thread costs the event loop a hand-off each way, and in Python each
hand-off is several wake-ups (the thread's, then the interpreter lock's, back and forth):
about 100 us here, as much as the fdatasync itself. Through a ring the trio thread writes one
submission entry and makes one system call that does not block; one of the kernel's own
workers runs the fdatasync; its completion is counted on an eventfd that trio polls with the
other descriptors. No Python thread and no interpreter lock take part.

The ring is used only where it is known to work: Linux on x86_64 (its ordering of memory
accesses is what reading the rings without barriers needs) with io_uring allowed (containers
often forbid it). ``FsyncRing.open()`` returns None anywhere else, and the storage falls back
to its sync threads.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import platform
import struct
import sys
from collections import deque
from collections.abc import Callable
from typing import Any

import outcome
import structlog
import trio
from trio.lowlevel import Abort, current_task, reschedule, wait_task_rescheduled

log = structlog.get_logger("actorkeep")

# System call numbers (x86_64) and the constants of <linux/io_uring.h> used here.
_SETUP, _ENTER, _REGISTER = 425, 426, 427
_OFF_SQES = 0x10000000
_OP_FSYNC = 3
_FSYNC_DATASYNC = 1
_REGISTER_EVENTFD = 4
_ENTER_GETEVENTS = 1
_FEAT_SINGLE_MMAP = 1

#: Submissions in flight at most; more wait in order for a free slot. A sync of a file by its
#: path holds a descriptor only while in flight: the host's open-file budget keeps this many
#: for them (cli.FILES_RESERVED).
ENTRIES = 32

_PARAMS = 120  # sizeof(struct io_uring_params)
_SQE = struct.Struct("<BBHiQQIIQ24x")  # opcode, flags, ioprio, fd, off, addr, len, flags, data
_CQE = struct.Struct("<QiI")  # user_data, res, flags
_U32 = struct.Struct("<I")


#: Called with None once an fdatasync ended, or with its error.
Done = Callable[[OSError | None], None]


def _cannot_abort(_: Any) -> Abort:
    return Abort.FAILED  # a submitted fdatasync cannot be taken back: wait for its end


class FsyncRing:
    """One io_uring for fdatasyncs. ``datasync(fd)`` from the trio thread; ``close()`` once no
    trio run uses it any more."""

    def __init__(self, fd: int, params: bytes, libc: Any) -> None:
        self._fd = fd
        self._syscall = libc.syscall
        sq_entries, cq_entries = struct.unpack_from("<II", params, 0)
        features = struct.unpack_from("<I", params, 20)[0]
        sq_head, sq_tail, sq_mask, _, _, _, sq_array = struct.unpack_from("<7I", params, 40)
        cq_head, cq_tail, cq_mask, _, _, cqes = struct.unpack_from("<6I", params, 80)
        if not features & _FEAT_SINGLE_MMAP:
            raise OSError(errno.ENOTSUP, "io_uring without IORING_FEAT_SINGLE_MMAP (Linux < 5.4)")
        size = max(sq_array + sq_entries * 4, cqes + cq_entries * _CQE.size)
        rw = mmap.PROT_READ | mmap.PROT_WRITE
        self._rings = mmap.mmap(fd, size, mmap.MAP_SHARED, rw, offset=0)
        self._sqes = mmap.mmap(fd, sq_entries * _SQE.size, mmap.MAP_SHARED, rw, offset=_OFF_SQES)
        self._sq_tail = sq_tail
        self._sq_mask = _U32.unpack_from(self._rings, sq_mask)[0]
        self._sq_array = sq_array
        self._cq_head = cq_head
        self._cq_tail = cq_tail
        self._cq_mask = _U32.unpack_from(self._rings, cq_mask)[0]
        self._cqes = cqes
        del sq_head  # the kernel's: a slot is free again once its completion is reaped
        self._slots = min(sq_entries, cq_entries)
        self.eventfd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        arg = ctypes.c_int(self.eventfd)
        if self._syscall(_REGISTER, fd, _REGISTER_EVENTFD, ctypes.byref(arg), 1) < 0:
            code = ctypes.get_errno()
            os.close(self.eventfd)
            raise OSError(code, f"io_uring_register(EVENTFD): {os.strerror(code)}")
        #: user_data -> what to call with the outcome, and the descriptor to close after it
        #: (a sync by path) or -1.
        self._waiting: dict[int, tuple[Done, int]] = {}
        #: (fd or path, done): waiting for a free slot.
        self._queued: deque[tuple[int | str, Done]] = deque()
        #: Outcomes known at submission (a path that cannot be opened): handed on by the
        #: reaper, never from inside ``submit``.
        self._early: list[tuple[Done, OSError]] = []
        self._next = 1
        self._reaper: trio.lowlevel.TrioToken | None = None  # the run whose reaper task runs
        self._closed = False
        #: fdatasyncs completed (for measurements and tests).
        self.completed = 0

    @property
    def pending(self) -> int:
        """fdatasyncs asked for and not ended yet (in flight, or waiting for a slot)."""
        return len(self._waiting) + len(self._queued)

    @classmethod
    def open(cls, entries: int = ENTRIES) -> FsyncRing | None:
        """A ring, or None where io_uring cannot be used (the reason is logged at debug)."""
        if sys.platform != "linux" or platform.machine() != "x86_64":
            return None
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        params = ctypes.create_string_buffer(_PARAMS)
        fd = libc.syscall(_SETUP, ctypes.c_uint(entries), params)
        if fd < 0:
            log.debug("io_uring unavailable", error=os.strerror(ctypes.get_errno()))
            return None
        try:
            return cls(fd, params.raw, libc)
        except OSError as exc:
            os.close(fd)
            log.debug("io_uring unavailable", error=str(exc))
            return None

    async def datasync(self, target: int | str) -> None:
        """fdatasync of ``target``, a descriptor or a file's path, run by the kernel; returns
        once it ended, raises its ``OSError`` (a path: ``FileNotFoundError`` if there is no
        such file). Not cancellable: a cancelled caller still waits for the end (an
        fdatasync cannot be undone)."""
        task = current_task()
        self.submit(target, lambda error: reschedule(task, outcome.Value(error)))
        error = await wait_task_rescheduled(_cannot_abort)
        if error is not None:
            raise error

    def submit(self, target: int | str, done: Done) -> None:
        """Start the fdatasync of ``target`` (a descriptor, which must stay open until the
        end, or a file's path, opened only once a slot is free and closed at the end); call
        ``done(None)`` or ``done(error)`` on the trio thread once it ended, from the ring's
        reaper task (never from here)."""
        if self._closed:
            raise trio.ClosedResourceError("the ring is closed")
        token = trio.lowlevel.current_trio_token()
        if self._reaper is not token:
            self._reaper = token
            trio.lowlevel.spawn_system_task(self._reap, name="actorkeep fsync ring")
        if len(self._waiting) < self._slots:
            self._submit(target, done)
        else:
            self._queued.append((target, done))

    def _submit(self, target: int | str, done: Done) -> None:
        if isinstance(target, int):
            fd, owned = target, -1
        else:
            try:
                fd = owned = os.open(target, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as exc:
                self._early.append((done, exc))
                os.eventfd_write(self.eventfd, 1)  # the reaper hands it on
                return
        data = self._next
        self._next += 1
        rings = self._rings
        tail = _U32.unpack_from(rings, self._sq_tail)[0]
        slot = tail & self._sq_mask
        _SQE.pack_into(self._sqes, slot * _SQE.size, _OP_FSYNC, 0, 0, fd, 0, 0, 0,
                       _FSYNC_DATASYNC, data)  # fmt: skip
        _U32.pack_into(rings, self._sq_array + slot * 4, slot)
        _U32.pack_into(rings, self._sq_tail, tail + 1)  # x86_64: stores are seen in order
        self._waiting[data] = (done, owned)
        while (entered := self._syscall(_ENTER, self._fd, 1, 0, 0, None, 0)) < 0:
            code = ctypes.get_errno()
            if code == errno.EINTR:
                continue
            # Not submitted (EAGAIN/EBUSY are not expected with free slots): take the entry
            # back and fail this one caller.
            _U32.pack_into(rings, self._sq_tail, tail)
            del self._waiting[data]
            if owned >= 0:
                os.close(owned)
            self._early.append((done, OSError(code, f"io_uring_enter: {os.strerror(code)}")))
            os.eventfd_write(self.eventfd, 1)
            return
        assert entered == 1, entered

    async def _reap(self) -> None:
        """The run's reaper: wake each task whose fdatasync completed, until ``close()``."""
        efd = self.eventfd
        try:
            while not self._closed:  # (closed before this task first ran: its fd is gone)
                await trio.lowlevel.wait_readable(efd)
                if self._closed:
                    return  # closed while this task was about to run
                with contextlib.suppress(BlockingIOError):
                    os.eventfd_read(efd)
                self._harvest()
        except trio.ClosedResourceError:
            return  # close() was called while this task waited

    def _harvest(self) -> None:
        rings = self._rings
        head = _U32.unpack_from(rings, self._cq_head)[0]
        tail = _U32.unpack_from(rings, self._cq_tail)[0]  # x86_64: the entries are in place
        ended: list[tuple[Done, OSError | None]] = []
        while head != tail:
            data, res, _ = _CQE.unpack_from(rings, self._cqes + (head & self._cq_mask) * _CQE.size)
            head += 1
            entry = self._waiting.pop(data, None)
            if entry is None:
                continue
            done, owned = entry
            if owned >= 0:
                os.close(owned)
            self.completed += 1
            ended.append(
                (done, None if res >= 0 else OSError(-res, f"fdatasync: {os.strerror(-res)}"))
            )
        _U32.pack_into(rings, self._cq_head, head)
        if self._early:
            ended.extend(self._early)
            self._early = []
        queued = self._queued
        while queued and len(self._waiting) < self._slots:
            self._submit(*queued.popleft())
        for done, error in ended:
            try:
                done(error)
            except Exception as exc:  # the host's bookkeeping: never the run's end
                log.error("a step after an fdatasync failed", error=repr(exc))

    def close(self) -> None:
        """Wait for every fdatasync given so far (blocking, as the sync threads' close does),
        hand each its outcome, then release the ring."""
        if self._closed:
            return
        while self._waiting or self._queued or self._early:
            self._harvest()  # submits what was queued, as slots free up
            if self._waiting:
                self._syscall(_ENTER, self._fd, 0, 1, _ENTER_GETEVENTS, None, 0)
        self._closed = True
        with contextlib.suppress(RuntimeError):  # outside a trio run: no reaper waits on it
            trio.lowlevel.notify_closing(self.eventfd)
        os.close(self.eventfd)
        self._sqes.close()
        self._rings.close()
        os.close(self._fd)
