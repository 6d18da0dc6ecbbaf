"""``ActorContext``: what an actor instance asks of the host that runs it.

``ak.Actor`` and ``self.actors`` are written against this protocol; the runtime's
``Activation`` implements it. Neither side imports the other's module.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import sqlalchemy

    from .http import Response
    from .routing import Operation
    from .ws import WebSocket


class ActorContext(Protocol):
    """One actor's link to its host: its clock, its alarm, its database, its calls."""

    address: str

    def now(self) -> float:
        """The host clock in epoch seconds."""

    @property
    def rng(self) -> random.Random:
        """The host's random number generator."""

    def buggify(self, site: str) -> bool:
        """Whether the simulator fires the fault at ``site`` now."""

    def count(self, counter: str, n: int, label: str) -> None:
        """Add ``n`` to the host's counter ``counter`` of the actor's class."""

    def sqlalchemy_connection(self) -> sqlalchemy.Connection:
        """A SQLAlchemy connection on the actor's database."""

    async def set_alarm(self, at: float, *, durable: bool, wait: bool) -> None:
        """Set the actor's one alarm."""

    def get_alarm(self) -> float | None:
        """The time the alarm is set for, or None."""

    async def delete_alarm(self, *, wait: bool) -> None:
        """Remove the alarm."""

    async def delete_all(self) -> None:
        """Drop everything the actor stored, and its alarm."""

    def websockets(self, tag: str | None) -> list[WebSocket]:
        """The actor's open WebSockets (with ``tag``, those tagged with it)."""

    async def call(
        self,
        address: str,
        method: str,
        path: str,
        body: bytes,
        headers: Mapping[str, str] | None,
        timeout: float | None,
    ) -> Response:
        """An HTTP-shaped call from this actor to ``address``."""

    async def call_rpc(
        self, address: str, method: str, args: dict[str, Any], timeout: float | None
    ) -> Any:
        """``@rpc method(**args)`` of ``address``, called by this actor."""

    async def call_op(
        self, address: str, op: Operation, values: Mapping[str, Any], timeout: float | None
    ) -> Response:
        """The protocol operation ``op`` of ``address`` with the frame ``values``, called by
        this actor: a ``ValueReply`` (within the host) or a ``Response``."""
