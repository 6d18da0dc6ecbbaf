"""Planted runtime bugs every scenario's checkers must catch (``--bug NAME`` with any
``--scenario``): output gates that let what they hold out too soon (the host runs with one
through ``Host(gate=...)``)."""

from __future__ import annotations

from collections.abc import Callable

from actorkeep.runtime.gate import Gate


class EarlyReplyGate(Gate):
    """Never holds anything: a gated write's reply, and calls after it, leave before the write
    is durable, so power loss can undo what was acknowledged."""

    def _closes(self) -> bool:
        return False


class UnheldRunGate(Gate):
    """Starts a sync at a gated write of a run of events (decision 0030) before the run's
    transaction commits: the sync covers a write it cannot see, and the reply leaves."""

    def hold_syncs(self, settle: Callable[[], None]) -> None:
        pass


GATE_BUGS: dict[str, type[Gate]] = {"early-reply": EarlyReplyGate, "unheld-run": UnheldRunGate}
