"""HTTP/1.1 on the wire: requests read with httptools (llhttp), responses written here.

``RequestReader`` turns the bytes of one connection into a stream of events, one request at a
time, the way the server consumes them: a ``RequestHead``, its body as ``bytes`` chunks, then
``END``. ``NEED_DATA`` asks for more bytes, ``CLOSED`` says the client closed between requests,
and a request HTTP/1.1 does not allow raises ``ProtocolError`` with the status to answer. The
reader holds at most what one ``feed`` gave it ahead of the server: pipelined requests wait as
events, in order, and the server reads from the socket only once they are consumed.

``encode_response`` writes a response head and body, refusing what HTTP cannot carry
(``ValueError``). See docs/decisions/0019-http-parser.md.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Final

import httptools

#: The largest chunk ``RequestReader.feed`` takes; the server reads at most this much at once.
MAX_FEED: Final = 65536


class _Marker:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


#: The request's body is whole.
END: Final = _Marker("END")
#: Nothing more can be read without more bytes from the client.
NEED_DATA: Final = _Marker("NEED_DATA")
#: The client closed the connection between two requests.
CLOSED: Final = _Marker("CLOSED")


class ProtocolError(Exception):
    """The client sent what HTTP/1.1 does not allow: answer ``status`` and close."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class _Stop(Exception):
    """Raised in a callback to stop the parser at a request it refused."""


@dataclass(slots=True)
class RequestHead:
    """A request line and its headers; names are lower-cased, values stripped of blanks."""

    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]
    keep_alive: bool
    #: The declared body length (0 when none is declared); None for a chunked body.
    content_length: int | None
    #: Bytes of the head as sent (request line, headers and their line ends).
    size: int
    #: It asks to upgrade to WebSocket (``upgrade: websocket`` on a GET with no body).
    websocket: bool = False


class RequestReader:
    """Parses one connection's requests. ``max_head``: bytes a head may hold, at most."""

    __slots__ = (
        "_error",
        "_events",
        "_fed",
        "_head",
        "_in_body",
        "_in_head",
        "_last",
        "_max_head",
        "_parser",
        "_raw_body",
        "_size",
        "_url",
        "upgraded",
        "waiting_for_continue",
    )

    def __init__(self, max_head: int) -> None:
        self._max_head = max_head
        self._parser = httptools.HttpRequestParser(self)
        self._events: deque[RequestHead | bytes | _Marker | ProtocolError] = deque()
        self._url: list[bytes] = []
        self._head: list[tuple[str, str]] = []
        self._last = RequestHead("", "", "", [], False, 0, 0)  # the latest head parsed
        self._size = 0
        self._fed = 0  # bytes fed since the feed in which the current head began
        self._in_head = False
        self._in_body = False
        self._raw_body = 0  # body bytes of an upgrade request llhttp left to us
        self._error: ProtocolError | None = None  # the parser failed: nothing more is read
        #: The current request asked for ``100 Continue`` and no byte of its body came yet.
        self.waiting_for_continue = False
        #: After a WebSocket upgrade request: the bytes that followed it (frames, not HTTP).
        self.upgraded: bytes | None = None

    @property
    def in_body(self) -> bool:
        """Whether the current request's head is whole and its body is not yet."""
        return self._in_body

    def next_event(self) -> RequestHead | bytes | _Marker:
        """The next event; ``ProtocolError`` once the bytes stop making a request."""
        if self._events:
            event = self._events.popleft()
            if isinstance(event, ProtocolError):
                raise event
            return event
        return NEED_DATA

    def feed(self, data: bytes) -> None:
        """Bytes from the client (at most ``MAX_FEED``); ``b""`` when it closed its side."""
        if self._error is not None or self.upgraded is not None:
            return
        if not data:
            if self._in_head or self._in_body:
                self._fail(400, "the client closed the connection mid-request")
            else:
                self._events.append(CLOSED)
            return
        if self._raw_body:
            data = self._take_raw_body(data)
            if not data:
                return
        if self._in_head:
            self._fed += len(data)
        self._feed_parser(data)

    def _feed_parser(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            self._upgraded(data[upgrade.args[0] :])
            return
        except httptools.HttpParserCallbackError:
            if self._error is None:  # a bug of ours in a callback: not the client's fault
                raise
            return
        except httptools.HttpParserError as exc:
            self._parse_failed(str(exc))
            return
        # A head can only be judged once whole; one still arriving may hold what was fed
        # since the feed it began in, less what came before it in that feed (at most one feed).
        if self._in_head and self._fed > self._max_head + MAX_FEED:
            self._fail(431, "request head too large")

    def _upgraded(self, rest: bytes) -> None:
        # llhttp stops after the head of a request that asks to switch protocols. What
        # follows a WebSocket upgrade is the socket's (front/websocket.py). Any other upgrade
        # is not served (decision 0019): the request is an ordinary one, its body (if
        # declared by length) is read here, and parsing goes on after it with a new parser.
        if self._error is not None:
            return
        if self._last.websocket:
            self.upgraded = rest
            return
        self._parser = httptools.HttpRequestParser(self)
        # llhttp already reported the end of the message: it comes after the body.
        if self._events and self._events[-1] is END:
            self._events.pop()
        length = self._last.content_length
        if length is None:
            self._fail(400, "a request that asks to upgrade may not have a chunked body")
            return
        self._raw_body = length
        self._in_body = True
        if not self._raw_body:
            self._end_raw_body()
        rest = self._take_raw_body(rest) if self._raw_body else rest
        if rest:
            self._feed_parser(rest)

    def _take_raw_body(self, data: bytes) -> bytes:
        body, rest = data[: self._raw_body], data[self._raw_body :]
        self._raw_body -= len(body)
        self.on_body(body)
        if not self._raw_body:
            self._end_raw_body()
        return rest

    def _end_raw_body(self) -> None:
        self._in_body = False
        self.waiting_for_continue = False
        self._events.append(END)

    def _parse_failed(self, message: str) -> None:
        if message == "Invalid HTTP version":
            self._fail(505, "HTTP/1.1 only")
        elif message == "Pause on PRI/Upgrade":  # the HTTP/2 connection preface
            self._fail(505, "HTTP/2 is not served: HTTP/1.1 only")
        else:
            self._fail(400, f"malformed HTTP: {message}")

    def _fail(self, status: int, message: str) -> None:
        self._error = ProtocolError(status, message)
        self._events.append(self._error)
        self._in_head = self._in_body = False

    # -- httptools' callbacks ---------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._in_head = True
        self._fed = MAX_FEED  # this feed, at most
        self._url = []
        self._head = []
        self._size = 14  # the request line's blanks, version and line end, and the blank line

    def on_url(self, url: bytes) -> None:
        self._url.append(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head.append((name.decode("latin-1").lower(), value.decode("latin-1").strip(" \t")))
        self._size += len(name) + len(value) + 4

    def on_headers_complete(self) -> None:
        parser = self._parser
        method = parser.get_method().decode("ascii")
        target = b"".join(self._url).decode("latin-1")
        version = parser.get_http_version()
        length: int | None = None
        expects = False
        hosts = 0
        chunked = False
        websocket = False
        for name, value in self._head:
            if name == "content-length":
                length = int(value)  # llhttp checked that it is one number
            elif name == "expect":
                expects = value.lower() == "100-continue"
            elif name == "host":
                hosts += 1
            elif name == "transfer-encoding":
                chunked = True
            elif name == "upgrade":
                websocket = "websocket" in value.lower()
        self._in_head = False
        self._in_body = True
        if version != "1.1" and version != "1.0":
            self._fail(400, f"malformed HTTP: version {version}")
            raise _Stop
        if version == "1.1" and hosts != 1:
            self._fail(400, "malformed HTTP: an HTTP/1.1 request has exactly one host header")
            raise _Stop
        if length is None and not chunked:
            length = 0
        self.waiting_for_continue = expects and version == "1.1" and length != 0
        self._last = RequestHead(
            method,
            target,
            version,
            self._head,
            version == "1.1" and parser.should_keep_alive(),  # 1.0: one request, as h11 did
            length,
            self._size + len(method) + len(target),
            websocket and method == "GET" and length == 0,  # else an ordinary request
        )
        self._events.append(self._last)

    def on_body(self, body: bytes) -> None:
        self.waiting_for_continue = False
        self._events.append(body)

    def on_message_complete(self) -> None:
        self._in_body = False
        self.waiting_for_continue = False
        self._events.append(END)


# -- responses -------------------------------------------------------------------------------

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
_NO_BODY_STATUSES = frozenset({204, 304})
_TOKEN = re.compile(r"[-!#$%&'*+.^_`|~0-9a-zA-Z]+")
_VALUE = re.compile(r"([\x21-\x7e\x80-\xff]([\t\x20-\x7e\x80-\xff]*[\x21-\x7e\x80-\xff])?)?")
#: Header lines already checked and encoded: most responses repeat the same few.
_LINES: dict[tuple[str, str], bytes] = {}
_LINES_MAX = 4096
#: Headers the server writes itself.
_FRAMING = frozenset({"content-length", "connection", "transfer-encoding"})
CONTINUE: Final = b"HTTP/1.1 100 Continue\r\n\r\n"


def _line(name: str, value: str) -> bytes:
    line = _LINES.get((name, value))
    if line is None:
        if not _TOKEN.fullmatch(name):
            raise ValueError(f"invalid header name {name!r}")
        if not _VALUE.fullmatch(value):
            raise ValueError(f"invalid value for header {name!r}")
        line = f"{name}: {value}\r\n".encode("latin-1")
        if len(_LINES) >= _LINES_MAX:
            _LINES.clear()
        _LINES[(name, value)] = line
    return line


def encode_response(
    status: int, headers: Iterable[tuple[str, str]], body: bytes, *, head_only: bool, close: bool
) -> bytes:
    """A whole response: its head and, unless ``head_only`` (a reply to HEAD), its body.

    ``content-length``, ``connection`` and ``transfer-encoding`` of ``headers`` are ignored:
    the length is the body's, and ``close`` adds ``connection: close``. ``ValueError`` for a
    status or a header HTTP cannot carry."""
    if type(status) is not int or not 200 <= status <= 999:
        raise ValueError(f"invalid status {status!r}")
    parts = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b""))]
    parts.extend(_line(name, value) for name, value in headers if name not in _FRAMING)
    has_body = status not in _NO_BODY_STATUSES
    if has_body:
        parts.append(b"content-length: %d\r\n" % len(body))
    if close:
        parts.append(b"connection: close\r\n")
    parts.append(b"\r\n")
    if has_body and not head_only and body:
        parts.append(body)
    return b"".join(parts)
