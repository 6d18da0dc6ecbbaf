"""Planted bugs: shard variants the checkers must catch (``python -m sim --bug NAME``)."""

from __future__ import annotations

from typing import Any

import actorkeep as ak
from actorkeep.runtime.activation import Activation
from actorkeep.runtime.alarms import AlarmScheduler
from shards import KVShard


class ReusingShard(KVShard):
    """Starts after the highest version in its table instead of after its durable
    reservation, so a restart (or eviction) after deleting the newest key reuses versions."""

    async def setup(self) -> None:
        await super().setup()
        (top,) = self.sql.exec("SELECT COALESCE(MAX(version), 0) FROM actorkeep_kv").fetchone()
        self._next_version = int(top) + 1
        self._reserved = 1 << 62


class BlindCasShard(KVShard):
    """Answers every compare-and-set as if its expectation held."""

    @staticmethod
    def conflict(expect: int | None, live: int | None) -> ak.Response | None:
        return None


class LazyDurableShard(KVShard):
    """Acknowledges durable puts after a plain write: power loss can drop them."""

    async def write(self, frame: dict[str, Any]) -> dict[str, Any] | ak.Response:
        return await super().write({**frame, "local": True})


BUGS: dict[str, type[KVShard]] = {
    "reuse-versions": ReusingShard,
    "blind-cas": BlindCasShard,
    "lazy-durable": LazyDurableShard,
}


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


#: Planted alarm bugs: the scheduler class the host runs with (``Host(alarm_scheduler=...)``).
ALARM_BUGS: dict[str, type[AlarmScheduler]] = {
    "early-alarm": EarlyAlarms,
    "plain-clear": PlainClearAlarms,
}
