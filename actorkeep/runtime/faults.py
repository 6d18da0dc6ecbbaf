"""Fault-injection hooks: how the simulator reaches into a running host (docs/reference.md §10).

A production host has none (``Host(faults=None)``, one attribute check per call). The simulator
passes an object with these methods to inject delayed and failed calls, late alarms and
BUGGIFY-style faults at the sites the runtime marks with ``host.buggify(site)``.
"""

from __future__ import annotations

from typing import Protocol


class FaultHooks(Protocol):
    """What ``Host(faults=...)`` calls. Every method must be deterministic under the seed."""

    async def before_call(self, chain: tuple[str, ...], address: str) -> None:
        """Runs before a call to ``address`` is delivered: may sleep (a delayed call) or raise
        ``Overloaded`` (a call refused before the callee saw it)."""

    def after_call(self, chain: tuple[str, ...], address: str) -> None:
        """Runs after the callee answered: may raise ``CallTimeout`` (a lost reply: the
        callee's event ran, the caller does not know)."""

    def alarm_delay(self, address: str) -> float:
        """Extra seconds before a due alarm is handed to its actor (an alarm firing late)."""

    def buggify(self, site: str) -> bool:
        """Whether the fault at ``site`` fires now."""


#: The runtime's BUGGIFY sites; each makes a legal but unusual thing happen.
SITES = {
    "host.evict-after-event": "evict an idle actor right after its event ends",
    "host.no-inline": "run an inline-safe handler on the actor's worker task instead",
    "host.alarm-event-fails": "the alarm event hits a storage error before the handler runs",
    "host.alarm-early-wake": "the scheduler wakes the next alarm before it is due",
    "kv.short-reservation": "a KV shard reserves versions one block of 2 at a time",
}
