"""``self.actors``: calls from one actor to another (docs/reference.md §5)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any

from . import codec
from .address import split_address
from .errors import error_for_status
from .http import Response, ValueReply

if TYPE_CHECKING:
    from .context import ActorContext
    from .routing import Operation

DEFAULT_TIMEOUT = 30.0


class ActorsClient:
    """Calls other actors on behalf of the actor it belongs to (``self.actors``)."""

    __slots__ = ("_ctx",)

    def __init__(self, ctx: ActorContext) -> None:
        self._ctx = ctx

    def call(
        self,
        address: str,
        method: str,
        path: str,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
    ) -> Coroutine[Any, Any, Response]:
        """Send an HTTP-shaped request to the actor at ``address`` and return its response.

        Raises ``ReentryError`` if ``address`` is already waiting in this call chain,
        ``Overloaded`` if it has too many waiting events, ``CallTimeout`` after ``timeout``
        seconds (the callee's event keeps running), and ``ValueError`` for a bad address.
        Any other outcome, errors included, is returned as a ``Response``.
        """
        return self._ctx.call(address, method, path, body, headers, timeout)

    def call_op(
        self,
        address: str,
        op: Operation,
        values: Mapping[str, Any],
        timeout: float | None = DEFAULT_TIMEOUT,
    ) -> Coroutine[Any, Any, Response]:
        """Call an operation of a ready class's protocol (``actorkeep.wire``) with ``values``
        as its frame: the SDK clients' way (``ak.kv``, ``ak.queue``). The same rules and
        errors as ``call`` to ``POST op.path`` with the packed frame; within the host the
        frame and the reply go as values, without msgpack (``op.result`` reads either)."""
        return self._ctx.call_op(address, op, values, timeout)

    def ref(self, address: str, timeout: float | None = DEFAULT_TIMEOUT) -> ActorRef:
        """A handle whose attributes call the ``@rpc`` methods of the actor at ``address``."""
        split_address(address)
        return ActorRef(self._ctx, address, timeout)


class ActorRef:
    """``await ref.method(**kwargs)`` calls ``@rpc method`` with msgpack-encoded arguments.

    An error reply raises ``RemoteError`` (or its subclasses, by status).
    """

    __slots__ = ("_address", "_ctx", "_methods", "_timeout")

    def __init__(self, ctx: ActorContext, address: str, timeout: float | None) -> None:
        self._ctx = ctx
        self._address = address
        self._timeout = timeout
        self._methods: dict[str, Callable[..., Awaitable[Any]]] = {}

    def __getattr__(self, method: str) -> Callable[..., Awaitable[Any]]:
        if method.startswith("_"):
            raise AttributeError(method)
        call = self._methods.get(method)
        if call is None:
            ctx, address, timeout = self._ctx, self._address, self._timeout

            def call(**kwargs: Any) -> Coroutine[Any, Any, Any]:
                return ctx.call_rpc(address, method, kwargs, timeout)

            call.__name__ = method
            self._methods[method] = call
        return call

    def __repr__(self) -> str:
        return f"<ActorRef {self._address}>"


def decode_reply(resp: Response) -> Any:
    """The result carried by an ``@rpc`` reply, or the exception its error status means."""
    if type(resp) is ValueReply:  # from an actor of this host: already the caller's copy
        return resp.value
    if resp.status < 400:
        return codec.decode_result(resp.body, codec.encoding_of(resp.headers.get("content-type")))
    try:
        err = resp.json()
        error, message = str(err["error"]), str(err["message"])
    except Exception:
        error, message = "RemoteError", resp.body[:200].decode("utf-8", "replace")
    raise error_for_status(resp.status, error, message)
