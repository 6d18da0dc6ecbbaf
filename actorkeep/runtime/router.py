"""The router: which host an address lives on, and the way every call and outside request
reaches it. One host serves every address today (``LocalRouter``); a cluster replaces it."""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Protocol

from ..http import Request, Response
from ..routing import Operation


class Target(Protocol):
    """A host that takes events for the addresses it serves."""

    async def deliver_here(
        self,
        class_name: str,
        name: str,
        request: Request,
        chain: tuple[str, ...],
        timeout: float | None,
    ) -> Response: ...

    async def call_rpc_here(
        self,
        caller: str,
        chain: tuple[str, ...],
        address: str,
        method: str,
        args: dict[str, Any],
        timeout: float | None,
    ) -> Any: ...

    async def call_op_here(
        self,
        caller: str,
        chain: tuple[str, ...],
        address: str,
        op: Operation,
        values: Mapping[str, Any],
        timeout: float | None,
    ) -> Response: ...

    def evict(self, address: str) -> bool: ...


class Router(Protocol):
    """Takes a request or an ``@rpc`` call to the host that serves its address."""

    async def deliver(
        self,
        class_name: str,
        name: str,
        request: Request,
        chain: tuple[str, ...],
        timeout: float | None,
    ) -> Response:
        """The reply of the actor ``class_name/name`` to ``request``."""

    async def call_rpc(
        self,
        caller: str,
        chain: tuple[str, ...],
        address: str,
        method: str,
        args: dict[str, Any],
        timeout: float | None,
    ) -> Any:
        """The result of ``@rpc method(**args)`` of ``address``."""

    async def call_op(
        self,
        caller: str,
        chain: tuple[str, ...],
        address: str,
        op: Operation,
        values: Mapping[str, Any],
        timeout: float | None,
    ) -> Response:
        """The reply of ``address`` to the protocol operation ``op`` with the frame
        ``values``: a ``ValueReply`` from an actor of this host, else a ``Response``."""

    def serves(self, address: str) -> bool:
        """Whether this host may run events of ``address`` now. An event that reaches the
        actor without the router (its alarm) runs only then (a cluster's host that no longer
        holds the actor's partition drops it: the owner fires it)."""


class LocalRouter:
    """Every address lives on this one host: its ``deliver``, ``call_rpc`` and ``call_op`` are
    the host's own ``*_here`` (bound once, so a call pays no frame here)."""

    def __init__(self, host: Target) -> None:
        self.host = host
        self.deliver: Callable[..., Coroutine[Any, Any, Response]] = host.deliver_here
        self.call_rpc: Callable[..., Coroutine[Any, Any, Any]] = host.call_rpc_here
        self.call_op: Callable[..., Coroutine[Any, Any, Response]] = host.call_op_here

    def serves(self, address: str) -> bool:
        return True
