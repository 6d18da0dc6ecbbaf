"""Queues, push side: the alarm-driven delivery of docs/reference.md §8 and the consumer helpers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import structlog
import trio
import trio.testing

import actorkeep as ak
import queues
from actorkeep import codec
from actorkeep.queue import DELIVER_PATH, Config, Lease, RetryLater
from actorkeep.testing import open_host
from actorkeep.wire.queue import DELIVER, lease_to_wire
from queues.queue import LINGER
from tests.queue_support import Remote, alarm_of, app, deliveries, inside, now, picky_seen


@pytest.fixture(autouse=True)
def _reset() -> None:
    deliveries.clear()
    picky_seen.clear()


def seen_ids() -> list[int]:
    return [s[1] for s in deliveries.seen]


async def test_push_delivers_in_batches_and_goes_quiet(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        await q.configure(Config(consumer="worker/w", batch_size=4))
        assert alarm_of(host) is None  # nothing to do yet
        ids = await q.send_batch([f"{i}".encode() for i in range(10)])
        assert alarm_of(host) is not None  # the send armed the alarm
        await trio.sleep(1)
        assert seen_ids() == ids
        assert {s[2] for s in deliveries.seen} == {1}
        st = await q.stats()
        assert (st.ready, st.delayed, st.leased) == (0, 0, 0)
        lingers = alarm_of(host)  # armed a little longer, so that a next send needs no fsync
        assert lingers is not None and lingers <= now(host) + LINGER
        await trio.sleep(LINGER)
        assert alarm_of(host) is None  # a quiet queue has no alarm


async def test_each_batch_is_its_own_event(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """While batches are pushed, a send waits for one batch at most, not for the whole
    backlog (batches alternate with other events)."""

    async def slow(actor: ak.Actor, msg: Lease) -> None:
        await trio.sleep(1)  # 10 s per batch of 10

    deliveries.behaviour["worker/w"] = slow
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        await q.configure(Config(consumer="worker/w", batch_size=10))
        await q.send_batch([b"x"] * 50)
        await trio.sleep(0.5)  # the first batch is running
        t = now(host)
        await q.send(b"late")
        assert now(host) - t <= 10.0 + 1e-6
        assert len(deliveries.seen) <= 20
        await trio.sleep(100)
        assert len(deliveries.seen) == 51


async def test_handler_outcomes(data_dir: Path, autojump_clock: trio.testing.MockClock) -> None:
    """Returning acks, raising retries with backoff and records the error, RetryLater(d)
    retries after d."""

    async def behave(actor: ak.Actor, msg: Lease) -> RetryLater | None:
        if msg.body == b"raise" and msg.attempt < 3:
            raise RuntimeError(f"failure {msg.attempt}")
        if msg.body == b"later" and msg.attempt == 1:
            return RetryLater(100)
        return None

    deliveries.behaviour["worker/w"] = behave
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        await q.configure(Config(consumer="worker/w"))
        t0 = now(host)
        ok, failing, later = await q.send_batch([b"ok", b"raise", b"later"])
        await trio.sleep(0.1)
        job = await q.get(failing)
        assert (job.state, job.attempts, job.last_error) == (
            "delayed",
            1,
            "RuntimeError: failure 1",
        )
        assert 0.5 <= job.visible_at - t0 <= 1.0 + 1e-6  # backoff after the first attempt
        assert (await q.get(later)).visible_at == pytest.approx(t0 + 100)
        assert await q.get(ok) is None
        await trio.sleep(10)
        assert await q.get(failing) is None  # third attempt succeeded
        assert [s[2] for s in deliveries.seen if s[1] == failing] == [1, 2, 3]
        assert [s[2] for s in deliveries.seen if s[1] == later] == [1]
        await trio.sleep(90)
        assert [(s[2], s[4] - t0 >= 100) for s in deliveries.seen if s[1] == later] == [
            (1, False),
            (2, True),
        ]
        assert await q.get(later) is None
        await trio.sleep(LINGER)
        assert alarm_of(host) is None


async def test_failing_consumer_retries_the_whole_batch_then_dead_letters(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Each failed delivery and each dead-lettering leaves one log line."""
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        # "nobody/x" is no actor class: every delivery is refused with 404
        await q.configure(Config(consumer="nobody/x", batch_size=2, max_attempts=3))
        with structlog.testing.capture_logs() as logs:
            a, b = await q.send_batch([b"a", b"b"])
            await trio.sleep(0.01)
            for i in (a, b):
                job = await q.get(i)
                assert job.state == "delayed" and job.attempts == 1
                assert "nobody/x" in (job.last_error or "") and "404" in (job.last_error or "")
            await trio.sleep(60)
        dead = await q.dead_letters()
        assert [(d.id, d.attempts) for d in dead] == [(a, 3), (b, 3)]
        assert "404" in dead[0].reason
        assert alarm_of(host) is None
    failed = [e for e in logs if e["event"] == "push delivery failed"]
    # 3 attempts of 2 messages, in batches as their backoffs fell
    assert sum(e["messages"] for e in failed) == 6 and all("404" in e["error"] for e in failed)
    buried = [e for e in logs if e["event"] == "message dead-lettered"]
    assert sorted((e["id"], e["attempts"], e["queue"]) for e in buried) == [
        (a, 3, q.address),
        (b, 3, q.address),
    ]
    assert all(e["log_level"] == "warning" and "404" in e["reason"] for e in buried)


async def test_consumer_that_refuses_the_queue(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A consumer whose handler is limited to other queues answers 403: the batch retries."""
    async with open_host(app, data_dir) as host:
        q = Remote(host, "queue/not-listed")
        await q.configure(Config(consumer="picky/p", max_attempts=1))
        i = await q.send(b"x")
        await trio.sleep(1)
        job = await q.get(i)
        assert job.state == "dead" and "403" in (job.last_error or "")
        ok = Remote(host, "queue/listed")
        await ok.configure(Config(consumer="picky/p"))
        j = await ok.send(b"y")
        await trio.sleep(1)
        assert await ok.get(j) is None
        assert picky_seen == [b"y"]


async def test_unmentioned_messages_wait_out_their_visibility(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        await q.configure(Config(consumer="silent/s", visibility=20, max_attempts=2))
        t0 = now(host)
        i = await q.send(b"x")
        await trio.sleep(1)
        assert (await q.get(i)).state == "leased"
        await trio.sleep(30)
        assert [(s[2], round(s[4] - t0)) for s in deliveries.seen] == [(1, 0), (2, 20)]
        assert (await q.get(i)).state == "leased"  # the second lease ends at 40
        await trio.sleep(10)
        job = await q.get(i)  # its last lease ran out: dead, not in limbo
        assert (job.state, job.last_error) == ("dead", "max attempts exceeded")
        assert alarm_of(host) is None


async def test_push_resumes_after_a_restart(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        await q.configure(Config(consumer="worker/w"))
        ids = await q.send_batch([b"1", b"2"], delay=60)
        await host.restart()
        await trio.sleep(59)
        assert deliveries.seen == []
        await trio.sleep(2)
        assert seen_ids() == ids


async def test_configuring_a_consumer_arms_pending_messages(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        ids = await q.send_batch([b"1", b"2"])
        assert alarm_of(host) is None  # pull queue: no alarm for ready messages
        await q.configure(Config(consumer="worker/w"))
        await trio.sleep(1)
        assert seen_ids() == ids
        await q.configure(Config())  # back to pull
        await q.send(b"3")
        await trio.sleep(10)
        assert seen_ids() == ids


async def test_pull_and_push_share_the_lease_rules(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A message leased by pull on a push queue is pushed once its lease runs out."""
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        i = await q.send(b"x")
        await q.lease(max=1, visibility=30)
        await q.configure(Config(consumer="worker/w"))
        await trio.sleep(29)
        assert deliveries.seen == []
        await trio.sleep(2)
        assert [(s[1], s[2]) for s in deliveries.seen] == [(i, 2)]


async def test_consumer_calling_its_queue_is_refused(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Re-entry: the queue waits on the consumer, so the consumer cannot call it back."""
    errors: list[str] = []

    async def reenter(actor: ak.Actor, msg: Lease) -> None:
        try:
            await ak.queue.Client("queue/q").stats()
        except ak.ReentryError as exc:
            errors.append(str(exc))
            raise

    deliveries.behaviour["worker/w"] = reenter
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        await q.configure(Config(consumer="worker/w", max_attempts=1))
        i = await q.send(b"x")
        await trio.sleep(1)
        assert len(errors) == 1 and "queue/q" in errors[0]
        job = await q.get(i)
        assert job.state == "dead" and (job.last_error or "").startswith("ReentryError")


async def test_delivery_requests_are_checked(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(app, data_dir) as host:
        frame = _deliver_frame("queue/q", [Lease(1, 1, b"x", 0.0)])
        resp = await host.request("POST", f"/worker/w{DELIVER_PATH}", body=frame)
        assert resp.status == 403  # from outside: no caller
        for garbage in (b"", b"\xc1", codec.pack([1]), codec.pack({"queue": "queue/q"})):
            resp = await host.call_as("queue/q", "worker/w", "POST", DELIVER_PATH, garbage)
            assert resp.status == 400, garbage
        bad = codec.pack({"queue": "queue/q", "messages": [[1, 1, "text", 0.0]]})
        resp = await host.call_as("queue/q", "worker/w", "POST", DELIVER_PATH, bad)
        assert resp.status == 400
        assert deliveries.seen == []
        resp = await host.call_as("queue/q", "worker/w", "POST", DELIVER_PATH, frame)
        assert resp.status == 200
        assert codec.unpack(resp.body) == {"outcomes": [{"id": 1, "attempt": 1, "op": "ack"}]}


async def test_handle_delivery_with_a_plain_function(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """handle_delivery also takes a plain (non-async) function."""
    got: list[bytes] = []

    def handler(msg: Lease) -> RetryLater | None:
        got.append(msg.body)
        return RetryLater(5) if msg.body == b"again" else None

    async def run(actor: ak.Actor) -> object:
        req = ak.Request(
            "POST",
            DELIVER_PATH,
            body=_deliver_frame("queue/q", [Lease(1, 1, b"ok", 0.0), Lease(2, 4, b"again", 0.0)]),
            caller="queue/q",
        )
        resp = await ak.queue.handle_delivery(req, handler)
        return codec.unpack(resp.body)

    async with open_host(app, data_dir) as host:
        reply = await inside(host, run)
        assert got == [b"ok", b"again"]
        assert reply == {
            "outcomes": [
                {"id": 1, "attempt": 1, "op": "ack"},
                {"id": 2, "attempt": 4, "op": "retry", "delay": 5.0, "error": None},
            ]
        }


async def test_a_crash_right_after_configure_stores_its_consumer_still_pushes(
    data_dir: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """configure arms the alarm before it stores the consumer, as send does: a crash between
    the two must not leave ready messages on a push queue with no alarm."""
    from actorkeep.sql import Sql

    real = Sql.exec

    def crash_after_config_write(self: Sql, sql: str, params: Any = (), **kw: Any) -> Any:
        written = real(self, sql, params, **kw)
        if "actorkeep_queue_config" in sql:
            # Committed: what a process crash right after it keeps.
            raise OSError("the process died here")
        return written

    async with open_host(app, data_dir) as host:
        q = Remote(host)
        ids = await q.send_batch([b"1", b"2"])
        monkeypatch.setattr(Sql, "exec", crash_after_config_write)
        with pytest.raises(ak.RemoteError):
            await q.configure(Config(consumer="worker/w"))
        monkeypatch.setattr(Sql, "exec", real)
        await host.restart()  # may cut a push short: its leases then run out (30 s)
        await trio.sleep(60)
        assert sorted(set(seen_ids())) == ids


async def test_an_error_text_msgpack_cannot_encode_is_recorded_not_fatal(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """os.fsdecode of bad bytes gives lone surrogates: such an error must still be recorded
    for its message, and the other messages of the batch acked."""

    bad_path = b"/tmp/x\xff".decode("utf-8", "surrogateescape")  # as os.fsdecode gives

    async def behave(actor: ak.Actor, msg: Lease) -> None:
        if msg.body == b"bad":
            raise FileNotFoundError(f"no such file: {bad_path}")

    deliveries.behaviour["worker/w"] = behave
    async with open_host(app, data_dir) as host:
        q = Remote(host)
        await q.configure(Config(consumer="worker/w", max_attempts=1))
        good1, bad, good2 = await q.send_batch([b"good1", b"bad", b"good2"])
        await trio.sleep(5)
        assert sorted(seen_ids()) == [good1, bad, good2]  # each delivered once
        (dead,) = await q.dead_letters()
        assert dead.id == bad and "FileNotFoundError" in dead.reason and "\\udcff" in dead.reason


def _deliver_frame(queue: str, leases: list[Lease]) -> bytes:
    return DELIVER.frame(queue=queue, messages=[lease_to_wire(x) for x in leases])


mounted = ak.App()
mounted.mount(
    queues.Queue,
    "queue",
    configs={"jobs": Config(consumer="sink/s", max_attempts=2)},
)
sunk: list[bytes] = []


@mounted.actor("sink")
class Sink(ak.Actor):
    @ak.queue.consumer()
    async def deliver(self, message: Lease) -> None:
        sunk.append(message.body)


@mounted.actor("producer")
class Producer(ak.Actor):
    @ak.rpc
    async def send(self, queue: str, body: str) -> int:
        return await ak.queue.Client(queue).send(body.encode())

    @ak.rpc
    async def configure_pull(self, queue: str) -> None:
        await ak.queue.Client(queue).configure(Config())

    @ak.rpc
    async def stats(self, queue: str) -> dict[str, int]:
        st = await ak.queue.Client(queue).stats()
        return {"ready": st.ready, "delayed": st.delayed}


async def test_a_queue_s_settings_declared_at_mount_push_without_configure(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """``configs=`` at mount: the queue pushes from its first send; a queue not named there
    is a pull queue; ``configure()`` stores settings that win over the mount's, also after a
    restart."""
    sunk.clear()
    async with open_host(mounted, data_dir) as host:

        async def rpc(method: str, **args: Any) -> Any:
            resp = await host.request("POST", f"/producer/p/_rpc/{method}", json=args)
            assert resp.status == 200, resp.body
            return resp.json()

        await rpc("send", queue="queue/jobs", body="a")
        await rpc("send", queue="queue/other", body="b")
        await trio.sleep(1)
        assert sunk == [b"a"]
        assert await rpc("stats", queue="queue/other") == {"ready": 1, "delayed": 0}
        await rpc("configure_pull", queue="queue/jobs")  # stored: a pull queue from now on
        await host.restart()
        await rpc("send", queue="queue/jobs", body="c")
        await trio.sleep(1)
        assert sunk == [b"a"]
        assert await rpc("stats", queue="queue/jobs") == {"ready": 1, "delayed": 0}


def test_mount_options_a_queue_cannot_take_fail_at_mount() -> None:
    app_ = ak.App()
    with pytest.raises(TypeError, match="configs"):
        app_.mount(queues.Queue, "q1", config=Config())
    with pytest.raises(TypeError, match="maps queue names"):
        app_.mount(queues.Queue, "q2", configs={"a": {"consumer": "x/y"}})
    assert "q1" not in app_.classes and "q2" not in app_.classes


pull_only = ak.App()
pull_only.mount(queues.Queue, "queue")
pull_only.mount(Sink, "sink")
pull_only.mount(Producer, "producer")


async def test_a_queue_declared_push_at_mount_delivers_what_it_held_before(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Messages sent while the queue was a pull queue go out once the mount names a consumer,
    from the queue's first event after that deploy."""
    sunk.clear()
    async with open_host(pull_only, data_dir) as host:
        resp = await host.request(
            "POST", "/producer/p/_rpc/send", json={"queue": "queue/jobs", "body": "early"}
        )
        assert resp.status == 200
        await trio.sleep(5)
    assert sunk == []
    async with open_host(mounted, data_dir) as host:
        resp = await host.request("POST", "/producer/p/_rpc/stats", json={"queue": "queue/jobs"})
        assert resp.status == 200
        await trio.sleep(5)
    assert sunk == [b"early"]
