"""The hosts' internal port (actorkeep/cluster/peers.py, peerwire.py) over real loopback
sockets: only a host that knows the cluster's secret is heard, a frame changed, replayed or
reflected closes the connection before anything runs, a peer's bad request is refused without
disturbing the others, and errors cross with their kind (the owner moved, a timeout, an outcome
unknown)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import trio
import trio.testing

from actorkeep import codec
from actorkeep.cluster import peer_requests, peerwire
from actorkeep.cluster import peers as peers_module
from actorkeep.cluster.peer_requests import UNKNOWN_REQUEST, Elsewhere
from actorkeep.cluster.peers import (
    Peers,
    Unreachable,
    serve_connection,
    serve_peers,
)
from actorkeep.errors import (
    BadRequest,
    CallTimeout,
    Forbidden,
    OutcomeUnknown,
    Overloaded,
    RemoteError,
)
from actorkeep.http import Headers, Request, Response, ValueReply
from actorkeep.routing import Operation
from actorkeep.wire import kv as kv_wire

SECRET = b"s" * 32


class FakeLocal:
    """Owns every actor but ``gone/*``; records what it ran."""

    def __init__(self) -> None:
        self.ran: list[tuple[Any, ...]] = []
        self.release = trio.Event()
        self.reached = trio.Event()

    async def deliver_local(
        self,
        class_name: str,
        name: str,
        request: Request,
        chain: tuple[str, ...],
        timeout: float | None,
    ) -> Response:
        self.ran.append(("http", class_name, name, request.caller, chain, dict(request.headers)))
        return Response(201, {"x-answer": "yes"}, request.body[::-1])

    async def call_op_local(
        self,
        caller: str,
        chain: tuple[str, ...],
        address: str,
        op: Operation,
        values: Mapping[str, Any],
        timeout: float | None,
    ) -> Response:
        self.ran.append(("op", caller, chain, address, op, dict(values), timeout))
        if values.get("expect") is not None:
            return Response(409, {"content-type": "application/json"}, b'{"no": 1}')
        if values.get("huge"):  # past msgpack's integers
            return ValueReply({"version": 1 << 64})
        return ValueReply({"version": 7, "expires_at": None})

    async def call_rpc_local(
        self,
        caller: str,
        chain: tuple[str, ...],
        address: str,
        method: str,
        args: dict[str, Any],
        timeout: float | None,
    ) -> Any:
        self.ran.append(("rpc", caller, chain, address, method, args, timeout))
        self.reached.set()
        if address.startswith("gone/"):
            raise Elsewhere(address)
        if method == "forbid":
            raise Forbidden("not you")
        if method == "busy":
            raise Overloaded("busy", retry_after=2.5)
        if method == "wait":
            await self.release.wait()
        if method == "crash":
            raise ZeroDivisionError("a bug")
        if method == "deep":  # packs alone, not inside its reply
            deep: Any = 1
            for _ in range(1024):
                deep = [deep]
            return deep
        if method == "set":  # not msgpack
            return {1, 2}
        return {"echo": args, "caller": caller}


class Recording(trio.abc.Stream):
    """A stream that keeps what was sent on it (and with ``keep_received``, what it received),
    and can change one byte of a later send."""

    def __init__(self, inner: trio.abc.Stream, keep_received: bool = False) -> None:
        self.inner = inner
        self.sent: list[bytes] = []
        self.received: bytearray | None = bytearray() if keep_received else None
        self.flip_next = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        data = bytes(data)
        if self.flip_next:
            self.flip_next = False
            data = data[:-40] + bytes([data[-40] ^ 1]) + data[-39:]
        self.sent.append(data)
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        data = await self.inner.receive_some(max_bytes)
        if self.received is not None:
            self.received += data
        return data

    async def send_eof(self) -> None:
        pass

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest.fixture
async def port(nursery: trio.Nursery) -> tuple[int, FakeLocal]:
    local = FakeLocal()
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    await nursery.start(serve_peers, listeners, SECRET, local)
    return listeners[0].socket.getsockname()[1], local


async def peers(nursery: trio.Nursery, secret: bytes = SECRET) -> Peers:
    p = Peers(secret)
    await nursery.start(p.run)
    return p


async def test_calls_and_requests_cross_with_caller_and_chain(
    port: tuple[int, FakeLocal], nursery: trio.Nursery
) -> None:
    number, local = port
    p = await peers(nursery)
    peer = f"127.0.0.1:{number}"
    got = await p.call_rpc(peer, "a/x", ("a/x",), "b/y", "m", {"k": [1, b"2"]}, 5.0)
    assert got == {"echo": {"k": [1, b"2"]}, "caller": "a/x"}
    assert local.ran[-1] == ("rpc", "a/x", ("a/x",), "b/y", "m", {"k": [1, b"2"]}, 5.0)
    req = Request("POST", "/p", {"q": "1"}, Headers({"x-actorkeep-caller": "a/x"}), b"abc", "a/x")
    resp = await p.deliver(peer, "b", "y", req, ("a/x",), None)
    assert (resp.status, resp.headers["x-answer"], resp.body) == (201, "yes", b"cba")
    ran: tuple[Any, ...] = local.ran[-1]
    assert ran == ("http", "b", "y", "a/x", ("a/x",), {"x-actorkeep-caller": "a/x"})
    # Many calls at once share one connection, each answered on its own.
    async with trio.open_nursery() as many:
        for i in range(50):
            many.start_soon(p.call_rpc, peer, "a/x", (), f"b/{i}", "m", {}, None)
    assert len(local.ran) == 52


async def test_errors_cross_with_their_kind(
    port: tuple[int, FakeLocal], nursery: trio.Nursery
) -> None:
    number, _ = port
    p = await peers(nursery)
    peer = f"127.0.0.1:{number}"
    with pytest.raises(Elsewhere):
        await p.call_rpc(peer, "a/x", (), "gone/y", "m", {}, None)
    with pytest.raises(Forbidden):
        await p.call_rpc(peer, "a/x", (), "b/y", "forbid", {}, None)
    with pytest.raises(Overloaded) as busy:
        await p.call_rpc(peer, "a/x", (), "b/y", "busy", {}, None)
    assert busy.value.retry_after == 2.5 and not isinstance(busy.value, Elsewhere)
    with pytest.raises(RemoteError) as crash:  # a bug there: no internals cross
        await p.call_rpc(peer, "a/x", (), "b/y", "crash", {}, None)
    assert (crash.value.status, crash.value.message) == (500, "the owner host failed the call")
    with pytest.raises(CallTimeout):  # the callee never answers: the caller's deadline
        await p.call_rpc(peer, "a/x", (), "b/y", "wait", {}, 0.5)
    with pytest.raises(Unreachable):  # nothing listens there: nothing was sent
        await p.call_rpc("127.0.0.1:1", "a/x", (), "b/y", "m", {}, None)


async def call_in_flight(p: Peers, peer: str, local: FakeLocal, nursery: trio.Nursery) -> list[Any]:
    """A call that waits on the owner until ``local.release``; its result lands in the list."""
    answered: list[Any] = []

    async def call() -> None:
        answered.append(await p.call_rpc(peer, "a/x", (), "b/y", "wait", {}, None))

    nursery.start_soon(call)
    await local.reached.wait()
    return answered


async def connection_goes_on(p: Peers, peer: str, local: FakeLocal, answered: list[Any]) -> None:
    """The call in flight is answered once released, and the next call is too."""
    local.release.set()
    assert (await p.call_rpc(peer, "a/x", (), "b/y", "m", {}, None))["caller"] == "a/x"
    await trio.testing.wait_all_tasks_blocked()  # both replies may wake their callers at once
    assert answered and answered[0]["caller"] == "a/x"


async def test_a_reply_that_cannot_be_sent_fails_its_call_alone(
    port: tuple[int, FakeLocal], nursery: trio.Nursery
) -> None:
    """A result the owner cannot pack into its reply (too deeply nested, or not msgpack):
    that call fails with a 500, and the connection and the calls on it go on."""
    number, local = port
    p = await peers(nursery)
    peer = f"127.0.0.1:{number}"
    answered = await call_in_flight(p, peer, local, nursery)
    for method in ("deep", "set"):
        with pytest.raises(RemoteError) as failed:
            await p.call_rpc(peer, "a/x", (), "b/y", method, {}, None)
        assert failed.value.status == 500, failed.value
    with pytest.raises(RemoteError) as failed:
        await p.call_op(peer, "a/x", (), "b/y", kv_wire.PUT, {"huge": True}, None)
    assert failed.value.status == 500, failed.value
    await connection_goes_on(p, peer, local, answered)


async def test_arguments_the_callee_could_not_take_are_refused_before_they_are_sent(
    port: tuple[int, FakeLocal], nursery: trio.Nursery
) -> None:
    """Arguments that would fail the callee's copy on the caller's own host (keys msgpack's
    decoder refuses, values it cannot carry) raise on the caller as they would there: nothing
    is sent, and the connection and the calls on it go on."""
    number, local = port
    p = await peers(nursery)
    peer = f"127.0.0.1:{number}"
    answered = await call_in_flight(p, peer, local, nursery)
    for args in ({"x": {1: 2}}, {"x": {(1, 2): 3}}, {"x": 1 << 64}, {"x": {1, 2}}):
        with pytest.raises((ValueError, TypeError, OverflowError)):
            await p.call_rpc(peer, "a/x", (), "b/y", "m", args, None)
    assert [r[4] for r in local.ran] == ["wait"]  # nothing else reached the owner
    await connection_goes_on(p, peer, local, answered)


async def test_a_peers_bad_requests_are_refused_and_the_connection_goes_on(
    port: tuple[int, FakeLocal], nursery: trio.Nursery
) -> None:
    number, local = port
    p = await peers(nursery)
    peer = f"127.0.0.1:{number}"
    bad: list[Any]
    for bad in (
        ["rpc", "a/x", "not a list", "b/y", "m", {}, None],
        ["rpc", "a/x", [], "no-slash", "m", {}, None],
        ["rpc", "a/x", [], "b/y", "m", [], None],
        ["rpc", "a/x", [], "b/y", "m", {}, -1],
        ["http", "b", "y", "GET", "/", {}, {"h": 1}, b"", None, [], None],
        ["http", "b", "y", "GET", "/", {}, {}, "text", None, [], None],
        ["op", "a/x", [], "b/y", kv_wire.PUT.path, [], None],
        ["op", "a/x", [], "no-slash", kv_wire.PUT.path, {}, None],
        ["op", 1, [], "b/y", kv_wire.PUT.path, {}, None],
        ["op", "a/x", [], "b/y", 1, {}, None],
        ["nope"],
    ):
        with pytest.raises(BadRequest):
            await p.call(peer, bad, None, "b/y")
    assert local.ran == []
    assert (await p.call_rpc(peer, "a/x", (), "b/y", "m", {}, None))["caller"] == "a/x"


class _Unregistered:
    """An operation this process never declared (``actorkeep.wire.operation_at`` knows none)."""

    path = "/not-declared/v1/op"

    def checked(self, values: Mapping[str, Any], address: str) -> Any:
        return dict(values)


async def test_an_operation_crosses_with_its_frame_and_reply_as_values(
    port: tuple[int, FakeLocal], nursery: trio.Nursery
) -> None:
    number, local = port
    p = await peers(nursery)
    peer = f"127.0.0.1:{number}"
    frame = {"key": b"k", "value": b"v", "expect": None, "ttl": None, "local": False}
    resp = await p.call_op(peer, "a/x", ("a/x",), "kv/0", kv_wire.PUT, frame, 5.0)
    assert type(resp) is ValueReply and resp.value == {"version": 7, "expires_at": None}
    assert kv_wire.PUT.result(resp) == {"version": 7, "expires_at": None}
    # The owner runs the operation its own process declared at that path, with the values.
    assert local.ran[-1] == ("op", "a/x", ("a/x",), "kv/0", kv_wire.PUT, frame, 5.0)
    # A reply the handler gave as a response (a conflict) crosses as one.
    refused = await p.call_op(peer, "a/x", (), "kv/0", kv_wire.PUT, {**frame, "expect": 3}, None)
    assert type(refused) is Response and (refused.status, refused.body) == (409, b'{"no": 1}')
    # An operation the owner does not declare goes to its route, as an outside request would.
    routed = await p.call_op(peer, "a/x", (), "b/y", _Unregistered(), {"n": 1}, None)
    assert (routed.status, routed.body) == (201, codec.pack({"n": 1})[::-1])
    ran: tuple[Any, ...] = local.ran[-1]
    assert ran[:4] == ("http", "b", "y", "a/x")


async def test_a_host_from_before_operations_gets_them_as_requests_to_their_routes(
    port: tuple[int, FakeLocal], nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    number, local = port
    newer = peer_requests.run_request
    refused: list[str] = []

    async def older(here: Any, msg: list[Any]) -> Any:  # what a host from before "op" runs
        if msg[1] == "op":
            refused.append(msg[5])
            raise ValueError(UNKNOWN_REQUEST)
        return await newer(here, msg)

    monkeypatch.setattr(peers_module, "run_request", older)
    p = await peers(nursery)
    peer = f"127.0.0.1:{number}"
    frame = {"key": b"k", "value": b"v"}
    for _ in range(2):
        resp = await p.call_op(peer, "a/x", ("a/x",), "kv/0", kv_wire.PUT, frame, None)
        assert (resp.status, resp.body) == (201, codec.pack(frame)[::-1])
    assert refused == [kv_wire.PUT.path]  # asked once; then straight to the route
    http = [r for r in local.ran if r[0] == "http"]
    assert len(http) == 2 and len(local.ran) == 2
    _, class_name, name, caller, chain, headers = http[0]
    assert (class_name, name, caller, chain) == ("kv", "0", "a/x", ("a/x",))
    assert headers["content-type"] == codec.MSGPACK and headers["x-actorkeep-caller"] == "a/x"


async def test_only_a_host_with_the_secret_is_heard(
    port: tuple[int, FakeLocal], nursery: trio.Nursery
) -> None:
    number, local = port
    stranger = await peers(nursery, secret=b"t" * 32)
    with pytest.raises(Unreachable, match="refused"):
        await stranger.call_rpc(f"127.0.0.1:{number}", "a/x", (), "b/y", "m", {}, None)
    # A client that speaks no handshake at all is closed, and nothing ran.
    stream = await trio.open_tcp_stream("127.0.0.1", number)
    await stream.send_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert await stream.receive_some() == b""
    assert local.ran == []


async def test_a_changed_or_replayed_frame_closes_the_connection_before_anything_runs(
    port: tuple[int, FakeLocal],
) -> None:
    number, local = port
    request = [0, "rpc", "a/x", [], "b/y", "m", {}, None]

    async def connect() -> tuple[Recording, peerwire.Channel]:
        raw = Recording(await trio.open_tcp_stream("127.0.0.1", number))
        return raw, await peerwire.dial(raw, SECRET)

    raw, channel = await connect()
    await channel.send(request)
    assert (await channel.receive())[1] == 0 and len(local.ran) == 1
    captured = raw.sent[-1]
    # The same frame again on the same connection: its number is past.
    await raw.send_all(captured)
    with pytest.raises(trio.EndOfChannel):
        await channel.receive()
    # On a new connection: another session key.
    raw, channel = await connect()
    await raw.send_all(captured)
    with pytest.raises(trio.EndOfChannel):
        await channel.receive()
    # One bit changed in the body.
    raw, channel = await connect()
    raw.flip_next = True
    await channel.send(request)
    with pytest.raises(trio.EndOfChannel):
        await channel.receive()
    assert len(local.ran) == 1


async def test_a_connection_lost_after_the_send_means_the_outcome_is_unknown(
    port: tuple[int, FakeLocal], nursery: trio.Nursery
) -> None:
    number, local = port
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    relay_port = listeners[0].socket.getsockname()[1]
    cut = trio.Event()

    async def relay(client: trio.SocketStream) -> None:
        """Pass bytes to the real port until ``cut`` is set, then drop both sides."""
        server = await trio.open_tcp_stream("127.0.0.1", number)
        async with client, server, trio.open_nursery() as pipe:

            async def pump(a: trio.abc.Stream, b: trio.abc.Stream) -> None:
                while data := await a.receive_some():
                    await b.send_all(data)

            pipe.start_soon(pump, client, server)
            pipe.start_soon(pump, server, client)
            await cut.wait()
            pipe.cancel_scope.cancel()

    await nursery.start(trio.serve_listeners, relay, listeners)
    p = await peers(nursery)

    async def cut_soon() -> None:
        await local.reached.wait()
        cut.set()

    nursery.start_soon(cut_soon)
    with pytest.raises(OutcomeUnknown):
        await p.call_rpc(f"127.0.0.1:{relay_port}", "a/x", (), "b/y", "wait", {}, None)
    assert local.ran  # it did reach the owner


async def test_a_call_cancelled_mid_write_leaves_no_half_frame_behind(
    port: tuple[int, FakeLocal], nursery: trio.Nursery
) -> None:
    """A large call whose caller is cancelled while its frame is half written: the connection
    is closed (the rest of the frame would be read as the next one), and the next call dials
    again and is answered."""
    number, local = port
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    relay_port = listeners[0].socket.getsockname()[1]
    stalled = trio.Event()  # the first connection stops passing bytes on once this is set
    connections = 0

    async def relay(client: trio.SocketStream) -> None:
        nonlocal connections
        connections += 1
        first = connections == 1
        server = await trio.open_tcp_stream("127.0.0.1", number)
        async with client, server, trio.open_nursery() as pipe:

            async def pump(a: trio.abc.Stream, b: trio.abc.Stream, stall: bool) -> None:
                while data := await a.receive_some():
                    if stall and stalled.is_set():
                        await trio.sleep_forever()
                    await b.send_all(data)

            pipe.start_soon(pump, client, server, first)
            pipe.start_soon(pump, server, client, False)

    await nursery.start(trio.serve_listeners, relay, listeners)
    p = await peers(nursery)
    peer = f"127.0.0.1:{relay_port}"
    assert (await p.call_rpc(peer, "a/x", (), "b/y", "m", {}, None))["caller"] == "a/x"
    stalled.set()
    with trio.move_on_after(1.0) as scope:
        await p.call_rpc(peer, "a/x", (), "b/y", "m", {"big": b"x" * (32 << 20)}, None)
    assert scope.cancelled_caught
    with trio.fail_after(10):  # a connection left with half a frame in it answers nothing
        got = await p.call_rpc(peer, "a/x", (), "b/y", "m", {"n": 1}, None)
    assert got == {"echo": {"n": 1}, "caller": "a/x"} and connections == 2
    assert all(ran[5] != {"big": b"x" * (32 << 20)} for ran in local.ran)


async def test_a_dialer_that_hangs_up_before_its_answer_leaves_no_error_behind() -> None:
    """The answer is ready after the dialer closed its end: the send fails, and nothing of it
    escapes the connection's handler (it used to, and took the host down with it)."""

    class Slow(FakeLocal):
        async def call_rpc_local(self, *args: Any) -> Any:
            await trio.sleep(0.1)
            return "ok"

    near, far = trio.testing.memory_stream_pair()

    async def dialer() -> None:
        channel = await peerwire.dial(near, SECRET)
        await channel.send([1, "rpc", "a/x", [], "b/y", "m", {}, 5.0])
        await near.receive_stream.aclose()  # gone before the answer comes

    async with trio.open_nursery() as nursery:
        nursery.start_soon(dialer)
        with trio.fail_after(5):
            await serve_connection(far, SECRET, Slow())  # returns, raises nothing


class AnswererCount(trio.abc.Instrument):
    """Counts the tasks that answer peers' requests: started, and ended."""

    def __init__(self) -> None:
        self.spawned = 0
        self.exited = 0

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.spawned += task.name.endswith("answerer")

    def task_exited(self, task: trio.lowlevel.Task) -> None:
        self.exited += task.name.endswith("answerer")


async def test_a_task_that_answered_takes_the_next_request_but_never_two_at_once() -> None:
    """Requests one after another are answered by one task; a request that arrives while that
    task waits on its event gets a task of its own at once (it never waits behind another);
    past ``IDLE_ANSWERERS`` the tasks that answered end; and the ones waiting for a request end
    with the connection."""
    local = FakeLocal()
    count = AnswererCount()
    near, far = trio.testing.memory_stream_pair()
    trio.lowlevel.add_instrument(count)
    try:
        with trio.fail_after(30):  # a task left waiting would hang the nursery
            async with trio.open_nursery() as nursery:
                nursery.start_soon(serve_connection, far, SECRET, local)
                channel = await peerwire.dial(near, SECRET)
                for i in range(20):
                    await channel.send([i, "rpc", "a/x", [], "b/y", "m", {}, None])
                    assert (await channel.receive())[:2] == [i, 0]
                assert count.spawned == 1
                await channel.send([20, "rpc", "a/x", [], "b/y", "wait", {}, None])
                await local.reached.wait()  # the one task waits on this event
                await channel.send([21, "rpc", "a/x", [], "b/y", "m", {}, None])
                with trio.fail_after(5):
                    assert (await channel.receive())[:2] == [21, 0]
                assert count.spawned == 2
                local.release.set()
                assert (await channel.receive())[:2] == [20, 0]
                many = peers_module.IDLE_ANSWERERS + 10
                local.release = trio.Event()
                for i in range(many):
                    await channel.send([100 + i, "rpc", "a/x", [], "b/y", "wait", {}, None])
                await trio.testing.wait_all_tasks_blocked()  # each waits on its event
                assert len([r for r in local.ran if r[4] == "wait"]) == many + 1
                local.release.set()
                replies = [await channel.receive() for _ in range(many)]
                assert sorted(r[0] for r in replies) == list(range(100, 100 + many))
                await trio.testing.wait_all_tasks_blocked()
                assert count.spawned - count.exited == peers_module.IDLE_ANSWERERS
                await near.aclose()  # the dialer hangs up: the waiting tasks end with it
            assert count.spawned == count.exited
    finally:
        trio.lowlevel.remove_instrument(count)


async def test_a_caller_cancelled_while_it_waits_leaves_the_connection_working(
    port: tuple[int, FakeLocal], nursery: trio.Nursery
) -> None:
    """The caller gives up (cancelled) while the owner runs its event: the late reply finds
    nobody waiting and is dropped, and the next calls on the connection are answered."""
    number, local = port
    p = await peers(nursery)
    peer = f"127.0.0.1:{number}"
    with trio.move_on_after(10) as scope:

        async def cancel_once_reached() -> None:
            await local.reached.wait()
            scope.cancel()

        nursery.start_soon(cancel_once_reached)
        await p.call_rpc(peer, "a/x", (), "b/y", "wait", {}, None)
    assert scope.cancelled_caught
    local.release.set()
    for i in range(3):
        assert (await p.call_rpc(peer, "a/x", (), "b/y", "m", {"i": i}, None))["echo"] == {"i": i}
