"""Who may call whom: the access rules of actor classes and the re-entry rule, checked before
any actor is created (docs/calls-and-access.md)."""

from __future__ import annotations

from collections.abc import Mapping

from ..address import OPERATOR
from ..app import ActorClass
from ..errors import ReentryError


class Access:
    """The access rules of an app's classes, with the host's overrides (``--access``)."""

    def __init__(
        self, classes: Mapping[str, ActorClass], overrides: Mapping[str, str] | None = None
    ) -> None:
        self.internal = {name for name, c in classes.items() if c.access == "internal"}
        for class_name, rule in (overrides or {}).items():
            if class_name not in classes:
                raise ValueError(f"--access names unknown actor class {class_name!r}")
            if rule not in ("internal", "public"):
                raise ValueError(f"access for {class_name!r} must be 'internal' or 'public'")
            (self.internal.add if rule == "internal" else self.internal.discard)(class_name)

    def refusal(self, actor_class: ActorClass, caller: str | None) -> str | None:
        """Why ``caller`` (None: from outside) may not call ``actor_class`` (a 403), or None.
        The host's operator (``OPERATOR``) may call every class."""
        name = actor_class.name
        if caller == OPERATOR:
            return None  # the host's operator (the admin API), whom no app can impersonate
        if caller is None:
            if name in self.internal:
                return f"actor class {name!r} is internal"
            if actor_class.cls.callers_only or actor_class.allow is not None:
                return f"actor class {name!r} answers only other actors"
        elif actor_class.allow is not None and caller.partition("/")[0] not in actor_class.allow:
            return f"actor class {name!r} does not answer {caller!r}"
        return None


def check_reentry(address: str, chain: tuple[str, ...]) -> None:
    """``ReentryError`` if ``address`` already waits in the call ``chain``."""
    if address in chain:
        raise ReentryError(f"{address} is already in the call chain {' -> '.join(chain)}")
