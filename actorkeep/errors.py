"""Exceptions raised by the runtime and by calls between actors (docs/reference.md §13)."""

from __future__ import annotations


class ActorkeepError(Exception):
    """Base class of every actorkeep error."""


class RemoteError(ActorkeepError):
    """A call was answered with an error status (the remote event failed or refused)."""

    def __init__(self, status: int, error: str, message: str) -> None:
        super().__init__(f"{status} {error}: {message}")
        self.status = status
        self.error = error
        self.message = message


class BadRequest(RemoteError, ValueError):
    """400 or 413: the callee refused what it was given."""


class Forbidden(RemoteError):
    """403: the callee refuses this caller."""

    def __init__(self, message: str = "forbidden", error: str = "Forbidden") -> None:
        super().__init__(403, error, message)


class Overloaded(RemoteError):
    """503: the callee has too many waiting events; try again after ``retry_after`` seconds."""

    def __init__(self, message: str = "actor overloaded", retry_after: float = 1.0) -> None:
        super().__init__(503, "Overloaded", message)
        self.retry_after = retry_after


class ReentryError(RemoteError):
    """508: the callee is already in the call chain; the call would wait on itself forever."""

    def __init__(self, message: str) -> None:
        super().__init__(508, "ReentryError", message)


class Quarantined(RemoteError):
    """503: the callee's storage is damaged; it takes no events until an operator releases
    it (docs/reliability.md, "Damaged storage")."""

    def __init__(self, message: str) -> None:
        super().__init__(503, "Quarantined", message)


class StorageDamaged(ActorkeepError):
    """An actor's (or the host's) database is damaged: missing or emptied after it existed,
    its write-ahead log gone with commits in it, a failed integrity check, or data that fails
    its own checksum. Raise it from an event to have the host quarantine the actor."""

    def __init__(self, reason: str, where: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.where = where


class CallTimeout(ActorkeepError):
    """The callee did not answer in time. Its event may still run and its effects may apply."""


class OutcomeUnknown(CallTimeout):
    """The event reached the host serving the actor, but how it ended is not known: the host
    died or stopped, lost its lease, or its durable writes' commit to the cluster's store did
    not end. As after a ``CallTimeout``, it may have run and its writes may be durable. Outside
    clients get 503 with Retry-After."""

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


class MigrationError(ActorkeepError):
    """An actor's schema migration failed (``number`` and ``name`` say which; its database
    was left at ``version``), or its database is at a version its class does not know (a
    downgrade: ``number`` is None). The event that opened the actor fails with it."""

    def __init__(
        self,
        message: str,
        *,
        address: str,
        version: int,
        number: int | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(message)
        self.address = address
        self.version = version
        self.number = number
        self.name = name


class HostClosed(ActorkeepError):
    """The host is shutting down or closed and takes no new events."""


def error_for_status(status: int, error: str, message: str) -> RemoteError | OutcomeUnknown:
    """The exception a calling actor sees for an error reply."""
    if status in (400, 413):
        return BadRequest(status, error, message)
    if status == 403:
        return Forbidden(message, error)
    if status == 503:
        if error == "OutcomeUnknown":
            return OutcomeUnknown(message)
        return Quarantined(message) if error == "Quarantined" else Overloaded(message)
    if status == 508:
        return ReentryError(message)
    return RemoteError(status, error, message)
