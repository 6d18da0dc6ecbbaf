"""Calls between two actors of one host that need no HTTP shape: an ``@rpc`` method with its
arguments, and an operation of a ready class's protocol with its frame (``actorkeep.wire``,
decision 0028). The same rules as a call to the route (the callee's class and method, re-entry,
access, the arguments checked before the actor is woken, a copy of them for the callee), and
the same events; what they skip is the request, the route's lookup and, for an operation,
msgpack both ways.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import codec
from ..address import split_address
from ..app import ActorClass
from ..calls import decode_reply
from ..errors import BadRequest, Forbidden, RemoteError
from ..http import Response
from ..routing import Operation
from .access import Access, check_reentry
from .activations import Activations
from .dispatch import Dispatcher
from .handoff import Event, check_timeout
from .stats import HostStats


class DirectCalls:
    """The host's ``call_rpc_here`` and ``call_op_here``."""

    def __init__(
        self,
        classes: Mapping[str, ActorClass],
        activations: Activations,
        access: Access,
        dispatcher: Dispatcher,
        stats: HostStats,
    ) -> None:
        self._classes = classes
        self._activations = activations
        self._access = access
        self._dispatcher = dispatcher
        self._stats = stats

    def _callee(self, caller: str, chain: tuple[str, ...], address: str) -> tuple[ActorClass, str]:
        """The class and name of ``address``, once the call may go there."""
        act = self._activations.get(address)
        if act is not None:
            actor_class, name = act.actor_class, act.name
        else:
            class_name, name = split_address(address)
            found = self._classes.get(class_name)
            if found is None:
                raise RemoteError(404, "NotFound", f"no actor class {class_name!r}")
            actor_class = found
        if address in chain:
            self._stats.reentry_refused += 1
            check_reentry(address, chain)
        forbidden = self._access.refusal(actor_class, caller)
        if forbidden is not None:
            raise Forbidden(forbidden)
        return actor_class, name

    async def rpc(
        self,
        caller: str,
        chain: tuple[str, ...],
        address: str,
        method: str,
        args: dict[str, Any],
        timeout: float | None,
    ) -> Any:
        """``call_rpc`` on this host: the rules of a call to ``POST /_rpc/<method>`` with a
        msgpack body, without building an HTTP-shaped request (rpc handlers only see their
        arguments)."""
        check_timeout(timeout)
        actor_class, name = self._callee(caller, chain, address)
        rpc = actor_class.routes.rpcs.get(method)
        if rpc is None:
            no_route = f"{actor_class.name} has no route POST /_rpc/{method}"
            raise RemoteError(404, "NotFound", no_route)
        copied = codec.copy_args(args)  # the callee gets its own copy, as over HTTP
        try:
            rpc.check_args(copied)
        except ValueError as exc:
            raise BadRequest(400, "BadRequest", str(exc)) from None
        ev = Event.direct_rpc(rpc.fn, copied, chain, rpc.inline)
        reply = await self._dispatcher.dispatch(address, actor_class, name, ev, timeout)
        return decode_reply(reply)

    async def op(
        self,
        caller: str,
        chain: tuple[str, ...],
        address: str,
        op: Operation,
        values: Mapping[str, Any],
        timeout: float | None,
    ) -> Response:
        """``call_op`` on this host: the rules of a call to ``POST <op.path>`` with ``values``
        as its msgpack frame. Its reply: a ``ValueReply`` whose ``value`` the handler returned
        (the caller copies it before use), or the ``Response`` the handler or a failure gave."""
        check_timeout(timeout)
        actor_class, name = self._callee(caller, chain, address)
        found = actor_class.routes.direct.get(op.path)
        if found is None:
            raise RemoteError(404, "NotFound", f"{actor_class.name} has no route POST {op.path}")
        fn, inline = found
        try:  # the callee's own copy, checked as its route's parse would
            frame = op.checked(codec.copy_value(values), address)
        except ValueError as exc:
            raise BadRequest(400, "BadRequest", str(exc)) from None
        ev = Event.direct_call(fn, frame, chain, inline)
        return await self._dispatcher.dispatch(address, actor_class, name, ev, timeout)
