"""The world's side of the runtime's ``FaultHooks``: seeded call, alarm and BUGGIFY faults."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import trio

from actorkeep.errors import CallTimeout, Overloaded

if TYPE_CHECKING:
    from .world import Faults, World

#: FoundationDB's BUGGIFY odds: a site is enabled in a run with this probability ...
SITE_ENABLED_P = 0.25
#: ... and an enabled site fires this often.
SITE_FIRES_P = 0.25


class SimHooks:
    """Delays, refuses and loses calls between actors, makes alarms late and fires BUGGIFY
    sites, all drawn from one random stream of the seed.

    Calls from the world itself (``World.rpc``: the chain is just the world's address) and from
    outside (no chain) are left alone: the world plays the clients, faults act between actors.
    """

    def __init__(self, world: World, rng: random.Random, world_caller: str) -> None:
        self.world = world
        self.rng = rng
        self.world_chain = (world_caller,)
        self.sites: dict[str, bool] = {}  # site -> enabled in this run (drawn at first use)
        self.fired: dict[str, int] = {}

    @property
    def faults(self) -> Faults:
        return self.world.faults

    def _between_actors(self, chain: tuple[str, ...]) -> bool:
        return chain != self.world_chain

    async def before_call(self, chain: tuple[str, ...], address: str) -> None:
        f = self.faults
        if not self._between_actors(chain):
            return
        if f.call_delay_p > 0 and self.rng.random() < f.call_delay_p:
            await trio.sleep(self.rng.uniform(0.0, f.call_delay_max))
        if f.call_refuse_p > 0 and self.rng.random() < f.call_refuse_p:
            self.world.history.fault("call-refused", self.world.now(), to=address, by=chain[-1])
            raise Overloaded(f"sim: call to {address} refused")

    def after_call(self, chain: tuple[str, ...], address: str) -> None:
        f = self.faults
        if (
            f.reply_loss_p > 0
            and self._between_actors(chain)
            and self.rng.random() < f.reply_loss_p
        ):
            self.world.history.fault("reply-lost", self.world.now(), to=address, by=chain[-1])
            raise CallTimeout(f"sim: the reply of {address} was lost")

    def alarm_delay(self, address: str) -> float:
        f = self.faults
        if f.alarm_late_p > 0 and self.rng.random() < f.alarm_late_p:
            return self.rng.uniform(0.0, f.alarm_late_max)
        return 0.0

    def buggify(self, site: str) -> bool:
        if not self.faults.buggify:
            return False
        enabled = self.sites.get(site)
        if enabled is None:
            enabled = self.sites[site] = self.rng.random() < SITE_ENABLED_P
            if enabled:
                self.world.history.note(f"buggify site {site} enabled")
        if enabled and self.rng.random() < SITE_FIRES_P:
            self.fired[site] = self.fired.get(site, 0) + 1
            return True
        return False
