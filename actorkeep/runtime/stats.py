"""What a host counts as it runs: plain numbers bumped on the hot path (a dict entry or an
attribute each, no locks), read when metrics are scraped (``actorkeep/ops/metrics.py``)."""

from __future__ import annotations

from bisect import bisect_left

#: The most distinct (class, counter, label) keys of ``Actor.count`` a host keeps; counts for
#: keys beyond them are dropped (and counted), so that a label fed from data cannot make the
#: metrics grow without bound.
MAX_COUNTED = 10_000

#: Upper bounds (seconds) of the latency histograms' buckets; the last bucket is +Inf.
LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


class Histogram:
    """Counts of observed durations by bucket (``LATENCY_BUCKETS``, then +Inf), and their sum."""

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.sum += seconds

    @property
    def count(self) -> int:
        return sum(self.counts)

    def add(self, other: Histogram) -> None:
        """Add ``other``'s observations to this one."""
        for i, n in enumerate(other.counts):
            self.counts[i] += n
        self.sum += other.sum


#: The kinds of event counted (checkpoints, the runtime's own, are not).
KINDS = ("request", "rpc", "alarm", "websocket")


class ClassStats:
    """One actor class's events, by kind: how long each took, from its start on its actor to
    its reply (``latency``, whose count is how many ran), and how many failed (their handler
    raised, or their storage failed)."""

    __slots__ = ("failed", "latency")

    def __init__(self) -> None:
        self.latency = {kind: Histogram() for kind in KINDS}
        self.failed = dict.fromkeys(KINDS, 0)


class HostStats:
    """The host's counters (``classes``: each actor class's ``ClassStats``)."""

    def __init__(self) -> None:
        self.classes: dict[str, ClassStats] = {}
        #: Events refused because their actor's inbox was full (503 Overloaded).
        self.inbox_full = 0
        self.opens = 0  # actors' databases opened
        self.evictions = 0
        self.alarms_fired = 0  # alarm handlers run (retries included)
        self.alarms_retried = 0  # failed alarm handlers set to run again
        self.alarms_dropped = 0  # alarms given up after their last retry
        self.calls = 0  # calls between actors
        self.call_timeouts = 0  # calls whose caller stopped waiting
        self.reentry_refused = 0  # calls refused because they would re-enter a waiting actor
        #: ``Actor.count``: (class, counter, label) -> total.
        self.counted: dict[tuple[str, str, str], int] = {}
        self.counted_dropped = 0  # counts refused past MAX_COUNTED keys

    def count(self, class_name: str, counter: str, label: str, n: int) -> None:
        """Add ``n`` to an actor class's counter ``counter`` labelled ``label``."""
        key = (class_name, counter, label)
        total = self.counted.get(key)
        if total is not None:
            self.counted[key] = total + n
        elif len(self.counted) < MAX_COUNTED:
            self.counted[key] = n
        else:
            self.counted_dropped += 1

    def of_class(self, class_name: str) -> ClassStats:
        """The stats of ``class_name`` (made at its first event)."""
        found = self.classes.get(class_name)
        if found is None:
            found = self.classes[class_name] = ClassStats()
        return found
