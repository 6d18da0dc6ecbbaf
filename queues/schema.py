"""The tables of a queue actor, and the upgrade of a queue file made by an earlier version.

``actorkeep_queue`` holds the live messages. One time column, ``visible_at``, orders and
schedules everything (queue.py). A grouped message names the live message before it in its
group (``prev``), and ``actorkeep_queue_groups`` each group's last (groups.py); ``blocked`` is
1 for a message with a ``prev``: only its group's head is ever leased, so at most one message
of a group is leased at a time, in send order.
"""

from __future__ import annotations

from actorkeep import Sql

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS actorkeep_queue (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        body BLOB NOT NULL,
        enqueued_at REAL NOT NULL,
        visible_at REAL NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        last_error TEXT,
        priority INTEGER NOT NULL DEFAULT 0,
        leased INTEGER NOT NULL DEFAULT 0,
        key TEXT,
        grp TEXT,
        blocked INTEGER NOT NULL DEFAULT 0,
        expires_at REAL,
        max_attempts INTEGER,
        remember REAL,
        worker TEXT,
        prev INTEGER)""",
    # each group that has live messages, and its last one
    """CREATE TABLE IF NOT EXISTS actorkeep_queue_groups (
        grp TEXT PRIMARY KEY,
        tail INTEGER NOT NULL) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS actorkeep_queue_dead (
        id INTEGER PRIMARY KEY,
        body BLOB NOT NULL,
        enqueued_at REAL NOT NULL,
        attempts INTEGER NOT NULL,
        failed_at REAL NOT NULL,
        reason TEXT NOT NULL,
        priority INTEGER NOT NULL DEFAULT 0,
        key TEXT,
        grp TEXT,
        worker TEXT)""",
    "CREATE INDEX IF NOT EXISTS actorkeep_queue_dead_failed ON actorkeep_queue_dead (failed_at)",
    # keys remembered after their message was acked (send(..., remember=...))
    """CREATE TABLE IF NOT EXISTS actorkeep_queue_keys (
        key TEXT PRIMARY KEY,
        id INTEGER NOT NULL,
        until REAL NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS actorkeep_queue_keys_until ON actorkeep_queue_keys (until)",
    """CREATE TABLE IF NOT EXISTS actorkeep_queue_config (
        id INTEGER PRIMARY KEY CHECK (id = 0),
        consumer TEXT,
        batch_size INTEGER NOT NULL,
        visibility REAL NOT NULL,
        max_attempts INTEGER NOT NULL,
        backoff_base REAL NOT NULL,
        backoff_max REAL NOT NULL,
        dead_retention REAL,
        max_in_flight INTEGER,
        rate REAL,
        burst INTEGER)""",
    # the token bucket of Config.rate: tokens left at a time
    """CREATE TABLE IF NOT EXISTS actorkeep_queue_bucket (
        id INTEGER PRIMARY KEY CHECK (id = 0),
        tokens REAL NOT NULL,
        at REAL NOT NULL)""",
    # one send per occurrence of a recurring send: the last occurrence sent, by its key
    """CREATE TABLE IF NOT EXISTS actorkeep_queue_recurring (
        key TEXT PRIMARY KEY,
        sent_due REAL NOT NULL,
        id INTEGER NOT NULL)""",
)

INDEXES = (
    # the lease order, of the messages that may be leased: a message waiting behind its
    # group's head has no entry until it becomes the head (one insert, not a move). Push
    # delivery's next due time is read from it too (order.earliest_head).
    "CREATE INDEX IF NOT EXISTS actorkeep_queue_heads "
    "ON actorkeep_queue (priority DESC, visible_at, id) WHERE blocked = 0",
    # messages out of the queue's attempts (few): the dead-letter sweep and its due time. Only
    # messages leased before are in it, so a send and a group's promotion do not touch it.
    "CREATE INDEX IF NOT EXISTS actorkeep_queue_leased_before "
    "ON actorkeep_queue (attempts, visible_at) WHERE attempts > 0",
    # ... and out of their own
    "CREATE INDEX IF NOT EXISTS actorkeep_queue_own_attempts ON actorkeep_queue (visible_at) "
    "WHERE max_attempts IS NOT NULL AND attempts >= max_attempts",
    "CREATE UNIQUE INDEX IF NOT EXISTS actorkeep_queue_key ON actorkeep_queue (key) "
    "WHERE key IS NOT NULL",
    # the message after another in its group, found when that one leaves
    "CREATE INDEX IF NOT EXISTS actorkeep_queue_next ON actorkeep_queue (prev) "
    "WHERE prev IS NOT NULL",
    # the leases in flight (Config.max_in_flight)
    "CREATE INDEX IF NOT EXISTS actorkeep_queue_in_flight ON actorkeep_queue (visible_at) "
    "WHERE leased = 1",
    "CREATE INDEX IF NOT EXISTS actorkeep_queue_expires ON actorkeep_queue (expires_at) "
    "WHERE expires_at IS NOT NULL",
)

#: Columns added since the first version, with their declarations, by table.
_ADDED = {
    "actorkeep_queue": (
        ("key", "TEXT"),
        ("grp", "TEXT"),
        ("blocked", "INTEGER NOT NULL DEFAULT 0"),
        ("expires_at", "REAL"),
        ("max_attempts", "INTEGER"),
        ("remember", "REAL"),
        ("worker", "TEXT"),
        ("prev", "INTEGER"),
    ),
    "actorkeep_queue_dead": (("key", "TEXT"), ("grp", "TEXT"), ("worker", "TEXT")),
    "actorkeep_queue_config": (
        ("max_in_flight", "INTEGER"),
        ("rate", "REAL"),
        ("burst", "INTEGER"),
    ),
}
#: Indexes of earlier versions that later ones replaced.
_DROPPED = (
    "actorkeep_queue_order",
    "actorkeep_queue_visible",
    "actorkeep_queue_lease",
    "actorkeep_queue_due",
    "actorkeep_queue_attempts",
    "actorkeep_queue_heads_due",
    "actorkeep_queue_group",
)


def create(sql: Sql) -> None:
    """Create the tables (or bring a queue file of an earlier version up to date) in one
    transaction."""
    with sql.transaction():
        for statement in SCHEMA:
            sql.exec(statement)
        added: set[str] = set()
        for table, columns in _ADDED.items():
            have = {row[1] for row in sql.exec(f"PRAGMA table_info({table})").fetchall()}
            for name, declaration in columns:
                if name not in have:
                    sql.exec(f"ALTER TABLE {table} ADD COLUMN {name} {declaration}")
                    added.add(f"{table}.{name}")
        if "actorkeep_queue.prev" in added:
            _chain_groups(sql)
        for index in _DROPPED:
            sql.exec(f"DROP INDEX IF EXISTS {index}")
        for statement in INDEXES:
            sql.exec(statement)


def _chain_groups(sql: Sql) -> None:
    """Link the grouped messages of a file whose groups were an index of (group, id) (the
    version before chains): each names the one before it, each group its last."""
    # the earlier version's index, dropped after it served here
    sql.exec(
        "CREATE INDEX IF NOT EXISTS actorkeep_queue_group ON actorkeep_queue (grp, id) "
        "WHERE grp IS NOT NULL"
    )
    sql.exec(
        "UPDATE actorkeep_queue SET prev = w.before, blocked = 1 FROM (SELECT id, "
        "LAG(id) OVER (PARTITION BY grp ORDER BY id) AS before FROM actorkeep_queue "
        "WHERE grp IS NOT NULL) AS w WHERE actorkeep_queue.id = w.id AND w.before IS NOT NULL"
    )
    sql.exec(
        "INSERT OR REPLACE INTO actorkeep_queue_groups (grp, tail) "
        "SELECT grp, MAX(id) FROM actorkeep_queue WHERE grp IS NOT NULL GROUP BY grp"
    )


__all__ = ["INDEXES", "SCHEMA", "create"]
