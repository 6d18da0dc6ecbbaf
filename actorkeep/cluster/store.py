"""What the cluster keeps in PostgreSQL, and the only statements that change it (decision 0016).

- ``actorkeep_cluster``: the partition count, fixed when the cluster is created, and the secret
  the hosts sign their internal calls with (``cluster/peerwire.py``).
- ``actorkeep_leases``: a row per partition: its owner, its epoch (grows at every takeover) and
  when the lease expires, by PostgreSQL's clock.
- ``actorkeep_hosts``: when each host incarnation last said it was alive, by PostgreSQL's clock,
  and where its internal port is.
- ``actorkeep_images``: an image of an actor's database file, with the ``seq`` of the last
  frames folded into it (``compact``).
- ``actorkeep_frames``: the actors' durable writes after their image, each tagged with the
  epoch it was written under.
- ``actorkeep_alarms``: the alarm index, ``address -> at`` by partition, changed only in the
  commits that carry the actors' frames (``cluster/alarms.py``).

A write commits only if every partition it touches still has the epoch the writer holds, checked
in the same transaction under a share lock on the lease rows: a takeover (which updates the row)
waits for such a commit to end, and once it has bumped the epoch the old owner can never commit
again (fencing). The store is synchronous (psycopg 3's async API is asyncio-only): the host calls
it from its sync threads, as it does fsyncs.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import psycopg

from ..hashing import fnv1a64
from .connections import Link, connect
from .partitions import check_partitions
from .records import (
    AlarmChange,
    ClusterMismatch,
    Fenced,
    Lease,
    Write,
    check_lease_times,
    lease_partition,
)

__all__ = [
    "AlarmChange",
    "ClusterMismatch",
    "ClusterStore",
    "Fenced",
    "Lease",
    "Write",
    "create",
]

#: Bytes of the cluster's secret, drawn when it is created.
SECRET_BYTES = 32

#: Serialises concurrent ``create`` calls (any constant the cluster owns).
_CREATE_LOCK = 0x616B_636C

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS actorkeep_cluster (
        id integer PRIMARY KEY CHECK (id = 0),
        partitions integer NOT NULL,
        secret bytea NOT NULL,
        created_at timestamptz NOT NULL DEFAULT clock_timestamp())""",
    """CREATE TABLE IF NOT EXISTS actorkeep_leases (
        partition integer PRIMARY KEY,
        owner text,
        epoch bigint NOT NULL DEFAULT 0,
        expires_at timestamptz)""",
    """CREATE TABLE IF NOT EXISTS actorkeep_hosts (
        host_id text PRIMARY KEY,
        seen_at timestamptz NOT NULL,
        address text)""",
    """CREATE TABLE IF NOT EXISTS actorkeep_images (
        address text PRIMARY KEY,
        partition integer NOT NULL,
        epoch bigint NOT NULL,
        seq bigint NOT NULL,
        image bytea NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS actorkeep_frames (
        address text NOT NULL,
        seq bigint NOT NULL,
        partition integer NOT NULL,
        epoch bigint NOT NULL,
        data bytea NOT NULL,
        PRIMARY KEY (address, seq))""",
    """CREATE TABLE IF NOT EXISTS actorkeep_alarms (
        address text PRIMARY KEY,
        partition integer NOT NULL,
        at double precision NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS actorkeep_alarms_partition ON actorkeep_alarms (partition)",
    # Where each host's admin API is, for the others to forward an operator's reads to
    # (actorkeep/ops; cluster/store_view.py).
    """CREATE TABLE IF NOT EXISTS actorkeep_admin (
        host_id text PRIMARY KEY,
        url text NOT NULL)""",
    # Where each host's front is, for WebSockets relayed to an actor's owner (fronts.py).
    """CREATE TABLE IF NOT EXISTS actorkeep_fronts (
        host_id text PRIMARY KEY,
        url text NOT NULL)""",
)


#: A commit's check of its partitions' epochs. The share lock lasts to the commit's end, so a
#: takeover (an update of the row) waits for it: the new owner sees every frame it committed.
CHECK_EPOCHS = (
    "SELECT partition, epoch FROM actorkeep_leases WHERE partition = ANY(%s) "
    "ORDER BY partition FOR SHARE"
)

#: A commit, in one statement: the partitions still at their epochs (share-locked to the end,
#: as ``CHECK_EPOCHS``), and, only if every one of them is, the frames inserted and the alarm
#: index's entries set and dropped; the partitions held. (PostgreSQL runs every data-modifying
#: part of a ``WITH`` to completion, read or not.)
COMMIT_FRAMES = (
    "WITH held AS (SELECT l.partition FROM actorkeep_leases l "
    "JOIN unnest(%(parts)s::integer[], %(epochs)s::bigint[]) AS want(partition, epoch) "
    "ON l.partition = want.partition AND l.epoch = want.epoch "
    "ORDER BY l.partition FOR SHARE OF l), "
    "ok AS (SELECT count(*) = %(n)s AS ok FROM held), "
    "ins AS (INSERT INTO actorkeep_frames (address, seq, partition, epoch, data) "
    "SELECT * FROM unnest(%(addresses)s::text[], %(seqs)s::bigint[], %(partitions)s::integer[], "
    "%(frame_epochs)s::bigint[], %(data)b::bytea[]) WHERE (SELECT ok FROM ok)), "
    "put AS (INSERT INTO actorkeep_alarms (address, partition, at) "
    "SELECT * FROM unnest(%(put_addresses)s::text[], %(put_partitions)s::integer[], "
    "%(put_at)s::float8[]) WHERE (SELECT ok FROM ok) "
    "ON CONFLICT (address) DO UPDATE SET partition = excluded.partition, at = excluded.at), "
    "del AS (DELETE FROM actorkeep_alarms WHERE address = ANY(%(dropped)s::text[]) "
    "AND (SELECT ok FROM ok)) "
    "SELECT array_agg(partition) FROM held"
)


#: ``COMMIT_FRAMES`` for one write and no alarm change, with plain parameters: adapting a
#: dozen one-element arrays costs psycopg about 0.1 ms of Python, a third of a round trip.
COMMIT_ONE = (
    "WITH held AS (SELECT partition FROM actorkeep_leases WHERE partition = %(partition)s "
    "AND epoch = %(epoch)s FOR SHARE), "
    "ins AS (INSERT INTO actorkeep_frames (address, seq, partition, epoch, data) "
    "SELECT %(address)s, %(seq)s, %(partition)s, %(epoch)s, %(data)b WHERE EXISTS "
    "(SELECT 1 FROM held)) "
    "SELECT array_agg(partition) FROM held"
)


def commit_statement(
    writes: Sequence[Write], alarms: Sequence[AlarmChange]
) -> tuple[str, dict[str, Any], list[int]] | None:
    """The statement that commits ``writes`` and ``alarms`` (``COMMIT_ONE`` or
    ``COMMIT_FRAMES``), its parameters and the partitions it checks; None if there is nothing
    to commit. ``ValueError`` for a partition under two epochs."""
    if not writes and not alarms:
        return None
    epochs: dict[int, int] = {}
    tagged: list[tuple[int, int]] = [(w.partition, w.epoch) for w in writes]
    tagged += [(a.partition, a.epoch) for a in alarms]
    for partition, epoch in tagged:
        if epochs.setdefault(partition, epoch) != epoch:
            raise ValueError(f"writes to partition {partition} under two epochs")
    parts = sorted(epochs)
    if len(writes) == 1 and not alarms:
        w = writes[0]
        one = {"partition": w.partition, "epoch": w.epoch, "address": w.address, "seq": w.seq}
        return COMMIT_ONE, {**one, "data": w.data}, parts
    put = [a for a in alarms if a.at is not None]
    return (
        COMMIT_FRAMES,
        {
            "parts": parts,
            "epochs": [epochs[p] for p in parts],
            "n": len(parts),
            "addresses": [w.address for w in writes],
            "seqs": [w.seq for w in writes],
            "partitions": [w.partition for w in writes],
            "frame_epochs": [w.epoch for w in writes],
            "data": [w.data for w in writes],
            "put_addresses": [a.address for a in put],
            "put_partitions": [a.partition for a in put],
            "put_at": [float(a.at) for a in put if a.at is not None],
            "dropped": [a.address for a in alarms if a.at is None],
        },
        parts,
    )


def check_held(parts: Sequence[int], held: Sequence[int] | None) -> None:
    """After a commit statement: ``Fenced`` unless it held every one of ``parts``."""
    found = set(held or [])
    if len(found) != len(parts):
        raise Fenced(sorted(set(parts) - found))


#: The lease rows a renewal or a release names, locked in partition order before it updates
#: them (``FOR NO KEY UPDATE``, the lock its update takes anyway), as a commit's check locks
#: its own: a plain ``UPDATE ... FROM unnest(...)`` locks rows in the order it finds them, and
#: against a commit on the other connection that order can deadlock.
_IN_ORDER = (
    "locked AS MATERIALIZED (SELECT partition FROM actorkeep_leases "
    "WHERE partition = ANY(%(parts)s::integer[]) AND owner = %(owner)s "
    "ORDER BY partition FOR NO KEY UPDATE)"
)


F = TypeVar("F", bound=Callable[..., Any])


def _locked(method: F) -> F:
    """Run on the store's control connection, one statement (or transaction) at a time."""

    @functools.wraps(method)
    def locked(self: ClusterStore, *args: Any, **kwargs: Any) -> Any:
        with self._control.use():
            return method(self, *args, **kwargs)

    return locked  # type: ignore[return-value]


def load_actor(
    conn: psycopg.Connection[Any], address: str
) -> tuple[int, bytes, list[tuple[int, bytes]]]:
    """``ClusterStore.load`` on ``conn``: the image and the frames after it, one snapshot."""
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        row = conn.execute(
            "SELECT seq, image FROM actorkeep_images WHERE address = %s", (address,)
        ).fetchone()
        seq, image = (0, b"") if row is None else (int(row[0]), bytes(row[1]))
        rows = conn.execute(
            "SELECT seq, data FROM actorkeep_frames WHERE address = %s AND seq > %s ORDER BY seq",
            (address, seq),
        ).fetchall()
    return seq, image, [(int(n), bytes(data)) for n, data in rows]


def create(conninfo: str, partitions: int) -> None:
    """Create the cluster's tables and one lease row per partition, if not there already;
    ``ClusterMismatch`` if the cluster exists with another partition count."""
    check_partitions(partitions)
    with connect(conninfo) as conn, conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_CREATE_LOCK,))
        for statement in _SCHEMA:
            conn.execute(statement)
        conn.execute(
            "INSERT INTO actorkeep_cluster (id, partitions, secret) VALUES (0, %s, %s) "
            "ON CONFLICT DO NOTHING",
            (partitions, secrets.token_bytes(SECRET_BYTES)),
        )
        row = conn.execute("SELECT partitions FROM actorkeep_cluster").fetchone()
        assert row is not None
        if row[0] != partitions:
            raise ClusterMismatch(f"the cluster has {row[0]} partitions, not {partitions}")
        conn.execute(
            "INSERT INTO actorkeep_leases (partition) SELECT generate_series(0, %s - 1) "
            "ON CONFLICT DO NOTHING",
            (partitions,),
        )


class ClusterStore:
    """One host's connection to the cluster's database.

    ``host_id`` names this host incarnation (unique: a restarted host is a new owner).
    ``clock`` is the host's monotonic clock, in seconds.
    """

    def __init__(self, conninfo: str, host_id: str, *, clock: Callable[[], float]) -> None:
        if not host_id or len(host_id) > 200:
            raise ValueError("host_id must be 1 to 200 characters")
        self.host_id = host_id
        self.conninfo = conninfo
        self._clock = clock
        #: Leases, hosts, loads, compactions: everything but the commits.
        self._control = Link(conninfo, "control")
        try:
            #: The commits, on a connection of their own: a commit in flight never waits
            #: behind a renewal, a load or a compaction's image. A commit share-locks its
            #: partitions' lease rows in partition order, and renewals and releases lock
            #: theirs in the same order, so the two connections never deadlock.
            self._commits = Link(conninfo, "commits")
        except BaseException:
            self._control.close()
            raise
        try:
            row = self._conn.execute("SELECT partitions, secret FROM actorkeep_cluster").fetchone()
        except psycopg.errors.UndefinedTable:
            row = None
        except BaseException:
            self.close()
            raise
        if row is None:
            self.close()
            raise ClusterMismatch("no cluster in this database (create it first)")
        self.partitions: int = row[0]
        #: What the hosts sign their internal calls with: whoever can read it can also write
        #: the actors' frames, so it is kept where they are.
        self.secret: bytes = bytes(row[1])

    @property
    def _conn(self) -> psycopg.Connection[Any]:
        return self._control.conn

    def close(self) -> None:
        self._commits.close()
        self._control.close()

    @_locked
    def acquire(self, partition: int, ttl: float, margin: float) -> Lease | None:
        """Take ``partition`` if nobody holds it or its lease has expired by PostgreSQL's
        clock, bumping its epoch; the lease, or None if another host holds it."""
        check_lease_times(ttl, margin)
        sent = self._clock()
        row = self._conn.execute(
            "UPDATE actorkeep_leases SET owner = %s, epoch = epoch + 1, "
            "expires_at = clock_timestamp() + make_interval(secs => %s) "
            "WHERE partition = %s AND (owner IS NULL OR expires_at <= clock_timestamp()) "
            "RETURNING epoch",
            (self.host_id, ttl, partition),
        ).fetchone()
        return None if row is None else Lease(partition, row[0], sent + ttl - margin)

    @_locked
    def renew(self, leases: Sequence[Lease], ttl: float, margin: float) -> list[Lease]:
        """Extend the leases this host still holds (same epoch, not yet expired); the renewed
        ones. A lease missing from the answer is lost: stop serving it."""
        check_lease_times(ttl, margin)
        if not leases:
            return []
        sent = self._clock()
        rows = self._conn.execute(
            f"WITH {_IN_ORDER} UPDATE actorkeep_leases AS l "
            "SET expires_at = clock_timestamp() + make_interval(secs => %(ttl)s) "
            "FROM unnest(%(parts)s::integer[], %(epochs)s::bigint[]) AS held(partition, epoch) "
            "WHERE l.partition = held.partition AND l.epoch = held.epoch "
            "AND l.owner = %(owner)s AND l.partition IN (SELECT partition FROM locked) "
            "AND l.expires_at > clock_timestamp() RETURNING l.partition, l.epoch",
            {
                "ttl": ttl,
                "parts": [x.partition for x in leases],
                "epochs": [x.epoch for x in leases],
                "owner": self.host_id,
            },
        ).fetchall()
        return sorted((Lease(p, e, sent + ttl - margin) for p, e in rows), key=lease_partition)

    @_locked
    def heartbeat(self, ttl: float, address: str | None = None) -> int:
        """Record that this host is alive, and where its internal port is (``host:port``);
        how many hosts are alive (seen within ``ttl``)."""
        row = self._conn.execute(
            "WITH seen AS (INSERT INTO actorkeep_hosts VALUES (%s, clock_timestamp(), %s) "
            "ON CONFLICT (host_id) DO UPDATE SET seen_at = excluded.seen_at, "
            "address = excluded.address) "
            "SELECT count(*) + 1 FROM actorkeep_hosts WHERE host_id <> %s "
            "AND seen_at > clock_timestamp() - make_interval(secs => %s)",
            (self.host_id, address, self.host_id, ttl),
        ).fetchone()
        assert row is not None
        return int(row[0])

    @_locked
    def leave(self) -> None:
        """This host stops: no longer counted among the live ones."""
        self._conn.execute("DELETE FROM actorkeep_hosts WHERE host_id = %s", (self.host_id,))

    @_locked
    def free_partitions(self, limit: int) -> list[int]:
        """Up to ``limit`` partitions nobody holds (or whose lease has expired), in an order of
        this host's own, so that hosts looking at once mostly try different ones."""
        if limit <= 0:
            return []
        offset = fnv1a64(self.host_id.encode()) % self.partitions
        rows = self._conn.execute(
            "SELECT partition FROM actorkeep_leases "
            "WHERE owner IS NULL OR expires_at <= clock_timestamp() "
            "ORDER BY (partition + %s) %% %s LIMIT %s",
            (offset, self.partitions, limit),
        ).fetchall()
        return [int(p) for (p,) in rows]

    @_locked
    def release(self, leases: Sequence[Lease]) -> None:
        """Give leases up now (a planned shutdown): another host may take them at once. The
        epoch stays; the taker bumps it."""
        if leases:
            self._conn.execute(
                f"WITH {_IN_ORDER} UPDATE actorkeep_leases AS l "
                "SET owner = NULL, expires_at = NULL "
                "FROM unnest(%(parts)s::integer[], %(epochs)s::bigint[]) AS held(partition, epoch) "
                "WHERE l.partition = held.partition AND l.epoch = held.epoch "
                "AND l.owner = %(owner)s AND l.partition IN (SELECT partition FROM locked)",
                {
                    "parts": [x.partition for x in leases],
                    "epochs": [x.epoch for x in leases],
                    "owner": self.host_id,
                },
            )

    @property
    def commits(self) -> Link:
        """The commits' own connection (``commit``; ``NonblockingCommits`` once a host runs)."""
        return self._commits

    def commit(self, writes: Sequence[Write], alarms: Sequence[AlarmChange] = ()) -> None:
        """Commit ``writes`` (any actors, any partitions) and the alarm index's ``alarms`` (one
        change per address at most) in one transaction, or none of them: ``Fenced`` if a
        partition's epoch is no longer the one a write or change carries."""
        statement = commit_statement(writes, alarms)
        if statement is None:
            return
        query, params, parts = statement
        # One statement, so one round trip and its own transaction (autocommit).
        with self._commits.use() as conn:
            row = conn.execute(query, params).fetchone()
        assert row is not None
        check_held(parts, row[0])

    @_locked
    def alarms_of(self, partitions: Sequence[int]) -> list[tuple[int, str, float]]:
        """``(partition, address, at)`` of the alarm index's entries in ``partitions``."""
        rows = self._conn.execute(
            "SELECT partition, address, at FROM actorkeep_alarms WHERE partition = ANY(%s)",
            (list(partitions),),
        ).fetchall()
        return [(int(p), str(a), float(at)) for p, a, at in rows]

    @_locked
    def load(self, address: str) -> tuple[int, bytes, list[tuple[int, bytes]]]:
        """What the cluster holds of an actor: ``(seq, image, [(seq, frames), ...])``, the
        image (empty if none) and the frames committed after it, in order; read in one
        snapshot, so a compaction running meanwhile is seen whole or not at all."""
        return load_actor(self._conn, address)

    @_locked
    def compact(self, partition: int, epoch: int, address: str, seq: int, image: bytes) -> None:
        """Replace the actor's image by ``image``, which folds in its frames up to ``seq``, and
        drop those frames; fenced like ``commit``."""
        with self._conn.transaction():
            rows = self._conn.execute(CHECK_EPOCHS, ([partition],)).fetchall()
            if [tuple(r) for r in rows] != [(partition, epoch)]:
                raise Fenced([partition])
            self._conn.execute(
                "INSERT INTO actorkeep_images VALUES (%s, %s, %s, %s, %s) "
                "ON CONFLICT (address) DO UPDATE SET partition = excluded.partition, "
                "epoch = excluded.epoch, seq = excluded.seq, image = excluded.image "
                "WHERE actorkeep_images.seq <= excluded.seq",
                (address, partition, epoch, seq, image),
            )
            self._conn.execute(
                "DELETE FROM actorkeep_frames WHERE address = %s AND seq <= %s", (address, seq)
            )

    @_locked
    def forget_actor(self, partition: int, epoch: int, address: str) -> None:
        """Delete all the cluster holds of an actor (its image, its frames, its alarm index
        entry) in one transaction; fenced like ``commit``."""
        with self._conn.transaction():
            rows = self._conn.execute(CHECK_EPOCHS, ([partition],)).fetchall()
            if [tuple(r) for r in rows] != [(partition, epoch)]:
                raise Fenced([partition])
            for table in ("actorkeep_frames", "actorkeep_images", "actorkeep_alarms"):
                self._conn.execute(f"DELETE FROM {table} WHERE address = %s", (address,))

    @_locked
    def frames(self, address: str, after: int = 0) -> list[tuple[int, bytes]]:
        """``(seq, data)`` of the actor's durable writes after ``after``, in order."""
        rows = self._conn.execute(
            "SELECT seq, data FROM actorkeep_frames WHERE address = %s AND seq > %s ORDER BY seq",
            (address, after),
        ).fetchall()
        return [(seq, bytes(data)) for seq, data in rows]

    @_locked
    def owners(self) -> dict[int, tuple[str, str | None]]:
        """``{partition: (owner, its internal address)}`` of every lease not expired by
        PostgreSQL's clock (the address is None if the owner never gave one)."""
        rows = self._conn.execute(
            "SELECT l.partition, l.owner, h.address FROM actorkeep_leases l "
            "LEFT JOIN actorkeep_hosts h ON h.host_id = l.owner "
            "WHERE l.owner IS NOT NULL AND l.expires_at > clock_timestamp()"
        ).fetchall()
        return {int(p): (owner, address) for p, owner, address in rows}

    @_locked
    def lease_of(self, partition: int) -> tuple[str | None, int]:
        """``(owner, epoch)`` of a partition as PostgreSQL has it (an owner whose lease has
        expired is still named)."""
        row = self._conn.execute(
            "SELECT owner, epoch FROM actorkeep_leases WHERE partition = %s", (partition,)
        ).fetchone()
        if row is None:
            raise ValueError(f"no partition {partition} (the cluster has {self.partitions})")
        return row[0], row[1]
