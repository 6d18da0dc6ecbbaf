"""Runs (decision 0030): the events queued for an actor of a ``coalesce_writes`` class share
one SQLite transaction, which the worker opens when it takes an event with more queued behind
it and commits once nothing more of the run is queued. ``Sql`` keeps the rules inside a run
(what commits it early); the gate holds its syncs until the run commits."""

from __future__ import annotations

import structlog

from .activation import Activation

log = structlog.get_logger("actorkeep")

#: The most events of a run that share one transaction.
MAX_RUN = 64
#: Events that never run inside a run's transaction.
OUTSIDE_RUNS = frozenset({"alarm", "checkpoint"})


def begin_run(act: Activation) -> int:
    """Open a run's transaction for the events queued for ``act``; 1 if it is open, 0 if not
    (no instance yet: its database's opening, migrations and ``setup()`` run outside runs; or
    a transaction is open, or the gate has failed)."""
    sql, gate, db = act.sql, act.gate, act.db
    if sql is None or gate is None or db is None or act.instance is None or sql.in_run:
        return 0
    if db.conn.in_transaction or gate.failed is not None:
        return 0
    try:
        sql.begin_run(gate)
    except Exception as exc:  # the events run one transaction each, as without runs
        log.warning("could not begin a run", address=act.address, error=repr(exc))
        return 0
    return 1


def end_run(act: Activation) -> int:
    """Commit the run now (the worker parks, or takes an alarm or checkpoint event); 0."""
    sql = act.sql
    if sql is not None:
        try:
            sql.settle()
        except Exception as exc:  # the gate refuses what the run's writes hold
            log.error("a run's commit failed", address=act.address, error=repr(exc))
    return 0


def go_on_with_run(act: Activation, run: int) -> int:
    """After the ``run``-th event of a run: commit it once nothing more of it is queued (or
    it is ``MAX_RUN`` long, or the next event is no ordinary one); the run's length so far, 0
    if it has ended."""
    sql = act.sql
    if sql is None or not sql.in_run:
        return 0  # settled by the event, or its database closed
    inbox = act.inbox
    if inbox and run < MAX_RUN and inbox[0].kind not in OUTSIDE_RUNS and not act.closed:
        return run + 1
    return end_run(act)
