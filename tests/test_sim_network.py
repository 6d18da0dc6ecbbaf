"""The simulated network between cluster hosts (sim/cluster/network.py), carrying the hosts' real
internal protocol (actorkeep/cluster/peers.py) under virtual time: delays drawn from the seed,
links cut one way or both that hold what is sent until they heal, packets dropped for good that
reset their connection, refused connections."""

from __future__ import annotations

import random
from typing import Any

import pytest
import trio
import trio.testing

from actorkeep.cluster.peers import Peers, Unreachable, serve_connection
from actorkeep.errors import CallTimeout
from actorkeep.http import Request, Response
from sim.cluster.network import SimNetwork
from sim.determinism import seeded_scheduler

SECRET = b"k" * 32


class Owner:
    """Owns every actor; records the rpcs it ran, with the time they arrived."""

    def __init__(self) -> None:
        self.ran: list[tuple[float, dict[str, Any]]] = []

    async def deliver_local(
        self, class_name: str, name: str, request: Request, chain: Any, timeout: Any
    ) -> Response:
        return Response(200, {}, b"")

    async def call_rpc_local(
        self, caller: str, chain: Any, address: str, method: str, args: dict[str, Any], t: Any
    ) -> Any:
        self.ran.append((trio.current_time(), args))
        return args

    async def call_op_local(
        self, caller: str, chain: Any, address: str, op: Any, values: Any, t: Any
    ) -> Response:
        raise AssertionError("no operation crosses in these tests")


async def hosts(
    nursery: trio.Nursery, seed: int = 1, on_reset: Any = None
) -> tuple[SimNetwork, Peers, Owner]:
    """Host "a" dials host "b", which listens on b:1 and owns everything."""
    rng = random.Random(seed)
    net = SimNetwork(rng, latency=(0.001, 0.002), on_reset=on_reset)
    await nursery.start(net.run)
    owner = Owner()

    def nonce(n: int) -> bytes:
        return rng.randbytes(n)

    net.listen("b:1", lambda stream: serve_connection(stream, SECRET, owner, nonce))
    peers = Peers(SECRET, connect=net.connector("a"), nonce=nonce)
    await nursery.start(peers.run)
    return net, peers, owner


async def test_calls_cross_with_the_network_s_delays(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    _, peers, _ = await hosts(nursery)
    start = trio.current_time()
    assert await peers.call_rpc("b:1", "c/x", (), "c/y", "m", {"n": 1}, 5.0) == {"n": 1}
    took = trio.current_time() - start
    assert 0.002 * 3 <= took <= 0.1  # connect, handshake and call: several one-way delays
    with pytest.raises(Unreachable):  # nobody listens there
        await peers.call_rpc("c:1", "c/x", (), "c/y", "m", {}, 5.0)


async def test_a_cut_link_holds_what_is_sent_until_it_heals(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    net, peers, owner = await hosts(nursery)
    await peers.call_rpc("b:1", "c/x", (), "c/y", "m", {"n": 0}, 5.0)  # connected
    net.cut("a", "b", both_ways=False)  # a's requests are held; b's replies would pass
    with pytest.raises(CallTimeout):
        await peers.call_rpc("b:1", "c/x", (), "c/y", "m", {"n": 1}, 2.0)
    assert [args for _, args in owner.ran] == [{"n": 0}]  # it never arrived
    healed_at = trio.current_time()
    net.heal()
    assert await peers.call_rpc("b:1", "c/x", (), "c/y", "m", {"n": 2}, 5.0) == {"n": 2}
    # The held request arrives after the heal, late, and runs: as TCP would deliver it.
    assert [args for _, args in owner.ran] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert owner.ran[1][0] >= healed_at


async def test_dialing_across_a_cut_waits_for_the_heal(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    net, peers, _ = await hosts(nursery)
    net.cut("a", "b")
    with pytest.raises(Unreachable):  # the dial times out (Peers' own connect timeout)
        await peers.call_rpc("b:1", "c/x", (), "c/y", "m", {}, 10.0)
    net.heal()
    assert await peers.call_rpc("b:1", "c/x", (), "c/y", "m", {"n": 3}, 5.0) == {"n": 3}


def test_a_seed_gives_the_same_timings() -> None:
    async def run(seed: int) -> list[float]:
        async with trio.open_nursery() as nursery:
            _, peers, owner = await hosts(nursery, seed)
            for i in range(10):
                await peers.call_rpc("b:1", "c/x", (), "c/y", "m", {"i": i}, 5.0)
            nursery.cancel_scope.cancel()
        return [round(at, 9) for at, _ in owner.ran]

    def in_virtual_time(seed: int) -> list[float]:
        # As the simulator runs it: tasks ready together (a call, and the link's question
        # whether the owner reads batches) run in an order the seed fixes.
        with seeded_scheduler(seed):
            return trio.run(run, seed, clock=trio.testing.MockClock(autojump_threshold=0))

    assert in_virtual_time(5) == in_virtual_time(5)
    assert in_virtual_time(5) != in_virtual_time(6)


async def test_a_dropped_packet_resets_its_connection_and_the_next_call_dials_again(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    resets: list[tuple[str, str]] = []
    net, peers, owner = await hosts(nursery, on_reset=lambda a, b: resets.append((a, b)))
    await peers.call_rpc("b:1", "c/x", (), "c/y", "m", {"n": 0}, 5.0)  # connected
    net.drop = 1.0  # the request's chunk is lost for good: the connection is reset
    with pytest.raises((Unreachable, CallTimeout)):
        await peers.call_rpc("b:1", "c/x", (), "c/y", "m", {"n": 1}, 2.0)
    assert resets and resets[0] == ("a", "b")
    assert [args for _, args in owner.ran] == [{"n": 0}]  # it never arrived
    net.drop = 0.0
    assert await peers.call_rpc("b:1", "c/x", (), "c/y", "m", {"n": 2}, 5.0) == {"n": 2}
    assert [args for _, args in owner.ran] == [{"n": 0}, {"n": 2}]


async def test_a_reset_ends_both_ends_of_the_connection(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    net = SimNetwork(random.Random(1), drops=random.Random(2))
    await nursery.start(net.run)
    accepted: list[trio.abc.Stream] = []
    got = trio.Event()

    async def accept(stream: trio.abc.Stream) -> None:
        accepted.append(stream)
        got.set()
        await trio.sleep_forever()

    net.listen("b:1", accept)
    mine = await net.connector("a")("b", 1)
    await got.wait()
    await mine.send_all(b"hello")
    assert await accepted[0].receive_some() == b"hello"
    net.drop = 1.0
    await accepted[0].send_all(b"lost")  # dropped: the connection is reset
    assert await mine.receive_some() == b""  # the end, not the chunk
    assert await accepted[0].receive_some() == b""
    with pytest.raises(trio.BrokenResourceError):
        await mine.send_all(b"more")
