"""``ak.App``: the registry of actor classes a host serves (SPEC §2, §6)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Literal, TypeVar

from .actor import Actor
from .address import check_class_name
from .routing import Router

Access = Literal["public", "internal"]
A = TypeVar("A", bound=type[Actor])


class ActorClass:
    """One registered class: its name, Python class, access rule, allowed callers and options."""

    __slots__ = ("access", "allow", "cls", "name", "options", "router")

    def __init__(
        self,
        name: str,
        cls: type[Actor],
        access: Access,
        allow: Iterable[str] | None,
        options: dict[str, Any],
    ) -> None:
        if access not in ("public", "internal"):
            raise ValueError(f"access must be 'public' or 'internal', not {access!r}")
        self.name = check_class_name(name)
        self.cls = cls
        self.access: Access = access
        self.allow = frozenset(check_class_name(c) for c in allow) if allow is not None else None
        self.options = options
        self.router = Router(cls)

    @property
    def has_alarm(self) -> bool:
        return callable(getattr(self.cls, "alarm", None))


class App:
    """The actor classes of an application."""

    def __init__(self) -> None:
        self.classes: dict[str, ActorClass] = {}

    def actor(
        self, name: str, access: Access = "public", allow: Iterable[str] | None = None
    ) -> Callable[[A], A]:
        """Register the decorated ``ak.Actor`` subclass under ``name``."""

        def register(cls: A) -> A:
            self.mount(cls, name, access=access, allow=allow)
            return cls

        return register

    def mount(
        self,
        cls: type[Actor],
        name: str,
        access: Access = "public",
        allow: Iterable[str] | None = None,
        **options: Any,
    ) -> None:
        """Register a ready class (a KV shard, a queue, or any ``ak.Actor``) under ``name``.

        ``allow`` narrows the callers to actors of the listed classes (outside requests are then
        refused too). ``options`` are available to instances as ``self.options``.
        """
        if not (isinstance(cls, type) and issubclass(cls, Actor)):
            raise TypeError(f"{cls!r} is not a subclass of actorkeep.Actor")
        if name in self.classes:
            raise ValueError(f"actor class {name!r} is already registered")
        self.classes[name] = ActorClass(name, cls, access, allow, dict(options))
