"""What a run injects: the ``Faults`` a seed draws, and the world's side of the runtime's
``FaultHooks`` (seeded call, alarm and BUGGIFY faults)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import trio

from actorkeep.errors import CallTimeout, Overloaded

from .fault_schedule import FaultDecisions, FaultEvent
from .history import History


@dataclass
class Faults:
    """What the world injects on its own (the scenario adds timed crashes and power losses).

    ``fsync_delay_p``: the probability that a ``sync()`` takes virtual time (up to
    ``fsync_delay_max`` seconds), so that other events run meanwhile and a crash can land
    between a commit and its reply. ``crash_after_sync_p``: the probability that a host crashes
    right after a completed ``sync()`` (process crash, or power loss with
    ``power_loss_p``), restarting after a downtime up to ``downtime_max``; at most
    ``max_crashes`` such crashes per run. ``rollback_p``: per file, the chance that power loss
    rolls it back to its last durable image.

    Between actors (not on the world's own calls): ``call_delay_p`` delays a call by up to
    ``call_delay_max`` seconds; ``call_refuse_p`` refuses it with ``Overloaded`` before the
    callee sees it; ``reply_loss_p`` loses the reply (``CallTimeout`` after the callee ran).
    ``alarm_late_p`` hands a due alarm to its actor up to ``alarm_late_max`` seconds late.
    ``op_crash_p``: the probability that an operation the world invokes (``World.invoke``) is
    interrupted by a crash (a power loss with ``power_loss_p``) a few scheduler steps after it
    starts, at most ``max_crashes`` times a run (the pytest plugin's faults, whose tests take
    no virtual time for timed faults to land in).
    ``buggify`` enables the runtime's BUGGIFY sites (``actorkeep.runtime.faults.SITES``, and any
    ``self.buggify(site)`` in the app): each is enabled with probability 0.25 per run and
    then fires a quarter of the times it is reached.
    """

    fsync_delay_p: float = 0.0
    fsync_delay_max: float = 0.02
    crash_after_sync_p: float = 0.0
    power_loss_p: float = 0.5
    downtime_max: float = 1.0
    max_crashes: int = 2
    rollback_p: float = 0.5
    call_delay_p: float = 0.0
    call_delay_max: float = 0.05
    call_refuse_p: float = 0.0
    reply_loss_p: float = 0.0
    alarm_late_p: float = 0.0
    alarm_late_max: float = 2.0
    buggify: bool = False
    op_crash_p: float = 0.0

    def heal(self) -> None:
        """Stop injecting faults (slow fsyncs stay: they are not failures)."""
        self.crash_after_sync_p = 0.0
        self.call_delay_p = self.call_refuse_p = self.reply_loss_p = 0.0
        self.alarm_late_p = 0.0
        self.buggify = False
        self.op_crash_p = 0.0


#: The fault kinds a run can have; ``--faults`` picks a subset. Two are a cluster's (a single
#: host has neither): ``store``, the store's replies lost after the call took effect;
#: ``drop``, packets dropped for good (connections between hosts reset, calls to the store
#: lost before they reach it).
FAULT_KINDS = ("crash", "power", "fsync", "calls", "alarms", "buggify", "store", "drop")


def parse_faults(text: str) -> frozenset[str]:
    """``"all"``, ``"none"`` or a comma-separated subset of ``FAULT_KINDS``."""
    if text == "all":
        return frozenset(FAULT_KINDS)
    if text == "none":
        return frozenset()
    kinds = frozenset(k.strip() for k in text.split(",") if k.strip())
    unknown = kinds - set(FAULT_KINDS)
    if unknown:
        raise ValueError(f"unknown fault kinds {sorted(unknown)}; choose from {FAULT_KINDS}")
    return kinds


ALL_FAULTS = frozenset(FAULT_KINDS)


@dataclass
class FaultDraw:
    """A run's faults as drawn from its seed (then narrowed by ``--faults``)."""

    mode: str  # none / crash / power / mixed
    faults: Faults
    timed: int  # crashes or power losses at random moments

    @property
    def power_p(self) -> float:
        return self.faults.power_loss_p

    def summary(self) -> dict[str, object]:
        f = self.faults
        return {
            "faults": self.mode,
            "timed_faults": self.timed,
            "fsync_delay_p": f.fsync_delay_p,
            "crash_after_sync_p": f.crash_after_sync_p,
            "call_faults": (f.call_delay_p, f.call_refuse_p, f.reply_loss_p),
            "alarm_late_p": f.alarm_late_p,
            "buggify": f.buggify,
        }


def draw_faults(rng: random.Random, kinds: frozenset[str] = ALL_FAULTS) -> FaultDraw:
    """Draw a run's faults from ``rng``, then drop the kinds not in ``kinds``.

    Every draw is made whatever ``kinds`` is, so that narrowing the faults keeps the rest of
    the run's shape.
    """
    mode = rng.choices(["none", "crash", "power", "mixed"], [2, 3, 2, 3])[0]
    faults = Faults(
        fsync_delay_p=rng.choice([0.0, 0.3, 0.9]),
        fsync_delay_max=rng.choice([0.001, 0.02]),
        crash_after_sync_p=0.0 if mode == "none" else rng.choice([0.0, 0.02, 0.08]),
        power_loss_p={"none": 0.0, "crash": 0.0, "power": 1.0, "mixed": 0.5}[mode],
        max_crashes=2,
        rollback_p=rng.choice([0.5, 1.0]),
    )
    timed = 0 if mode == "none" else rng.randint(0, 3)
    calls = rng.random() < 0.6
    call_delay = (rng.choice([0.05, 0.2, 0.5]), rng.choice([0.001, 0.05]))
    call_fail = (rng.choice([0.0, 0.02, 0.05]), rng.choice([0.0, 0.02, 0.05]))
    late = rng.random() < 0.5
    late_p, late_max = rng.choice([0.2, 0.5]), rng.choice([0.1, 2.0])
    buggify = rng.random() < 0.5
    if mode != "none":
        if calls and "calls" in kinds:
            faults.call_delay_p, faults.call_delay_max = call_delay
            faults.call_refuse_p, faults.reply_loss_p = call_fail
        if late and "alarms" in kinds:
            faults.alarm_late_p, faults.alarm_late_max = late_p, late_max
        faults.buggify = buggify and "buggify" in kinds
    if "fsync" not in kinds:
        faults.fsync_delay_p = 0.0
    crash, power = "crash" in kinds, "power" in kinds
    if not crash and not power:
        mode, timed, faults.crash_after_sync_p = "none", 0, 0.0
    elif not power:
        faults.power_loss_p = 0.0
    elif not crash:
        faults.power_loss_p = 1.0
    return FaultDraw(mode, faults, timed)


#: FoundationDB's BUGGIFY odds: a site is enabled in a run with this probability ...
SITE_ENABLED_P = 0.25
#: ... and an enabled site fires this often.
SITE_FIRES_P = 0.25


class SimHooks:
    """Delays, refuses and loses calls between actors, makes alarms late and fires BUGGIFY
    sites, all drawn from one random stream of the seed, or, replaying a schedule, where
    ``decisions.schedule`` says (sim/fault_schedule.py).

    Calls from the world itself (``World.rpc``: the chain is just the world's address) and from
    outside (no chain) are left alone: the world plays the clients, faults act between actors.
    """

    def __init__(
        self,
        faults: Faults,
        history: History,
        now: Callable[[], float],
        rng: random.Random,
        world_caller: str,
        decisions: FaultDecisions | None = None,
    ) -> None:
        self.faults = faults
        self.history = history
        self.now = now
        self.rng = rng
        self.world_chain = (world_caller,)
        self.decisions = decisions if decisions is not None else FaultDecisions()
        self.sites: dict[str, bool] = {}  # site -> enabled in this run (drawn at first use)
        self.fired: dict[str, int] = {}
        self.healed = False

    def heal(self) -> None:
        """No more faults from here on (replaying a schedule, its later ones are skipped)."""
        self.healed = True

    def _between_actors(self, chain: tuple[str, ...]) -> bool:
        return chain != self.world_chain

    def _planned(self, kind: str, n: int, site: str = "") -> FaultEvent | None:
        return None if self.healed else self.decisions.planned(kind, n, site)

    async def before_call(self, chain: tuple[str, ...], address: str) -> None:
        f, d = self.faults, self.decisions
        if not self._between_actors(chain):
            return
        n = d.reach("call")
        if d.replaying:
            delay = self._planned("call-delay", n)
            refuse = self._planned("call-refused", n) is not None
            if delay is not None:
                d.take(delay)
                await trio.sleep(delay.value)
        else:
            if f.call_delay_p > 0 and self.rng.random() < f.call_delay_p:
                seconds = self.rng.uniform(0.0, f.call_delay_max)
                d.take(FaultEvent("call-delay", n, seconds))
                await trio.sleep(seconds)
            refuse = f.call_refuse_p > 0 and self.rng.random() < f.call_refuse_p
        if refuse:
            d.take(FaultEvent("call-refused", n))
            self.history.fault("call-refused", self.now(), to=address, by=chain[-1])
            raise Overloaded(f"sim: call to {address} refused")

    def after_call(self, chain: tuple[str, ...], address: str) -> None:
        f, d = self.faults, self.decisions
        if not self._between_actors(chain):
            return
        n = d.reach("reply")
        if d.replaying:
            lose = self._planned("reply-lost", n) is not None
        else:
            lose = f.reply_loss_p > 0 and self.rng.random() < f.reply_loss_p
        if lose:
            d.take(FaultEvent("reply-lost", n))
            self.history.fault("reply-lost", self.now(), to=address, by=chain[-1])
            raise CallTimeout(f"sim: the reply of {address} was lost")

    def alarm_delay(self, address: str) -> float:
        f, d = self.faults, self.decisions
        n = d.reach("alarm")
        if d.replaying:
            planned = self._planned("alarm-late", n)
            return d.take(planned).value if planned is not None else 0.0
        if f.alarm_late_p > 0 and self.rng.random() < f.alarm_late_p:
            late = self.rng.uniform(0.0, f.alarm_late_max)
            return d.take(FaultEvent("alarm-late", n, late)).value
        return 0.0

    def buggify(self, site: str) -> bool:
        d = self.decisions
        if d.replaying:
            if self.healed:
                return False
            n = d.reach(f"buggify:{site}")
            if n == 1 and self._planned("buggify-on", 1, site) is not None:
                d.take(FaultEvent("buggify-on", 1, site=site))
                self.history.note(f"buggify site {site} enabled")
            fires = self._planned("buggify", n, site) is not None
        else:
            if not self.faults.buggify:
                return False
            n = d.reach(f"buggify:{site}")
            enabled = self.sites.get(site)
            if enabled is None:
                enabled = self.sites[site] = self.rng.random() < SITE_ENABLED_P
                if enabled:
                    d.take(FaultEvent("buggify-on", 1, site=site))
                    self.history.note(f"buggify site {site} enabled")
            fires = enabled and self.rng.random() < SITE_FIRES_P
        if fires:
            d.take(FaultEvent("buggify", n, site=site))
            self.fired[site] = self.fired.get(site, 0) + 1
            return True
        return False
