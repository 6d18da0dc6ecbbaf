"""Batches on the hosts' internal connections (actorkeep/cluster/peerwire.py, peers.py): the
messages queued while a write is in progress go in one signed frame once the other side has
said it reads them, in order and within ``MAX_FRAME``; a host from before batches gets one
message a frame."""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.testing

from actorkeep import codec
from actorkeep.cluster import peers as peers_module
from actorkeep.cluster import peerwire
from actorkeep.cluster.peer_requests import UNKNOWN_REQUEST
from actorkeep.cluster.peers import Peers
from tests.test_cluster_peers import SECRET, FakeLocal, Recording
from tests.test_cluster_peers import port as port  # the fixture

CALLS = 40


async def connected() -> tuple[peerwire.Channel, peerwire.Channel, Recording]:
    """A dialer's and a listener's channel over a loopback pair of sockets, and what the
    dialer's side sent on it."""
    near, far = trio.socket.socketpair()
    sent = Recording(trio.SocketStream(near))
    ends: list[peerwire.Channel] = []
    async with trio.open_nursery() as nursery:

        async def accept() -> None:
            ends.append(await peerwire.accept(trio.SocketStream(far), SECRET))

        nursery.start_soon(accept)
        dialer = await peerwire.dial(sent, SECRET)
    return dialer, ends[0], sent


async def send_together(channel: peerwire.Channel, values: list[Any]) -> list[Any]:
    """Send ``values`` from as many tasks at once; the order they were queued in."""
    queued: list[Any] = []

    async def one(value: Any) -> None:
        queued.append(value)  # send() queues before its first wait
        await channel.send(value)

    async with trio.open_nursery() as nursery:
        for value in values:
            nursery.start_soon(one, value)
    return queued


async def receive(channel: peerwire.Channel, n: int) -> list[Any]:
    return [await channel.receive() for _ in range(n)]


def bodies(data: bytes) -> list[bytes]:
    """The bodies of the frames in ``data`` (a side's bytes after its handshake)."""
    found, at = [], 0
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        found.append(data[at + 4 : at + 4 + length])
        at += 4 + length + peerwire.MAC
    return found


def frames(data: bytes) -> list[Any]:
    """The values of the frames in ``data``."""
    return [codec.unpack(body) for body in bodies(data)]


def is_batch(value: Any) -> bool:
    return type(value) is list and bool(value) and type(value[0]) is list


async def test_messages_sent_together_go_in_one_frame_once_the_other_side_reads_batches() -> None:
    dialer, listener, recorded = await connected()
    messages = [[i, "rpc", "x" * i] for i in range(CALLS)]
    queued = await send_together(dialer, messages)
    assert await receive(listener, CALLS) == queued
    assert frames(b"".join(recorded.sent[2:])) == queued  # not asked yet: a frame each

    dialer.batches = True
    recorded.sent[2:] = []
    queued = await send_together(dialer, messages)
    assert await receive(listener, CALLS) == queued  # in the order queued
    assert frames(b"".join(recorded.sent[2:])) == [queued]  # one frame for all of them
    # A lone message is a frame of its own, as before.
    recorded.sent[2:] = []
    await dialer.send([99, "rpc"])
    assert await listener.receive() == [99, "rpc"]
    assert frames(b"".join(recorded.sent[2:])) == [[99, "rpc"]]


async def test_a_batch_stays_within_the_largest_frame(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peerwire, "MAX_FRAME", 300)
    dialer, listener, recorded = await connected()
    dialer.batches = True
    messages = [[i, "rpc", "x" * 42] for i in range(CALLS)]
    assert {len(codec.pack(m)) for m in messages} == {50}
    queued = await send_together(dialer, messages)
    assert await receive(listener, CALLS) == queued
    lengths = [len(b) for b in bodies(b"".join(recorded.sent[2:]))]  # after the handshake
    # Six messages (300 bytes) and their array's header would pass 300: five go together.
    assert lengths == [5 * 50 + 1] * (CALLS // 5) == [251] * 8


async def test_a_message_as_deep_as_a_frame_holds_crosses_in_a_batch() -> None:
    """A batch's messages are read one by one: the batch adds no level of nesting to what the
    decoder allows a message."""

    def message(depth: int) -> list[Any]:
        value: Any = 1
        for _ in range(depth):
            value = [value]
        return [0, "rpc", {"args": value}]

    depth = 1000
    while True:  # the deepest message that a frame of its own carries
        try:
            codec.unpack(codec.pack(message(depth + 1)))
        except ValueError:
            break
        depth += 1
    dialer, listener, recorded = await connected()
    dialer.batches = True
    await send_together(dialer, [message(depth), message(depth)])
    got = await receive(listener, 2)
    assert [codec.pack(m) for m in got] == [codec.pack(message(depth))] * 2
    assert len(bodies(b"".join(recorded.sent[2:]))) == 1  # the two went as one batch


async def test_a_batch_of_the_wrong_shape_closes_the_connection() -> None:
    dialer, listener, _ = await connected()
    await dialer.send([[1, "rpc"], 5])  # signed, but a batch whose second item is no message
    with pytest.raises(peerwire.PeerRefused, match="batch"):
        await listener.receive()


async def test_hosts_send_their_calls_and_answers_in_batches(
    port: tuple[int, FakeLocal],
    nursery: trio.Nursery,
) -> None:
    number, _ = port
    p, streams = await recorded_peers(nursery, keep_received=True)
    peer = f"127.0.0.1:{number}"
    await p.call_rpc(peer, "a/x", (), "b/y", "m", {}, 5.0)  # the link, asked
    got: list[Any] = []

    async def call(i: int) -> None:
        got.append(await p.call_rpc(peer, "a/x", (), "b/y", "m", {"i": i}, 5.0))

    async with trio.open_nursery() as calls:
        for i in range(CALLS):
            calls.start_soon(call, i)
    assert sorted(g["echo"]["i"] for g in got) == list(range(CALLS))
    (stream,) = streams
    sent = frames(b"".join(stream.sent[2:]))  # after MAGIC + nonce, and the proof
    assert stream.received is not None
    received = frames(bytes(stream.received[peerwire.NONCE + peerwire.MAC :]))
    assert sent[0][1] == "batches" or sent[1][1] == "batches"
    assert any(is_batch(v) for v in sent) and any(is_batch(v) for v in received)


async def test_a_host_from_before_batches_gets_one_message_a_frame(nursery: trio.Nursery) -> None:
    asked: list[Any] = []

    async def older(stream: trio.SocketStream) -> None:  # what a host from before batches runs
        channel = await peerwire.accept(stream, SECRET)
        async with trio.open_nursery() as answers:
            while True:
                msg = await channel.receive()
                assert type(msg[0]) is int  # it would close the connection
                if msg[1] == "batches":
                    asked.append(msg)
                    reply = [msg[0], 1, ["remote", 400, "BadRequest", UNKNOWN_REQUEST, None]]
                else:
                    reply = [msg[0], 0, {"echo": msg[6]}]
                answers.start_soon(channel.send, reply)

    peer = await listening(nursery, older)
    p, streams = await recorded_peers(nursery)
    await p.call_rpc(peer, "a/x", (), "b/y", "m", {}, 5.0)
    for _ in range(3):
        await calls_together(p, peer)
    assert len(asked) == 1 and len(streams) == 1
    sent = frames(b"".join(streams[0].sent[2:]))
    assert len(sent) == 1 + 1 + 3 * CALLS and not any(is_batch(v) for v in sent)


async def test_a_question_about_batches_not_answered_in_time_is_asked_again(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listener that leaves the first question unanswered (busy, say) is asked again, and
    the connection batches once it answers."""
    monkeypatch.setattr(peers_module, "CONNECT_TIMEOUT", 0.2)
    monkeypatch.setattr(peers_module, "GRACE", 0.1)
    asked: list[Any] = []
    answered = trio.Event()

    async def slow_to_answer(stream: trio.SocketStream) -> None:
        channel = await peerwire.accept(stream, SECRET)
        async with trio.open_nursery() as answers:
            while True:
                msg = await channel.receive()
                if msg[1] != "batches":
                    answers.start_soon(channel.send, [msg[0], 0, {"echo": msg[6]}])
                    continue
                asked.append(msg)
                if len(asked) == 2:  # the first is never answered
                    channel.batches = True
                    await channel.send([msg[0], 0, True])
                    answered.set()

    peer = await listening(nursery, slow_to_answer)
    p, streams = await recorded_peers(nursery)
    await p.call_rpc(peer, "a/x", (), "b/y", "m", {}, 5.0)
    with trio.fail_after(5):
        await answered.wait()
    await p.call_rpc(peer, "a/x", (), "b/y", "m", {}, 5.0)  # its reply follows the answer's
    await trio.testing.wait_all_tasks_blocked()
    before = len(streams[0].sent)
    await calls_together(p, peer)
    assert len(asked) == 2 and len(streams) == 1
    sent = frames(b"".join(streams[0].sent[before:]))
    assert len(sent) == 1 and is_batch(sent[0]) and len(sent[0]) == CALLS


async def recorded_peers(
    nursery: trio.Nursery, keep_received: bool = False
) -> tuple[Peers, list[Recording]]:
    """A host's peer connections, each stream recorded (``Recording``) in the list."""
    streams: list[Recording] = []

    async def connect(host: str, at: int) -> trio.abc.Stream:
        streams.append(Recording(await trio.open_tcp_stream(host, at), keep_received))
        return streams[-1]

    p = Peers(SECRET, connect)
    await nursery.start(p.run)
    return p, streams


async def listening(
    nursery: trio.Nursery, handler: Callable[[trio.SocketStream], Awaitable[None]]
) -> str:
    """``handler`` serving a port on loopback; its ``host:port``."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    await nursery.start(trio.serve_listeners, handler, listeners)
    return f"127.0.0.1:{listeners[0].socket.getsockname()[1]}"


async def calls_together(p: Peers, peer: str) -> None:
    """``CALLS`` calls to ``peer`` started at once, until every one is answered."""
    async with trio.open_nursery() as calls:
        for i in range(CALLS):
            calls.start_soon(p.call_rpc, peer, "a/x", (), "b/y", "m", {"i": i}, 5.0)
