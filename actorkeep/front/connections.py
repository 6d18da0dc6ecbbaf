"""The server's open connections, where each one is, and which to close to make room.

A connection is *fresh* (nothing sent yet), *idle* (between keep-alive requests), in a *head*,
in a *body*, or *busy* (its request is with the host: never closed to make room). Each waiting
stage is a line, longest-waiting first. At the connection cap, and when the in-flight budget
runs short, the server asks this table which connection to close (decision 0010).
"""

from __future__ import annotations

import array
import fcntl
import termios
from typing import Literal

import trio

from ..runtime.budget import ByteBudget

Stage = Literal["fresh", "idle", "head", "body", "busy"]
#: A new connection gets this long to send its first bytes, and an upload this long to show
#: its rate, before either may be closed to make room for another connection.
FRESH_GRACE = 0.5
JUDGE_AFTER = 0.005
#: In its first window a body's rate is judged as if it had been coming for at least this
#: long: a kilobyte in its first millisecond is not a fast upload (a trickle that opens with
#: one would look like one). Later windows are judged as they are: an upload that has kept
#: its rate so far is not taken for slow in the first milliseconds of a new window.
RATE_SPAN = 0.1
#: Fresh connections looked at (oldest first) for one that sent nothing, per connection shed.
SILENT_SCAN = 16
#: When the in-flight budget runs short, uploads slower than this many times ``min_rate`` in
#: their current window are closed, slowest first, to make room.
RECLAIM_BELOW = 4.0


class Connection:
    """One client connection: the cancel scope that closes it, where it is, and the bytes of
    its request body it holds of the host's in-flight budget. ``fd`` is its socket's file
    descriptor (-1: unknown), to see whether the client sent bytes its task has not read yet."""

    __slots__ = (
        "fd",
        "held",
        "replying",
        "scope",
        "since",
        "stage",
        "window_base",
        "window_start",
    )

    def __init__(self, fd: int = -1) -> None:
        self.fd = fd
        self.scope = trio.CancelScope()
        self.stage: Stage = "fresh"
        self.since = trio.current_time()  # when it entered its stage
        self.held = 0
        self.replying = False  # a reply is being written (one cut off leaves it True)
        self.window_start = 0.0  # the body's current rate window: when it began,
        self.window_base = 0  # and how many bytes had arrived then

    def rate(self, now: float) -> float:
        """Bytes per second of its body in the current window (the first one at least
        ``RATE_SPAN`` long)."""
        span = RATE_SPAN if self.window_base == 0 else 0.001
        return (self.held - self.window_base) / max(now - self.window_start, span)

    def silent(self) -> bool:
        """Whether nothing the client sent waits to be read. A new connection whose request
        has arrived, but whose task has not run yet, is not silent: under a flood of new
        connections that task may run only after many more accepts."""
        if self.fd < 0:
            return True
        waiting = array.array("i", [0])
        try:
            fcntl.ioctl(self.fd, termios.FIONREAD, waiting)
        except OSError:  # closed meanwhile: nothing to read, nothing to lose
            return True
        return waiting[0] == 0

    def slow(self, now: float, below: float) -> bool:
        """Whether its body comes slower than ``below`` bytes a second (a body just begun is
        not judged yet)."""
        return now - self.window_start >= JUDGE_AFTER and self.rate(now) < below


class Connections:
    """The open connections, in line by stage. ``min_rate``: the bytes per second a body
    must bring (``ServerLimits.min_rate``); ``budget``: the host's in-flight bytes."""

    def __init__(self, min_rate: float, budget: ByteBudget) -> None:
        self._slow = RECLAIM_BELOW * min_rate
        self._budget = budget
        self._open: set[Connection] = set()
        #: Connections waiting for their client, by stage, longest first (dicts keep insertion
        #: order): the ones closed to make room.
        self._waiting: dict[Stage, dict[Connection, None]] = {
            "fresh": {},
            "idle": {},
            "head": {},
            "body": {},
        }
        self.shed = 0  # connections closed to make room for new ones (or their bytes)

    def __len__(self) -> int:
        return len(self._open)

    def add(self, fd: int = -1) -> Connection:
        """A new, fresh connection on the socket ``fd``."""
        conn = Connection(fd)
        self._open.add(conn)
        self._waiting["fresh"][conn] = None
        return conn

    def remove(self, conn: Connection) -> None:
        """``conn`` has ended."""
        self._open.discard(conn)
        if conn.stage != "busy":
            self._waiting[conn.stage].pop(conn, None)

    def move(self, conn: Connection, stage: Stage) -> None:
        """Move ``conn`` to ``stage`` (to the end of its line)."""
        if conn.stage != "busy":
            self._waiting[conn.stage].pop(conn, None)
        conn.stage = stage
        conn.since = trio.current_time()
        if stage != "busy":
            self._waiting[stage][conn] = None

    def close(self, conn: Connection) -> None:
        """Close ``conn`` to make room."""
        if conn.stage != "busy":
            self._waiting[conn.stage].pop(conn, None)
            conn.stage = "busy"
        conn.scope.cancel()
        self.shed += 1

    def close_waiting(self) -> None:
        """Close every connection that waits for its client (shutdown)."""
        for line in self._waiting.values():
            for conn in line:
                conn.scope.cancel()
            line.clear()

    def shed_one(self) -> bool:
        """Close one connection to make room: the longest-waiting of the idle keep-alive
        connections, the new ones that sent nothing in ``FRESH_GRACE`` seconds, the half-sent
        heads and the uploads slower than ``RECLAIM_BELOW`` x ``min_rate``. Only when there is
        none of those, a new connection that has sent nothing yet, still in its grace (a flood
        of new connections sheds its own), then the slowest upload. Never one whose request is
        with the host or waits to be read: False then, and the newcomer is refused."""
        now = trio.current_time()
        bodies = self._waiting["body"]
        silent = self._silent_fresh()
        candidates = [
            next(iter(self._waiting["idle"]), None),
            next((c for c in silent if c.since <= now - FRESH_GRACE), None),
            next(iter(self._waiting["head"]), None),
            next((c for c in bodies if c.slow(now, self._slow)), None),
        ]
        waiting = [c for c in candidates if c is not None]
        if waiting:
            self.close(min(waiting, key=lambda c: c.since))
            return True
        if silent:
            self.close(silent[0])
            return True
        if bodies:
            self.close(min(bodies, key=lambda c: c.rate(now)))
            return True
        return False

    def _silent_fresh(self) -> list[Connection]:
        """The oldest fresh connections that sent nothing yet (at most ``SILENT_SCAN`` of
        them are looked at: one ``ioctl`` each)."""
        out = []
        for i, conn in enumerate(self._waiting["fresh"]):
            if i >= SILENT_SCAN:
                break
            if conn.silent():
                out.append(conn)
        return out

    def reclaim(self, needed: int) -> None:
        """Close slow uploads (under ``RECLAIM_BELOW`` x ``min_rate`` in their current
        window), slowest first, until ``needed`` bytes of the in-flight budget are free.
        Faster uploads are kept: when they alone fill the budget, new bodies get 503."""
        now = trio.current_time()
        candidates = sorted(
            (c for c in self._waiting["body"] if c.held and c.slow(now, self._slow)),
            key=lambda c: c.rate(now),
        )
        for conn in candidates:
            if needed <= 0:
                return
            self.close(conn)
            self._budget.give(conn.held)
            needed -= conn.held
            conn.held = 0
