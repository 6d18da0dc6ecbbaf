"""The hosts' internal connections (decision 0017): authenticated by the cluster's secret, every
frame signed, in order, never replayed.

A connection starts with a handshake. The dialing host sends ``MAGIC`` and a fresh nonce; the
listening host answers with its own nonce and ``HMAC(secret, "server" | both nonces)``; the
dialer checks it and proves itself with ``HMAC(secret, "client" | both nonces)``. Both then sign
with a session key, ``HMAC(secret, "session" | both nonces)``, new for every connection. A frame
is its length (4 bytes), a msgpack value, and ``HMAC(key, direction | frame number | length |
value)``: a frame changed, cut, reordered, replayed from another connection or reflected back
to its sender fails its check, and the connection is closed. Frames are not encrypted: the
internal port belongs on a private network (docs/cluster.md).

A frame's value is one message (a list whose first item is its id), or a batch of them (a list
of messages): the messages queued while a write was in progress go in one frame, one signature
for all. A side sends batches only once the other has said it reads them (``peers.py``); it
reads both from any side.
"""

from __future__ import annotations

import hmac
import secrets
import struct
from collections import deque
from collections.abc import Callable
from hashlib import sha256
from typing import Any, Final

import msgpack
import trio

from .. import codec

MAGIC: Final = b"AKP1"
NONCE: Final = 16
MAC: Final = 32
#: The largest frame either side sends or takes (a call's body and arguments, its reply).
MAX_FRAME: Final = 64 * 1024 * 1024
#: Bytes queued behind a write in progress before senders wait for it.
MAX_QUEUED: Final = 4 * 1024 * 1024
#: How long a dialed or accepted connection may take to prove itself.
HANDSHAKE_TIMEOUT: Final = 5.0

_LENGTH = struct.Struct(">I")
_ARRAY_HEADER = msgpack.Packer().pack_array_header  # a msgpack array's header: 1 to 5 bytes
_NUMBERED = struct.Struct(">cQI")  # direction, frame number, length


class PeerRefused(Exception):
    """The other side failed to prove it knows the cluster's secret, or sent a frame that
    fails its check: the connection is closed."""


class Unsendable(ValueError):
    """A value msgpack cannot carry (nothing of it was sent)."""


class FrameTooLarge(Unsendable):
    """A frame past ``MAX_FRAME`` (nothing of it was sent)."""


def _mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.digest(key, b"".join(parts), sha256)


class _Reader:
    """Exact reads from a stream (``trio.EndOfChannel`` if it ends first)."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self._buffer = bytearray()
        self._at = 0  # where the unread bytes of _buffer start

    async def exactly(self, n: int) -> bytes:
        while len(self._buffer) - self._at < n:
            if self._at:  # move what is unread to the front once, not after every read
                del self._buffer[: self._at]
                self._at = 0
            chunk = await self._stream.receive_some(max(65536, n - len(self._buffer)))
            if not chunk:
                raise trio.EndOfChannel("the peer closed the connection")
            self._buffer += chunk
        at = self._at
        self._at = at + n
        return bytes(self._buffer[at : at + n])


class Channel:
    """One authenticated connection: ``send`` and ``receive`` msgpack values.

    ``send`` may be called from several tasks: frames go out in the order they were given, and
    frames given while another task is writing go out with its next write (one system call for
    a burst of replies). ``receive`` from one task only.
    """

    def __init__(
        self, stream: trio.abc.Stream, reader: _Reader, key: bytes, *, dialer: bool
    ) -> None:
        self._stream = stream
        self._reader = reader
        self._base = hmac.new(key, digestmod=sha256)
        self._out_dir, self._in_dir = (b"c", b"s") if dialer else (b"s", b"c")
        self._sent = 0
        self._received = 0
        self._outgoing: list[bytes] = []  # packed messages, not yet framed
        self._queued = 0  # bytes in _outgoing
        self._writing = False
        self._drained = trio.Event()
        self._broken: BaseException | None = None
        self._unread: deque[Any] = deque()  # the rest of a batch received
        #: Whether the other side reads batches (it said so): then messages queued together
        #: go in one frame.
        self.batches = False

    @property
    def broken(self) -> bool:
        """Whether a write failed or was cut short (the connection is closed then)."""
        return self._broken is not None

    def _sign(self, direction: bytes, number: int, body: bytes) -> bytes:
        h = self._base.copy()
        h.update(_NUMBERED.pack(direction, number, len(body)))
        h.update(body)
        return h.digest()

    async def send(self, value: Any) -> None:
        """Queue ``value`` and write what is queued, unless another task is writing: then it
        goes with that task's next write (this waits only while ``MAX_QUEUED`` bytes wait).
        The first write waits for the other tasks ready to run, so that what they send goes
        with it. ``Unsendable`` (nothing sent) if msgpack cannot carry ``value``;
        ``trio.BrokenResourceError`` once a write failed."""
        try:
            body = codec.pack(value)
        except (ValueError, TypeError, OverflowError) as exc:
            raise Unsendable(f"not a value msgpack carries: {exc}") from None
        if len(body) > MAX_FRAME:
            raise FrameTooLarge(f"a frame of {len(body)} bytes (at most {MAX_FRAME})")
        if self._broken is not None:
            raise trio.BrokenResourceError("the connection is broken") from self._broken
        self._outgoing.append(body)
        self._queued += len(body)
        if self._writing:
            while self._writing and self._queued > MAX_QUEUED:
                await self._drained.wait()
            return
        self._writing = True
        try:
            await trio.lowlevel.cancel_shielded_checkpoint()
            while self._outgoing:
                data = self._frames(self._outgoing)
                self._outgoing.clear()
                self._queued = 0
                self._drained.set()
                self._drained = trio.Event()
                await self._stream.send_all(data)
        except BaseException as exc:
            # A write cut short (cancelled, or the peer gone) leaves half a frame behind: the
            # connection is closed, and its reader sees the end.
            self._broken = exc
            with trio.CancelScope(shield=True):
                await self._stream.aclose()
            raise
        finally:
            self._writing = False
            self._drained.set()

    def _frames(self, bodies: list[bytes]) -> bytes:
        """``bodies`` (packed messages) framed and signed: in batches of at most
        ``MAX_FRAME`` bytes if the other side reads them, else one frame each."""
        parts: list[bytes] = []
        if not self.batches:
            for body in bodies:
                self._frame(parts, body)
            return b"".join(parts)
        batch: list[bytes] = []
        size = 0
        for body in bodies:
            if batch and size + len(body) > MAX_FRAME - _HEADER_SIZE[0xDD]:
                self._frame_batch(parts, batch)
                batch, size = [], 0
            batch.append(body)
            size += len(body)
        self._frame_batch(parts, batch)
        return b"".join(parts)

    def _frame_batch(self, parts: list[bytes], batch: list[bytes]) -> None:
        if len(batch) == 1:
            self._frame(parts, batch[0])
            return
        self._frame(parts, _ARRAY_HEADER(len(batch)) + b"".join(batch))

    def _frame(self, parts: list[bytes], body: bytes) -> None:
        parts += (_LENGTH.pack(len(body)), body, self._sign(self._out_dir, self._sent, body))
        self._sent += 1

    async def receive(self) -> Any:
        """The next message (``trio.EndOfChannel`` once the peer closed; ``PeerRefused`` for a
        frame that fails its check)."""
        if self._unread:
            return self._unread.popleft()
        (length,) = _LENGTH.unpack(await self._reader.exactly(_LENGTH.size))
        if length > MAX_FRAME:
            raise PeerRefused(f"a frame of {length} bytes (at most {MAX_FRAME})")
        signed = await self._reader.exactly(length + MAC)  # one read for the value and its MAC
        body, mac = signed[:length], signed[length:]
        if not hmac.compare_digest(mac, self._sign(self._in_dir, self._received, body)):
            raise PeerRefused("a frame failed its signature check")
        self._received += 1
        try:
            batch = _batch(body)
            if batch is None:
                return codec.unpack(body)
        except (ValueError, msgpack.UnpackException) as exc:
            raise PeerRefused(f"a frame is not msgpack: {exc}") from None  # signed: a bug there
        self._unread.extend(batch)
        return self._unread.popleft()

    async def aclose(self) -> None:
        await self._stream.aclose()


_ARRAYS: Final = frozenset(range(0x90, 0xA0)) | {0xDC, 0xDD}
#: An array header's bytes, by its first: 1 (a fixarray), or 3 or 5 (``0xdc``, ``0xdd``).
_HEADER_SIZE: Final = {0xDC: 3, 0xDD: 5}


def _batch(body: bytes) -> list[Any] | None:
    """The messages of a batch, each read on its own (a batch adds no nesting to what a
    message may hold); None if ``body`` is not one: an array whose first item is an array."""
    if not body or body[0] not in _ARRAYS:
        return None
    at = _HEADER_SIZE.get(body[0], 1)  # the first item: an array in a batch, an id alone
    if len(body) <= at or body[at] not in _ARRAYS:
        return None
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=len(body))
    unpacker.feed(body)
    n = unpacker.read_array_header()
    messages = [unpacker.unpack() for _ in range(n)]
    if n < 2 or unpacker.tell() != len(body) or not all(type(m) is list for m in messages):
        raise PeerRefused("a batch of the wrong shape")
    return messages


#: ``nonce(n)``: ``n`` fresh random bytes (the simulator passes seeded ones).
Nonce = Callable[[int], bytes]


async def dial(
    stream: trio.abc.Stream, secret: bytes, nonce: Nonce = secrets.token_bytes
) -> Channel:
    """The dialing side's handshake on a new connection (``PeerRefused``, ``trio.TooSlowError``)."""
    with trio.fail_after(HANDSHAKE_TIMEOUT):
        reader = _Reader(stream)
        mine = nonce(NONCE)
        await stream.send_all(MAGIC + mine)
        theirs = await reader.exactly(NONCE)
        proof = await reader.exactly(MAC)
        if not hmac.compare_digest(proof, _mac(secret, b"server", mine, theirs)):
            raise PeerRefused("the listening host does not know the cluster's secret")
        await stream.send_all(_mac(secret, b"client", mine, theirs))
        return Channel(stream, reader, _mac(secret, b"session", mine, theirs), dialer=True)


async def accept(
    stream: trio.abc.Stream, secret: bytes, nonce: Nonce = secrets.token_bytes
) -> Channel:
    """The listening side's handshake (``PeerRefused``, ``trio.TooSlowError``,
    ``trio.EndOfChannel``)."""
    with trio.fail_after(HANDSHAKE_TIMEOUT):
        reader = _Reader(stream)
        hello = await reader.exactly(len(MAGIC) + NONCE)
        if hello[: len(MAGIC)] != MAGIC:
            raise PeerRefused("not an actorkeep host")
        theirs, mine = hello[len(MAGIC) :], nonce(NONCE)
        await stream.send_all(mine + _mac(secret, b"server", theirs, mine))
        proof = await reader.exactly(MAC)
        if not hmac.compare_digest(proof, _mac(secret, b"client", theirs, mine)):
            raise PeerRefused("the dialing host does not know the cluster's secret")
        return Channel(stream, reader, _mac(secret, b"session", theirs, mine), dialer=False)
