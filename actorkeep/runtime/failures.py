"""What the host does with an event that raised: roll back, log with an error id, answer 500
(without the exception to outside clients), or quarantine the actor whose storage is damaged."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import structlog
import trio

from ..errors import StorageDamaged
from ..http import Response, error_response
from .activation import Activation
from .registry import Quarantine
from .storage import is_damage

log = structlog.get_logger("actorkeep")


def quarantine_message(address: str) -> str:
    return (
        f"actor {address} is quarantined: its storage is damaged; it takes no events until "
        "an operator releases it (the host's log says what is wrong)"
    )


class Failures:
    """Failed events. ``take_out(act, message)`` closes a quarantined actor and refuses what
    waits for it; ``saved()`` makes the record of a quarantine durable soon. ``quarantine``
    is set when the host opens."""

    def __init__(
        self,
        rng: random.Random,
        debug: bool,
        take_out: Callable[[Activation, str], None],
        saved: Callable[[], None],
    ) -> None:
        self._rng = rng
        self.debug = debug
        self.quarantine_record: Quarantine | None = None
        self._take_out = take_out
        self._saved = saved
        self._fd_warned = -math.inf
        self._fd_refusals = 0

    def error_id(self) -> str:
        """A fresh id that ties an error an outside client sees to the host's log line."""
        return f"{self._rng.getrandbits(48):012x}"

    def failed(self, act: Activation, exc: Exception, outside: bool = False) -> Response:
        """A failed event: roll back, discard the instance, log, answer 500; or, if the
        failure says the actor's storage is damaged, quarantine it and answer 503."""
        try:
            act.rollback()
        except Exception:
            log.exception("rollback failed", address=act.address, file=act.where)
        act.discard_instance()
        ev = act.current
        act.class_stats.failed[ev.kind if ev is not None else "alarm"] += 1
        if is_damage(exc):
            return self.quarantine(act, exc)
        return self.error_reply(exc, "event failed", act.address, outside, act.where)

    def error_reply(
        self, exc: Exception, what: str, address: str, outside: bool, where: str | None = None
    ) -> Response:
        """Log a failure with a fresh error id and answer 500: with the exception to actors
        (and in debug mode), with only the id to outside clients."""
        error_id = self.error_id()
        log.error(
            what,
            address=address,
            error=type(exc).__name__,
            error_id=error_id,
            **({"file": where} if where is not None else {}),
            exc_info=exc,
        )
        if outside and not self.debug:
            return error_response(
                500, "InternalError", f"internal error; the host's log has id {error_id}"
            )
        return error_response(500, type(exc).__name__, str(exc))

    def quarantine(self, act: Activation, exc: Exception) -> Response:
        """Take a damaged actor out of service: it is closed, what waits for it is refused,
        and it takes no event (its alarm does not fire) until an operator releases it."""
        address = act.address
        reason = exc.reason if isinstance(exc, StorageDamaged) else f"SQLite says: {exc}"
        where = getattr(exc, "where", None) or act.where
        log.error(
            "actor quarantined: its storage is damaged",
            address=address,
            reason=reason,
            error_id=self.error_id(),
            **({"file": where} if where is not None else {}),
        )
        record = self.quarantine_record
        assert record is not None, "the host is open"
        try:
            record.add(address, reason)
            self._saved()
        except Exception:
            record.reasons[address] = reason  # in memory at least
            log.exception("could not record the quarantine", address=address)
        message = quarantine_message(address)
        self._take_out(act, message)
        return error_response(503, "Quarantined", message)

    def out_of_descriptors(self, address: str) -> None:
        """Opening ``address`` ran out of file descriptors: a warning at most every 10 s."""
        self._fd_refusals += 1
        now = trio.current_time()
        if now - self._fd_warned >= 10.0:
            log.warning(
                "out of file descriptors opening actors: answering 503; lower --max-active "
                "or raise `ulimit -n`",
                address=address,
                refused=self._fd_refusals,
            )
            self._fd_warned, self._fd_refusals = now, 0
