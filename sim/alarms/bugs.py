"""Planted alarm bugs: ``AlarmScheduler`` and ``Remover`` variants the alarm checker must catch
(the host runs with one through ``Host(alarm_scheduler=...)`` or ``Host(remover=...)``)."""

from __future__ import annotations

from actorkeep.runtime.activation import Activation
from actorkeep.runtime.alarms import AlarmScheduler
from actorkeep.runtime.gate import Gate
from actorkeep.runtime.removal import Remover

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


class RemoveWhileBusy(Remover):
    """Deletes an actor whatever it is doing: an event running on it loses its database."""

    def busy(self, address: str, act: Activation | None) -> bool:
        return False


class RemoveFilesFirst(Remover):
    """Deletes the file before the host database has durably forgotten the actor: power loss
    in between leaves a registered actor without its file, which the host takes for damage."""

    async def erase(self, address: str, class_name: str, name: str) -> int:
        freed = await self.delete_database(class_name, name)
        await self.forget(address)
        await self.drop_entries(address)
        return freed


class RemoveAlarmFirst(Remover):
    """Drops the alarm's entry before the file goes: a crash in between leaves an alarm in a
    file that nothing wakes until the actor's next event (the order ``rm`` first had, found
    by the alarm checker)."""

    async def erase(self, address: str, class_name: str, name: str) -> int:
        await self.drop_entries(address)
        await self.forget(address)
        return await self.delete_database(class_name, name)


class RemoveKeepsData(Remover):
    """Answers a deletion as done and forgets the actor, but leaves its file in place."""

    async def delete_database(self, class_name: str, name: str) -> int:
        return 0


ALARM_BUGS: dict[str, type[AlarmScheduler] | type[Gate] | type[Remover]] = {
    "early-alarm": EarlyAlarms,
    "plain-clear": PlainClearAlarms,
    "remove-while-busy": RemoveWhileBusy,
    "remove-files-first": RemoveFilesFirst,
    "remove-alarm-first": RemoveAlarmFirst,
    "remove-keeps-data": RemoveKeepsData,
    **GATE_BUGS,
}
