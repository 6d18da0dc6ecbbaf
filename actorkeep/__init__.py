"""actorkeep: durable actors on one machine.

Each actor owns one SQLite file and one durable alarm, handles one event at a time, and calls
other actors with a caller identity the host vouches for. See docs/getting-started.md.
"""

from . import codec, kv, queue, testing
from .actor import Actor
from .app import App
from .errors import (
    ActorkeepError,
    BadRequest,
    CallTimeout,
    Forbidden,
    HostClosed,
    MigrationError,
    OutcomeUnknown,
    Overloaded,
    Quarantined,
    ReentryError,
    RemoteError,
    StorageDamaged,
)
from .http import Headers, Request, Response
from .migrations import Migration, MigrationSql
from .outbox import Outbox, OutboxActor
from .routing import route, rpc, websocket
from .runtime.activation import current_actor
from .runtime.clock import Clock
from .runtime.host import Host
from .runtime.storage import FileStorage
from .schedules import AlarmInfo, Missed, Schedule, ScheduleRun, next_cron
from .sql import Sql
from .ws import WebSocket

__all__ = [
    "Actor",
    "ActorkeepError",
    "AlarmInfo",
    "App",
    "BadRequest",
    "CallTimeout",
    "Clock",
    "FileStorage",
    "Forbidden",
    "Headers",
    "Host",
    "HostClosed",
    "Migration",
    "MigrationError",
    "MigrationSql",
    "Missed",
    "Outbox",
    "OutboxActor",
    "OutcomeUnknown",
    "Overloaded",
    "Quarantined",
    "ReentryError",
    "RemoteError",
    "Request",
    "Response",
    "Schedule",
    "ScheduleRun",
    "Sql",
    "StorageDamaged",
    "WebSocket",
    "codec",
    "current_actor",
    "kv",
    "next_cron",
    "queue",
    "route",
    "rpc",
    "testing",
    "websocket",
]
