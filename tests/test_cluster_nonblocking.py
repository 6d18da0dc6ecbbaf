"""A host's commits on its event loop (``actorkeep/cluster/nonblocking.py``) against a real
PostgreSQL: the store's statements with their parameters in binary, a commit cancelled, an
error at the commit itself, a connection the server ended. The store's contract (fencing, all
or nothing, alarms with their frames) runs through this path too: tests/test_cluster_store.py,
its ``nonblocking`` backend."""

from __future__ import annotations

import time

import psycopg
import pytest
import trio

from actorkeep.cluster import ClusterStore, Fenced, Write, create
from actorkeep.cluster.nonblocking import NonblockingCommits, encode, held_partitions, numbered
from actorkeep.cluster.records import AlarmChange
from actorkeep.cluster.store import COMMIT_ONE

TTL, MARGIN = 5.0, 1.0


def opened(conninfo: str, partitions: int = 4) -> tuple[ClusterStore, NonblockingCommits]:
    create(conninfo, partitions)
    store = ClusterStore(conninfo, "a", clock=time.monotonic)
    return store, NonblockingCommits(store.commits, trio.to_thread.run_sync)


def test_a_statement_is_numbered_once_per_name() -> None:
    sql, names = numbered("SELECT %(a)s, %(b)b, %(a)s::int")
    assert (sql, names) == (b"SELECT $1, $2, $1::int", ["a", "b"])
    assert numbered(COMMIT_ONE)[1] == ["partition", "epoch", "address", "seq", "data"]
    with pytest.raises(ValueError):
        numbered("SELECT 5 %% 2, %(a)s")


def test_values_encode_as_postgres_reads_them(pg_conninfo: str) -> None:
    """Each kind, alone and as an array (empty too), read back by PostgreSQL itself."""
    cases = [
        (23, False, -5, "int4"),
        (20, False, 2**40, "int8"),
        (701, False, 7.25, "float8"),
        (25, False, 'a "q", {b}\\é', "text"),
        (17, False, bytes(range(256)), "bytea"),
        (23, True, [1, -2, 3], "int4[]"),
        (20, True, [], "int8[]"),
        (25, True, ["x,y", '"', "{}", "é", "NULL"], "text[]"),
        (17, True, [b"\x00\xff", b""], "bytea[]"),
        (701, True, [0.5, 1e300], "float8[]"),
    ]
    with psycopg.connect(pg_conninfo) as conn:
        for kind, array, value, name in cases:
            oid = {23: 1007, 20: 1016, 701: 1022, 25: 1009, 17: 1001}[kind] if array else kind
            result = conn.pgconn.exec_params(
                f"SELECT $1::{name}::text".encode(), [encode(kind, array, value)], [oid], [1], 0
            )
            assert result.status == psycopg.pq.ExecStatus.TUPLES_OK, result.get_error_message()
            # The same value as psycopg sends it, rendered as text by PostgreSQL: the same.
            row = conn.execute(f"SELECT %s::{name}::text", [value]).fetchone()
            assert row is not None and result.get_value(0, 0) == row[0].encode(), name
    assert held_partitions(None) == [] and held_partitions(b"{}") == []
    assert held_partitions(b"{3,11}") == [3, 11]


async def test_writes_of_any_address_and_bytes_commit_as_given(pg_conninfo: str) -> None:
    store, commits = opened(pg_conninfo)
    try:
        leases = [await trio.to_thread.run_sync(store.acquire, p, TTL, MARGIN) for p in (0, 1)]
        e0, e1 = (lease.epoch for lease in leases if lease is not None)
        odd = 'c/"a,b"{x}\\é'
        await commits.commit([Write(0, e0, odd, 1, bytes(range(256)))], [])  # one: COMMIT_ONE
        writes = [Write(0, e0, odd, 2, b""), Write(1, e1, "c/y", 1, b"\x00" * 70_000)]
        alarms = [AlarmChange(1, e1, "c/y", 12.5), AlarmChange(0, e0, odd, None)]
        await commits.commit(writes, alarms)  # several, with alarms: COMMIT_FRAMES
        assert store.frames(odd) == [(1, bytes(range(256))), (2, b"")]
        assert store.frames("c/y") == [(1, b"\x00" * 70_000)]
        assert store.alarms_of([0, 1]) == [(1, "c/y", 12.5)]
        with pytest.raises(Fenced) as fenced:
            await commits.commit([Write(0, e0 + 1, "c/z", 1, b"z"), writes[1]], [])
        assert fenced.value.partitions == [0] and store.frames("c/z") == []
    finally:
        store.close()


async def test_a_commit_sent_ends_through_a_cancellation_and_one_cancelled_before_is_not_sent(
    pg_conninfo: str,
) -> None:
    """Cancelled while PostgreSQL makes it wait (a takeover holds the lease row), a commit sent
    is awaited to its end, as one in a thread was: its outcome is known, and its connection
    stays in use. A commit cancelled before it was sent sends nothing."""
    store, commits = opened(pg_conninfo)
    try:
        lease = await trio.to_thread.run_sync(store.acquire, 0, TTL, MARGIN)
        assert lease is not None
        await commits.commit([Write(0, lease.epoch, "c/x", 1, b"a")], [])
        first = store.commits.conn
        ended: list[bool] = []

        async def cut_short() -> None:
            with trio.move_on_after(0.2) as scope:
                await commits.commit([Write(0, lease.epoch, "c/x", 2, b"b")], [])
            ended.append(scope.cancel_called)

        with psycopg.connect(pg_conninfo, autocommit=True) as holder:
            holder.execute("BEGIN")
            holder.execute("SELECT * FROM actorkeep_leases WHERE partition = 0 FOR UPDATE")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(cut_short)
                await trio.sleep(0.5)  # cancelled at 0.2 s, still waiting for the row
                assert ended == []
                await trio.to_thread.run_sync(holder.execute, "ROLLBACK")
        assert ended == [True] and store.frames("c/x") == [(1, b"a"), (2, b"b")]
        assert store.commits.conn is first and not first.closed
        with trio.CancelScope() as scope:
            scope.cancel()
            await commits.commit([Write(0, lease.epoch, "c/z", 1, b"z")], [])
        assert scope.cancelled_caught and store.frames("c/z") == []
        await commits.commit([Write(0, lease.epoch, "c/z", 1, b"z")], [])
        assert store.frames("c/z") == [(1, b"z")]
    finally:
        store.close()


async def test_an_error_at_the_commit_itself_is_no_success(pg_conninfo: str) -> None:
    """PostgreSQL can fail a transaction at its commit, after the statement's rows (here a
    deferred constraint trigger): the write is not acknowledged (its outcome reads as unknown),
    and the connection goes on."""
    store, commits = opened(pg_conninfo)
    try:
        with psycopg.connect(pg_conninfo, autocommit=True) as conn:
            conn.execute(
                "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                "IF NEW.address LIKE 'refused/%' THEN RAISE EXCEPTION 'refused at commit'; "
                "END IF; RETURN NULL; END $$"
            )
            conn.execute(
                "CREATE CONSTRAINT TRIGGER refuse AFTER INSERT ON actorkeep_frames "
                "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse()"
            )
        lease = await trio.to_thread.run_sync(store.acquire, 0, TTL, MARGIN)
        assert lease is not None
        e = lease.epoch
        for writes in (
            [Write(0, e, "refused/one", 1, b"x")],  # COMMIT_ONE
            [Write(0, e, "refused/two", 1, b"x"), Write(0, e, "c/ok", 1, b"y")],  # COMMIT_FRAMES
        ):
            with pytest.raises(psycopg.OperationalError, match="refused at commit"):
                await commits.commit(writes, [])
        assert store.frames("refused/one") == [] and store.frames("c/ok") == []
        await commits.commit([Write(0, e, "c/ok", 1, b"y")], [])
        assert store.frames("c/ok") == [(1, b"y")]
    finally:
        store.close()


async def test_text_goes_right_whatever_the_database_s_client_encoding(pg_conninfo: str) -> None:
    """Text parameters are UTF-8 bytes, which PostgreSQL reads in the client's encoding: the
    connection sets UTF-8, or an address would be stored as another one."""
    dbname = psycopg.conninfo.conninfo_to_dict(pg_conninfo)["dbname"]
    with psycopg.connect(pg_conninfo, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE {dbname} SET client_encoding TO 'LATIN1'")
    store, commits = opened(pg_conninfo)
    try:
        lease = await trio.to_thread.run_sync(store.acquire, 0, TTL, MARGIN)
        assert lease is not None
        await commits.commit([Write(0, lease.epoch, "c/é", 1, b"x")], [])
        assert store.frames("c/é") == [(1, b"x")]
    finally:
        store.close()


async def test_a_connection_the_server_ended_is_opened_again_before_a_commit(
    pg_conninfo: str,
) -> None:
    store, commits = opened(pg_conninfo)
    try:
        lease = await trio.to_thread.run_sync(store.acquire, 0, TTL, MARGIN)
        assert lease is not None
        await commits.commit([Write(0, lease.epoch, "c/x", 1, b"a")], [])
        pid = store.commits.conn.pgconn.backend_pid
        with psycopg.connect(pg_conninfo, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        await trio.sleep(0.2)  # the server's word reaches the socket
        await commits.commit([Write(0, lease.epoch, "c/x", 2, b"b")], [])
        assert store.commits.conn.pgconn.backend_pid != pid
        assert store.frames("c/x") == [(1, b"a"), (2, b"b")]
    finally:
        store.close()
