"""The hosts' connections to the cluster's database: made with defaults that notice a dead network
in seconds, each used under a lock, and opened anew once broken or ended by the server."""

from __future__ import annotations

import contextlib
import select
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import structlog

__all__ = ["CONNECT_DEFAULTS", "Link", "NotSent", "connect", "ended_by_server"]

log = structlog.get_logger("actorkeep")

#: What the hosts' connections use unless the conninfo says otherwise: a host cut off from
#: PostgreSQL finds out in seconds (a statement whose packets go unanswered fails after
#: ``tcp_user_timeout``, an idle connection is probed), instead of after the kernel's minutes.
CONNECT_DEFAULTS = {
    "connect_timeout": "5",
    "tcp_user_timeout": "5000",
    "keepalives": "1",
    "keepalives_idle": "5",
    "keepalives_interval": "2",
    "keepalives_count": "3",
}


def connect(conninfo: str) -> psycopg.Connection[Any]:
    """A connection in autocommit mode, with ``CONNECT_DEFAULTS`` where ``conninfo`` is
    silent."""
    given = psycopg.conninfo.conninfo_to_dict(conninfo)
    extra = {k: v for k, v in CONNECT_DEFAULTS.items() if k not in given}
    return psycopg.connect(psycopg.conninfo.make_conninfo(conninfo, **extra), autocommit=True)


class NotSent(psycopg.OperationalError):
    """The store could not be reached: a new connection failed, so nothing of the call was
    sent (unlike a statement that failed on an open connection, whose outcome is unknown)."""


class Link:
    """One connection and the lock that serialises its use (the host calls the store from
    several sync threads at once). A broken connection (PostgreSQL restarted, failed over, or
    the network dropped it) is replaced at the next use: what it had in flight failed, its
    outcome unknown."""

    def __init__(self, conninfo: str, what: str) -> None:
        self.conninfo = conninfo
        self.what = what
        self.lock = threading.RLock()
        self._conn = connect(conninfo)
        self._closed = False
        self._depth = 0  # uses in progress on the thread holding ``lock``

    @contextlib.contextmanager
    def use(self) -> Iterator[psycopg.Connection[Any]]:
        """Hold the lock and give the connection, opened anew first if it is not (or no
        longer) usable: at the outermost use only, never between the statements of one
        transaction (a use inside another one gets the same connection)."""
        with self.lock:
            if self._closed:
                raise NotSent("the store is closed")
            if self._depth == 0:
                try:
                    self._revive()
                except psycopg.OperationalError as exc:
                    raise NotSent(f"could not connect to the cluster's store: {exc}") from exc
            self._depth += 1
            try:
                yield self.conn
            finally:
                self._depth -= 1

    def _revive(self) -> None:
        conn = self._conn
        reason = (
            "closed" if conn.closed else
            "broken" if conn.broken else
            "ended by the server" if ended_by_server(conn) else None
        )  # fmt: skip
        if reason is not None:
            log.info("connecting to the cluster's store again", connection=self.what,
                     reason=reason)  # fmt: skip
            conn.close()
            self._conn = connect(self.conninfo)

    @property
    def conn(self) -> psycopg.Connection[Any]:
        """The connection of the use in progress."""
        return self._conn

    def close(self) -> None:
        with self.lock:
            self._closed = True
            self._conn.close()


def ended_by_server(conn: psycopg.Connection[Any]) -> bool:
    """Whether the server has written to ``conn`` while it was idle, which it does to end it (a
    restart, a shutdown, a terminated backend). Read now, the next statement need not fail on
    it: a commit that fails has an unknown outcome, and a connection idle since PostgreSQL
    restarted would fail one for nothing."""
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN)
    return bool(poller.poll(0))
