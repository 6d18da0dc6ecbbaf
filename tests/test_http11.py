"""The wire format of ``actorkeep serve`` (actorkeep/front/http11.py): the request reader on
httptools, checked against h11 as a reference parser, its limits, and the response writer."""

from __future__ import annotations

import itertools
from typing import Any

import h11
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actorkeep.front.http11 import (
    CLOSED,
    END,
    MAX_FEED,
    NEED_DATA,
    ProtocolError,
    RequestHead,
    RequestReader,
    encode_response,
)

Parsed = tuple[str, str, list[tuple[str, str]], bytes]


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` cut at the (sorted) offsets ``cuts``, without empty pieces."""
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds) if data[a:b]]


def read_all(reader: RequestReader, pieces: list[bytes]) -> list[Parsed]:
    """Every whole request the pieces make, as (method, target, headers, body)."""
    requests: list[Parsed] = []
    head: RequestHead | None = None
    body = b""
    for piece in [*pieces, b""]:
        reader.feed(piece)
        while (event := reader.next_event()) is not NEED_DATA:
            if isinstance(event, RequestHead):
                head, body = event, b""
            elif type(event) is bytes:
                body += event
            elif event is END:
                assert head is not None
                requests.append((head.method, head.target, head.headers, body))
            else:
                assert event is CLOSED
                return requests
    raise AssertionError("the reader never said the client closed")


def read_with_h11(data: bytes) -> list[Parsed]:
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(data)
    conn.receive_data(b"")
    requests: list[Parsed] = []
    method = target = ""
    headers: list[tuple[str, str]] = []
    body = b""
    while True:
        event: Any = conn.next_event()
        if isinstance(event, h11.Request):
            method, target = event.method.decode(), event.target.decode("latin-1")
            headers = [(k.decode(), v.decode("latin-1")) for k, v in event.headers]
            body = b""
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            requests.append((method, target, headers, body))
            conn.send(h11.Response(status_code=200, headers=[("content-length", "0")]))
            conn.send(h11.EndOfMessage())
            conn.start_next_cycle()
        elif isinstance(event, h11.ConnectionClosed):
            return requests
        else:
            raise AssertionError(f"unexpected {event!r}")


token = st.text("abcdefghijklmnopqrstuvwxyz-0123456789", min_size=1, max_size=12)
value = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=20)
target = st.builds(
    lambda parts, query: "/" + "/".join(parts) + (f"?{query}" if query else ""),
    st.lists(st.text("abcxyz019._~%-", min_size=1, max_size=8), max_size=4),
    st.text("a=b&c", max_size=8),
)


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    method = draw(st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]))
    fields = draw(
        st.lists(
            st.tuples(token, value).filter(
                lambda f: (
                    f[0] not in ("host", "content-length", "transfer-encoding", "expect")
                    and not f[0].startswith(("connection", "upgrade"))
                )
            ),
            max_size=5,
        )
    )
    body = draw(st.binary(max_size=300))
    chunked = bool(body) and draw(st.booleans())
    head = f"{method} {draw(target)} HTTP/1.1\r\nHost: t\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in fields)
    if chunked:
        cuts = sorted(draw(st.lists(st.integers(1, len(body)), max_size=3, unique=True)))
        framed = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in split(body, cuts)) + b"0\r\n\r\n"
        return (head + "Transfer-Encoding: chunked\r\n\r\n").encode() + framed
    if body or draw(st.booleans()):
        head += f"Content-Length: {len(body)}\r\n"
    return (head + "\r\n").encode() + body


@settings(max_examples=300, deadline=None)
@given(st.lists(requests(), min_size=1, max_size=4), st.data())
def test_pipelined_requests_read_in_any_pieces_as_h11_reads_them(
    batch: list[bytes], data: st.DataObject
) -> None:
    wire = b"".join(batch)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=8)))
    ours = read_all(RequestReader(16384), split(wire, cuts))
    assert ours == read_with_h11(wire)
    assert len(ours) == len(batch)


def test_a_head_growing_past_the_limit_is_refused_and_nothing_before_it_is() -> None:
    reader = RequestReader(1000)
    reader.feed(b"GET / HTTP/1.1\r\nhost: t\r\nx: ")
    fed = 0
    with pytest.raises(ProtocolError) as refused:
        while True:
            reader.feed(b"a" * 4096)
            fed += 4096
            assert reader.next_event() is NEED_DATA
    assert refused.value.status == 431
    assert 1000 < fed <= 1000 + MAX_FEED + 4096  # held at most one feed past the limit


def test_a_whole_batch_of_small_requests_is_not_taken_for_a_long_head() -> None:
    one = b"GET /c/a/ HTTP/1.1\r\nhost: t\r\n\r\n"
    batch = one * (MAX_FEED // len(one))
    tail = one[:20]
    reader = RequestReader(100)
    events = 0
    for piece in (batch + tail, one[20:] * 1):
        reader.feed(piece)
        while reader.next_event() is not NEED_DATA:
            events += 1
    assert events == 2 * (MAX_FEED // len(one) + 1)


def test_a_head_is_measured_when_whole() -> None:
    wire = b"GET /x HTTP/1.1\r\nhost: t\r\nabc: de \r\n\r\n"
    reader = RequestReader(1 << 20)
    reader.feed(wire)
    head = reader.next_event()
    assert isinstance(head, RequestHead)
    assert head.size == len(wire)
    assert head.headers == [("host", "t"), ("abc", "de")]  # values without their blanks


@pytest.mark.parametrize(
    ("wire", "status"),
    [
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505),
        (b"GET / HTTP/1.2\r\nhost: t\r\n\r\n", 505),
        (b"GET /\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nhost: a\r\nhost: b\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nhost: t\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nhost: t\r\n folded\r\n\r\n", 400),
        (b"\x00\x01\x02\r\n\r\n", 400),
    ],
)
def test_what_http_1_1_does_not_allow_is_refused_with_its_status(wire: bytes, status: int) -> None:
    reader = RequestReader(16384)
    reader.feed(wire)
    with pytest.raises(ProtocolError) as refused:
        while reader.next_event() is not NEED_DATA:
            pass
    assert refused.value.status == status


def test_requests_before_a_malformed_one_are_read_first() -> None:
    reader = RequestReader(16384)
    reader.feed(b"GET /a HTTP/1.1\r\nhost: t\r\n\r\nGARBAGE\r\n\r\n")
    assert isinstance(reader.next_event(), RequestHead)
    assert reader.next_event() is END
    with pytest.raises(ProtocolError):
        reader.next_event()


def test_a_client_that_closes_mid_request_is_an_error_and_between_requests_is_not() -> None:
    reader = RequestReader(16384)
    reader.feed(b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: 5\r\n\r\nab")
    reader.feed(b"")
    assert isinstance(reader.next_event(), RequestHead)
    assert reader.next_event() == b"ab"
    with pytest.raises(ProtocolError):
        reader.next_event()
    idle = RequestReader(16384)
    idle.feed(b"")
    assert idle.next_event() is CLOSED


def test_an_upgrade_is_not_served_the_request_is_read_whole_and_the_next_one_too() -> None:
    wire = (
        b"POST /a HTTP/1.1\r\nhost: t\r\nconnection: upgrade\r\nupgrade: websocket\r\n"
        b"content-length: 3\r\n\r\nabcGET /b HTTP/1.1\r\nhost: t\r\n\r\n"
    )
    for cut in range(1, len(wire)):
        requests = read_all(RequestReader(16384), [wire[:cut], wire[cut:]])
        assert [(m, t, b) for m, t, _, b in requests] == [
            ("POST", "/a", b"abc"),
            ("GET", "/b", b""),
        ]
    chunked = RequestReader(16384)
    chunked.feed(
        b"POST /a HTTP/1.1\r\nhost: t\r\nconnection: upgrade\r\nupgrade: x\r\n"
        b"transfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
    )
    assert isinstance(chunked.next_event(), RequestHead)
    with pytest.raises(ProtocolError):
        chunked.next_event()


def test_a_websocket_upgrade_leaves_what_follows_its_head_to_the_socket() -> None:
    wire = (
        b"GET /ws HTTP/1.1\r\nhost: t\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n"
        b"\x81\x85frameGET /not-http HTTP/1.1\r\n\r\n"
    )
    for cut in range(1, len(wire)):
        reader = RequestReader(16384)
        reader.feed(wire[:cut])
        reader.feed(wire[cut:])
        head = reader.next_event()
        assert isinstance(head, RequestHead) and head.websocket and head.target == "/ws"
        assert reader.upgraded is not None
        # What came after the head in the feed that finished it; later feeds are the socket's.
        head_end = wire.index(b"\r\n\r\n") + 4
        assert reader.upgraded == (wire[head_end:cut] if cut >= head_end else wire[head_end:])


def test_100_continue_is_wanted_until_the_body_begins() -> None:
    reader = RequestReader(16384)
    reader.feed(b"POST / HTTP/1.1\r\nhost: t\r\nexpect: 100-continue\r\ncontent-length: 2\r\n\r\n")
    assert reader.waiting_for_continue
    reader.feed(b"a")
    assert not reader.waiting_for_continue
    http10 = RequestReader(16384)
    http10.feed(b"POST / HTTP/1.0\r\nexpect: 100-continue\r\ncontent-length: 2\r\n\r\n")
    assert not http10.waiting_for_continue


def test_responses_are_framed_here_and_what_http_cannot_carry_is_refused() -> None:
    ok = encode_response(
        200, [("content-type", "text/plain"), ("content-length", "99")], b"hi", head_only=False,
        close=True,
    )  # fmt: skip
    assert ok == (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 2\r\n"
        b"connection: close\r\n\r\nhi"
    )
    head = encode_response(200, [], b"hi", head_only=True, close=False)
    assert head == b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"
    assert encode_response(204, [], b"", head_only=False, close=False) == (
        b"HTTP/1.1 204 No Content\r\n\r\n"
    )
    assert encode_response(599, [], b"", head_only=False, close=False).startswith(
        b"HTTP/1.1 599 \r\n"
    )
    for status in (99, 100, 199, 1000, "200", True):
        with pytest.raises(ValueError):
            encode_response(status, [], b"", head_only=False, close=False)  # type: ignore[arg-type]
    for name, val in [("x", "a\r\nb"), ("x", "a\x00"), ("x y", "v"), ("", "v"), ("x", " v")]:
        with pytest.raises(ValueError):
            encode_response(200, [(name, val)], b"", head_only=False, close=False)
    with pytest.raises(ValueError):
        encode_response(200, [("x", "caf\u00e9\u20ac")], b"", head_only=False, close=False)


def test_http_1_0_closes_after_one_request_and_1_1_keeps_alive_unless_told() -> None:
    for wire, keeps in [
        (b"GET / HTTP/1.0\r\nconnection: keep-alive\r\n\r\n", False),
        (b"GET / HTTP/1.1\r\nhost: t\r\n\r\n", True),
        (b"GET / HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n", False),
    ]:
        reader = RequestReader(16384)
        reader.feed(wire)
        head = reader.next_event()
        assert isinstance(head, RequestHead)
        assert head.keep_alive is keeps, wire
