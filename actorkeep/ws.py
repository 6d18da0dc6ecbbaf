"""``ak.WebSocket``: an open WebSocket of an actor (docs/websockets.md).

The host keeps every accepted socket, with its tags and attachment, for as long as it is
open, whether or not its actor is in memory (hibernation). An actor's handlers receive the
same ``WebSocket`` object for a socket from its accept to its close.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from . import codec

#: Bytes an attachment may hold, encoded (msgpack).
MAX_ATTACHMENT = 2048
#: A tag: at most this many characters; a socket has at most ``MAX_TAGS`` of them.
MAX_TAG = 256
MAX_TAGS = 10
#: Bytes a close reason may hold, encoded in UTF-8 (what fits a close frame).
MAX_REASON = 123


class SocketHub(Protocol):
    """What a ``WebSocket`` asks of the host that holds it (runtime/sockets.py)."""

    def send(self, ws: WebSocket, message: str | bytes) -> None: ...

    def close(self, ws: WebSocket, code: int, reason: str) -> None: ...


def check_close(code: object, reason: object) -> None:
    """``ValueError`` unless ``code`` and ``reason`` may be sent by an application."""
    if type(code) is not int or not (code == 1000 or 3000 <= code <= 4999):
        raise ValueError(f"close code must be 1000 or in 3000-4999, not {code!r}")
    if not isinstance(reason, str) or len(reason.encode()) > MAX_REASON:
        raise ValueError(f"close reason must be a str of at most {MAX_REASON} UTF-8 bytes")


def check_tags(tags: Iterable[str]) -> tuple[str, ...]:
    """``tags`` as a tuple, or ``ValueError`` for what a socket cannot carry."""
    if isinstance(tags, str):
        raise ValueError("tags must be a collection of str, not one str")
    checked = tuple(dict.fromkeys(tags))
    if len(checked) > MAX_TAGS:
        raise ValueError(f"a socket has at most {MAX_TAGS} tags")
    for tag in checked:
        if not isinstance(tag, str) or not 0 < len(tag) <= MAX_TAG:
            raise ValueError(f"a tag is a str of 1 to {MAX_TAG} characters, not {tag!r}")
    return checked


def encode_attachment(value: Any) -> bytes:
    """``value`` encoded for keeping, or ``ValueError`` if it cannot be kept."""
    try:
        data = codec.pack(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(f"an attachment must be msgpack-serializable: {exc}") from None
    if len(data) > MAX_ATTACHMENT:
        raise ValueError(f"an attachment holds at most {MAX_ATTACHMENT} bytes encoded")
    return data


class WebSocket:
    """One open WebSocket of an actor.

    ``send`` and ``close`` never wait: what they write leaves through the actor's output gate,
    after the writes made before them are durable, like a reply. ``tags`` are set at accept;
    ``attachment`` is a small value kept with the socket while the actor is out of memory.
    """

    __slots__ = ("_attachment", "_hub", "address", "closed", "id", "tags")

    def __init__(
        self, hub: SocketHub, address: str, socket_id: int, tags: tuple[str, ...], attachment: bytes
    ) -> None:
        self._hub = hub
        #: The address of the actor the socket belongs to.
        self.address = address
        #: Unique among the host's sockets while it runs.
        self.id = socket_id
        self.tags = tags
        self._attachment = attachment
        #: Set once the socket is closed, by either side; sends are then dropped.
        self.closed = False

    @property
    def attachment(self) -> Any:
        """A copy of the attachment (None until set). Set it to keep a new one: at most
        ``MAX_ATTACHMENT`` bytes once encoded with msgpack (``ValueError`` beyond)."""
        return codec.unpack(self._attachment) if self._attachment else None

    @attachment.setter
    def attachment(self, value: Any) -> None:
        self._attachment = encode_attachment(value) if value is not None else b""

    def send(self, message: str | bytes) -> None:
        """Send a text (``str``) or binary (``bytes``) message. Dropped once the socket is
        closed. A client whose unread messages pass the host's send buffer is cut off (close
        code 1008) without stopping the actor."""
        if isinstance(message, bytearray | memoryview):
            message = bytes(message)
        elif not isinstance(message, str | bytes):
            raise TypeError(f"a message is str or bytes, not {type(message).__name__}")
        if not self.closed:
            self._hub.send(self, message)

    def close(self, code: int = 1000, reason: str = "") -> None:
        """Close the socket with ``code`` (1000, or 3000-4999 for the app's own) and
        ``reason``; the actor gets no ``websocket_close`` for a close of its own."""
        check_close(code, reason)
        if not self.closed:
            self._hub.close(self, code, reason)

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<WebSocket {self.id} of {self.address} {state} tags={list(self.tags)}>"
