"""Planted alarm bugs: ``AlarmScheduler`` variants the alarm checker must catch (the host runs
with one through ``Host(alarm_scheduler=...)``)."""

from __future__ import annotations

from actorkeep.runtime.activation import Activation
from actorkeep.runtime.alarms import AlarmScheduler
from actorkeep.runtime.gate import Gate

from ..bugs import GATE_BUGS


class EarlyAlarms(AlarmScheduler):
    """Treats an alarm as due up to half a second before its time."""

    def horizon(self) -> float:
        return self.clock.now() + 0.5


class PlainClearAlarms(AlarmScheduler):
    """Drops a fired alarm's index entry at once, before the row's deletion is durable: power
    loss can then bring the row back with nothing to wake it (a bug the alarm checker found
    in actorkeep itself)."""

    async def forget_cleared(self, act: Activation, token: object) -> None:
        if self.still_cleared(act.address, token):
            self.index.remove(act.address)
        self.cleared(act.address, token)


ALARM_BUGS: dict[str, type[AlarmScheduler] | type[Gate]] = {
    "early-alarm": EarlyAlarms,
    "plain-clear": PlainClearAlarms,
    **GATE_BUGS,
}
