"""``ak.App``: the registry of actor classes a host serves (docs/reference.md §2, §6)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Iterable
from typing import Any, Literal, TypeVar

from .actor import Actor
from .address import OPERATOR_CLASS, check_class_name
from .routing import RouteTable

Access = Literal["public", "internal"]
#: Who may bring an actor of a class into being: ``"anyone"``; only other ``"actors"`` (an
#: outside request for one with no storage yet is a 404); or, for outside requests, the names
#: in a collection or accepted by a function.
Create = Literal["anyone", "actors"] | Collection[str] | Callable[[str], bool]
A = TypeVar("A", bound=type[Actor])


def _creatable_from_outside(create: Create) -> Callable[[str], bool] | None:
    """``create`` as a test of a name an outside request may create; None: any name."""
    if create == "anyone":
        return None
    if create == "actors":
        return lambda name: False
    if isinstance(create, str):
        raise ValueError(f"create must be 'anyone', 'actors', names or a function, not {create!r}")
    if callable(create):
        return create
    if isinstance(create, Collection) and all(isinstance(n, str) for n in create):
        return frozenset(create).__contains__
    raise ValueError(f"create must be 'anyone', 'actors', names or a function, not {create!r}")


class ActorClass:
    """One registered class: its name, Python class, access rule, allowed callers and options."""

    __slots__ = ("access", "allow", "cls", "name", "options", "outside_creates", "routes")

    def __init__(
        self,
        name: str,
        cls: type[Actor],
        access: Access,
        allow: Iterable[str] | None,
        options: dict[str, Any],
        create: Create = "anyone",
    ) -> None:
        if access not in ("public", "internal"):
            raise ValueError(f"access must be 'public' or 'internal', not {access!r}")
        self.name = check_class_name(name)
        self.cls = cls
        self.access: Access = access
        self.allow = frozenset(check_class_name(c) for c in allow) if allow is not None else None
        self.options = options
        #: Whether an outside request may create the actor of a name (None: any name may).
        self.outside_creates = _creatable_from_outside(create)
        self.routes = RouteTable(cls)
        _check_websocket_handlers(cls, bool(self.routes.websockets))


def _check_websocket_handlers(cls: type[Actor], routes: bool) -> None:
    """``TypeError`` for a class whose WebSocket handlers could not run."""
    auto = cls.websocket_auto_reply
    if auto is not None and not (
        isinstance(auto, tuple) and len(auto) == 2 and all(isinstance(a, str) and a for a in auto)
    ):
        raise TypeError(f"{cls.__name__}.websocket_auto_reply must be (request, reply), two str")
    for handler in ("websocket_message", "websocket_close"):
        fn = getattr(cls, handler, None)
        if fn is not None and not inspect.iscoroutinefunction(fn):
            raise TypeError(f"{cls.__name__}.{handler} must be async def")
    if routes and getattr(cls, "websocket_message", None) is None:
        raise TypeError(f"{cls.__name__} has a @websocket route but no websocket_message")


class App:
    """The actor classes of an application."""

    def __init__(self) -> None:
        self.classes: dict[str, ActorClass] = {}

    def actor(
        self,
        name: str,
        access: Access = "public",
        allow: Iterable[str] | None = None,
        create: Create = "anyone",
    ) -> Callable[[A], A]:
        """Register the decorated ``ak.Actor`` subclass under ``name``."""

        def register(cls: A) -> A:
            self.mount(cls, name, access=access, allow=allow, create=create)
            return cls

        return register

    def mount(
        self,
        cls: type[Actor],
        name: str,
        access: Access = "public",
        allow: Iterable[str] | None = None,
        create: Create = "anyone",
        **options: Any,
    ) -> None:
        """Register a ready class (a KV shard, a queue, or any ``ak.Actor``) under ``name``.

        ``allow`` narrows the callers to actors of the listed classes (outside requests are then
        refused too). ``create`` says who may bring a new actor of the class into being:
        ``"anyone"`` (the default); ``"actors"``, so that outside requests reach only actors
        that already exist (404 for the rest, before anything is created); or the names (a
        collection, or a function of the name) that outside requests may create. ``options``
        are available to instances as ``self.options``.
        """
        if not (isinstance(cls, type) and issubclass(cls, Actor)):
            raise TypeError(f"{cls!r} is not a subclass of actorkeep.Actor")
        if name in self.classes:
            raise ValueError(f"actor class {name!r} is already registered")
        if name == OPERATOR_CLASS:
            raise ValueError(f"the actor class name {name!r} is the host operator's")
        cls.check_options(options)
        self.classes[name] = ActorClass(name, cls, access, allow, dict(options), create)
