"""The network between simulated cluster hosts: byte streams in memory, on the trio thread, for
the hosts' internal connections (``Peers(connect=...)`` and ``serve_connection``).

Every chunk sent arrives after a delay drawn from the network's seeded ``rng``, in the order it
was sent. A link can be cut one way or both ways (``cut``): what is sent across it is held, as
TCP retransmits it, and arrives once the link heals (``heal``), unless the connection was
closed meanwhile. Connecting across a cut link waits for the heal (the dialer's own timeout
ends the wait); connecting to an address nobody listens on is refused at once.

A fraction ``drop`` of the chunks sent are dropped for good, as when TCP gives up on a
connection whose segments keep being lost (or a middlebox forgets it): the connection is
reset, what either side had in flight is lost, and both ends see it end (a read returns the
end, a send fails). Shorter losses are only delay, which TCP's retransmissions turn them into.

A paused host (``hold``, as SIGSTOP) sends and receives nothing until ``release``: what was
sent to it, and what it sent, arrives then. A dead host (``down``, as kill -9) sends nothing
more; its connections end for the others, and a send to it fails.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio

Handler = Callable[[trio.abc.Stream], Awaitable[None]]


@dataclass
class _Direction:
    """One direction of a connection: what is in flight, and what has arrived."""

    src: str
    dst: str
    in_flight: deque[tuple[float, bytes | None]] = field(default_factory=deque)  # None: EOF
    arrived: bytearray = field(default_factory=bytearray)
    eof: bool = False
    last_at: float = 0.0
    sent: trio.Event = field(default_factory=trio.Event)
    landed: trio.Event = field(default_factory=trio.Event)
    peer: _Direction | None = None  # the other direction of the same connection


class SimStream(trio.abc.Stream):
    """One end of a simulated connection."""

    def __init__(self, net: SimNetwork, out: _Direction, into: _Direction) -> None:
        self._net = net
        self._out = out
        self._in = into
        self._closed = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._closed:
            raise trio.ClosedResourceError("this end is closed")
        if self._out.eof:
            raise trio.BrokenResourceError("the connection is closed")
        await trio.lowlevel.checkpoint()
        self._net.send(self._out, bytes(data))

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._closed:
            raise trio.ClosedResourceError("this end is closed")
        into = self._in
        while not into.arrived and not into.eof:
            into.landed = trio.Event()
            await into.landed.wait()
        await trio.lowlevel.checkpoint()
        n = len(into.arrived) if max_bytes is None else max_bytes
        chunk = bytes(into.arrived[:n])
        del into.arrived[:n]
        return chunk

    async def send_eof(self) -> None:
        self._net.send(self._out, None)
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._net.send(self._out, None)
            self._in.eof = True  # nothing more is read here
            self._in.landed.set()
        await trio.lowlevel.checkpoint()


class SimNetwork:
    """The simulated network; ``run`` it in a nursery before anything connects."""

    def __init__(
        self,
        rng: random.Random,
        latency: tuple[float, float] = (0.0001, 0.001),
        drop: float = 0.0,
        drops: random.Random | None = None,
        on_reset: Callable[[str, str], object] | None = None,
    ) -> None:
        self.rng = rng
        self.latency = latency
        self.drop = drop
        self._drops = drops if drops is not None else random.Random(0)  # (rng draws nothing)
        self._on_reset = on_reset  # told (sender, receiver) of each reset
        self._listeners: dict[str, Handler] = {}
        self._cut: set[tuple[str, str]] = set()
        self._held: set[str] = set()
        self._dead: set[str] = set()
        self._directions: list[_Direction] = []
        self._healed = trio.Event()
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._nursery = None

    def listen(self, address: str, handler: Handler) -> None:
        """``handler(stream)`` answers every connection to ``address`` (``host:port``)."""
        self._listeners[address] = handler

    def stop_listening(self, address: str) -> None:
        self._listeners.pop(address, None)

    def cut(self, a: str, b: str, both_ways: bool = True) -> None:
        """Hold what host ``a`` sends to ``b`` (and ``b`` to ``a``) until ``heal``."""
        self._cut.add((a, b))
        if both_ways:
            self._cut.add((b, a))

    def heal(self) -> None:
        """Every link carries again; what was held arrives (paused hosts stay paused)."""
        self._cut.clear()
        self._wake()

    def hold(self, host: str) -> None:
        """Host ``host`` is paused: nothing reaches it or leaves it until ``release``."""
        self._held.add(host)

    def release(self, host: str) -> None:
        self._held.discard(host)
        self._wake()

    def down(self, host: str) -> None:
        """Host ``host`` is dead: what it sent and had not arrived is lost, its connections end
        for the others (their reads see the end, their sends fail), and it is never reached
        again."""
        self._dead.add(host)
        self._held.discard(host)
        self.stop_listening_of(host)
        for direction in self._directions:
            if direction.src == host and not direction.eof:
                direction.in_flight.clear()
                direction.in_flight.append((trio.current_time(), None))
                direction.sent.set()
            elif direction.dst == host:
                direction.eof = True
                direction.landed.set()
        self._directions = [d for d in self._directions if host not in (d.src, d.dst)]
        self._wake()

    def stop_listening_of(self, host: str) -> None:
        for address in [a for a in self._listeners if a.rpartition(":")[0] == host]:
            del self._listeners[address]

    def _wake(self) -> None:
        self._healed.set()
        self._healed = trio.Event()

    def is_cut(self, src: str, dst: str) -> bool:
        return (src, dst) in self._cut or src in self._held or dst in self._held

    def connector(self, host: str) -> Callable[[str, int], Awaitable[trio.abc.Stream]]:
        """What host ``host`` dials with (``Peers(secret, connect=net.connector(host))``)."""

        async def connect(peer_host: str, port: int) -> trio.abc.Stream:
            address = f"{peer_host}:{port}"
            while self.is_cut(host, peer_host) or self.is_cut(peer_host, host):
                await self._healed.wait()  # the dialer's timeout ends this
            await trio.sleep(self._delay())
            handler = self._listeners.get(address)
            if handler is None or self._nursery is None or host in self._dead:
                raise ConnectionRefusedError(f"nobody listens on {address}")
            there, back = _Direction(host, peer_host), _Direction(peer_host, host)
            there.peer, back.peer = back, there
            self._directions += (there, back)
            mine, theirs = SimStream(self, there, back), SimStream(self, back, there)
            for direction in (there, back):
                self._nursery.start_soon(self._deliver, direction)
            self._nursery.start_soon(handler, theirs)
            return mine

        return connect

    def _delay(self) -> float:
        return self.rng.uniform(*self.latency)

    def send(self, direction: _Direction, data: bytes | None) -> None:
        if direction.src in self._dead:
            return  # a dead host's late sends go nowhere
        if data is not None and self.drop and self._drops.random() < self.drop:
            self._reset(direction)
            return
        at = max(trio.current_time() + self._delay(), direction.last_at)
        direction.last_at = at
        direction.in_flight.append((at, data))
        direction.sent.set()

    def _reset(self, direction: _Direction) -> None:
        """The connection of ``direction`` is reset: both ways lose what is in flight and end."""
        if self._on_reset is not None:
            self._on_reset(direction.src, direction.dst)
        now = trio.current_time()
        for d in (direction, direction.peer):
            if d is None or d.eof:
                continue
            d.in_flight.clear()
            d.in_flight.append((now, None))
            d.last_at = now
            d.sent.set()

    async def _deliver(self, direction: _Direction) -> None:
        """Move one direction's chunks to the other end, each at its time, in order."""
        while True:
            while not direction.in_flight:
                direction.sent = trio.Event()
                await direction.sent.wait()
            first = direction.in_flight[0]
            await trio.sleep_until(first[0])
            while self.is_cut(direction.src, direction.dst):
                await self._healed.wait()
            if not direction.in_flight or direction.in_flight[0] is not first:
                continue  # the sender died meanwhile: what it had sent is gone
            _, data = direction.in_flight.popleft()
            if data is None:
                direction.eof = True
            else:
                direction.arrived += data
            direction.landed.set()
            if data is None:
                return
