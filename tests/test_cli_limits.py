"""``actorkeep serve`` keeps ``--max-active`` within what the open-file limit can hold."""

from __future__ import annotations

import resource

import pytest

from actorkeep import cli


def test_actors_and_connections_are_lowered_to_what_the_open_file_limit_holds() -> None:
    assert cli.fit_open_files(1_000, 1024, 1 << 20) == (1_000, 1024)
    assert cli.fit_open_files(1_000, 1024, resource.RLIM_INFINITY) == (1_000, 1024)
    # Five files an actor, one a socket, 100 kept for the rest (the io_uring's 36 among
    # them): 5,000 + 1,024 + 100 fit.
    kept = cli.FILES_RESERVED
    assert kept == 100
    assert cli.fit_open_files(1_000, 1024, 6_124) == (1_000, 1024)
    assert cli.fit_open_files(1_000, 1024, 6_123) == (1_000 - 1, 1024)
    # Too few: sockets get a quarter of what is left, actors the rest.
    budget = 20_000 - kept
    assert cli.fit_open_files(10_000, 1024, 20_000) == ((budget - 1024) // 5, 1024)
    assert cli.fit_open_files(10_000, 1024, 2_048) == ((1948 - 487) // 5, 487)
    assert cli.fit_open_files(10_000, 1024, 256) == ((156 - 39) // 5, 39)
    assert cli.fit_open_files(10_000, 1024, 10) == (1, 2)
    # A cluster host's actors hold one descriptor more (the log reader's).
    assert cli.fit_open_files(1_000, 1024, 6_124, cli.CLUSTER_FILES_PER_ACTOR) == (
        (6_124 - kept - 1024) // 6,
        1024,
    )
    for limit in (100, 256, 1024, 2048, 20_000):
        active, connections = cli.fit_open_files(10_000, 1024, limit)
        assert active * cli.FILES_PER_ACTOR + connections + kept <= max(limit, kept + 10)


class Limits:
    """A fake RLIMIT_NOFILE: ``max_soft`` is the largest soft limit the system accepts."""

    def __init__(self, soft: int, hard: int, max_soft: int) -> None:
        self.soft, self.hard, self.max_soft = soft, hard, max_soft

    def get(self, what: int) -> tuple[int, int]:
        return self.soft, self.hard

    def set(self, what: int, limits: tuple[int, int]) -> None:
        if limits[0] > self.max_soft:
            raise ValueError("current limit exceeds maximum limit")
        self.soft = limits[0]


@pytest.mark.parametrize(
    ("soft", "hard", "max_soft", "applies"),
    [
        (1024, 4096, 4096, 4096),  # Linux: up to the hard limit
        (20_000, 20_000, 20_000, 20_000),  # already there
        (256, resource.RLIM_INFINITY, 10_240, 10_240),  # macOS: no hard limit, OPEN_MAX
        (256, resource.RLIM_INFINITY, 100, 256),  # nothing accepted: keep what we have
    ],
)
def test_the_soft_limit_goes_as_high_as_the_system_lets_it(
    monkeypatch: pytest.MonkeyPatch, soft: int, hard: int, max_soft: int, applies: int
) -> None:
    limits = Limits(soft, hard, max_soft)
    monkeypatch.setattr(resource, "getrlimit", limits.get)
    monkeypatch.setattr(resource, "setrlimit", limits.set)
    assert cli._raise_open_file_limit() == applies
