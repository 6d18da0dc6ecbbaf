"""Malformed requests on a real socket (actorkeep/front/server.py with http11.py): valid
requests mutated byte by byte (flipped, inserted, deleted, cut short), sent whole, then the
client closes its side.

Properties, for every example: what comes back is a sequence of well-formed HTTP/1.1 responses
(or nothing), never a 500; a request refused before it reached an actor (400, 408, 413, 431,
505) creates no file; the host keeps answering new connections.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import httptools
import trio
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import actorkeep as ak
from actorkeep.front import serve_http

from .conftest import sqlite_files
from .test_server import FAST, app

REFUSED = frozenset({400, 408, 413, 431, 505})


@contextlib.contextmanager
def server_thread(data_dir: Path) -> Iterator[int]:
    """``serve_http`` in a thread of its own (a trio run), so that hypothesis drives it with
    blocking sockets; the port."""
    started = threading.Event()
    box: dict[str, object] = {}

    async def main() -> None:
        host = ak.Host(app, ak.FileStorage(data_dir))
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        stop = trio.Event()
        box.update(port=listeners[0].socket.getsockname()[1], stop=stop)
        box["token"] = trio.lowlevel.current_trio_token()
        limits = dataclasses.replace(FAST, max_connections=64)
        async with trio.open_nursery() as nursery:
            await nursery.start(
                functools.partial(serve_http, host, listeners, limits, until=stop.wait)
            )
            started.set()

    thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
    thread.start()
    try:
        assert started.wait(10), "the server did not start"
        yield int(box["port"])  # type: ignore[call-overload]
    finally:
        stop = box.get("stop")
        if isinstance(stop, trio.Event):
            trio.from_thread.run_sync(stop.set, trio_token=box["token"])  # type: ignore[arg-type]
        thread.join(15)


def exchange(port: int, data: bytes) -> bytes:
    """Send ``data``, close the sending side, read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        with contextlib.suppress(ConnectionError):
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        received = b""
        with contextlib.suppress(ConnectionError):
            while chunk := sock.recv(65536):
                received += chunk
    return received


class _Statuses:
    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.statuses: list[int] = []
        self.complete = 0

    def on_headers_complete(self) -> None:
        self.statuses.append(self.parser.get_status_code())

    def on_message_complete(self) -> None:
        self.complete += 1


def statuses(reply: bytes) -> list[int]:
    """The status of every final response in ``reply``, which must be nothing but whole
    responses (interim ``100 Continue`` ones among them)."""
    seen = _Statuses()
    if reply:
        seen.parser.feed_data(reply)
    assert seen.complete == len(seen.statuses), reply
    return [status for status in seen.statuses if status != 100]


def request(name: str, kind: str) -> bytes:
    if kind == "get":
        return b"GET /counter/%s/ HTTP/1.1\r\nhost: t\r\n\r\n" % name.encode()
    if kind == "rpc":
        body = b'{"by": 2}'
        return (
            b"POST /counter/%s/_rpc/incr HTTP/1.1\r\nhost: t\r\ncontent-type: application/json"
            b"\r\ncontent-length: %d\r\n\r\n%s" % (name.encode(), len(body), body)
        )
    if kind == "chunked":
        return (
            b"POST /counter/%s/echo HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n0\r\n\r\n" % name.encode()
        )
    return (  # expect
        b"POST /counter/%s/echo HTTP/1.1\r\nhost: t\r\nexpect: 100-continue\r\n"
        b"content-length: 4\r\n\r\nabcd" % name.encode()
    )


mutation = st.one_of(
    st.tuples(st.just("flip"), st.floats(0, 1), st.integers(0, 255)),
    st.tuples(st.just("insert"), st.floats(0, 1), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("delete"), st.floats(0, 1), st.integers(1, 8)),
    st.tuples(st.just("cut"), st.floats(0, 1), st.none()),
)


def mutate(data: bytes, changes: list[tuple[str, float, object]]) -> bytes:
    for kind, where, arg in changes:
        at = min(int(where * len(data)), max(len(data) - 1, 0))
        if kind == "flip" and data:
            data = data[:at] + bytes([arg]) + data[at + 1 :]  # type: ignore[list-item]
        elif kind == "insert":
            data = data[:at] + arg + data[at:]  # type: ignore[operator]
        elif kind == "delete":
            data = data[:at] + data[at + arg :]  # type: ignore[operator]
        elif kind == "cut":
            data = data[:at]
    return data


def test_mutated_requests_on_a_socket_get_clean_answers_and_refusals_create_nothing() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)
        with server_thread(data_dir) as port:
            counter = iter(range(1_000_000))

            @settings(
                max_examples=250,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            )
            @given(
                st.lists(
                    st.sampled_from(["get", "rpc", "chunked", "expect"]), min_size=1, max_size=3
                ),
                st.lists(mutation, min_size=1, max_size=4),
            )
            def check(kinds: list[str], changes: list[tuple[str, float, object]]) -> None:
                name = f"n{next(counter)}"  # a new actor each time: its file shows who ran
                wire = mutate(b"".join(request(name, k) for k in kinds), changes)
                before = set(sqlite_files(data_dir))
                got = statuses(exchange(port, wire))
                assert 500 not in got, (wire, got)
                event(f"statuses {sorted(set(got))}")
                created = set(sqlite_files(data_dir)) - before
                if all(status in REFUSED for status in got):
                    assert not created, (wire, got, created)
                assert statuses(exchange(port, request("health", "get"))) == [200]

            check()
