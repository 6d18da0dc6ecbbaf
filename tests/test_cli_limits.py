"""``actorkeep serve`` warns when the open-file limit cannot hold ``--max-active`` actors."""

from __future__ import annotations

import resource

import pytest
import structlog.testing

from actorkeep import cli


def test_the_shortfall_counts_three_files_an_actor() -> None:
    assert cli.open_file_shortfall(1_000, 1 << 20) is None
    assert cli.open_file_shortfall(1_000, resource.RLIM_INFINITY) is None
    assert cli.open_file_shortfall(10_000, 20_000) == 3 * 10_000 + 256 - 20_000


def test_serve_warns_when_the_limit_is_too_low(monkeypatch: pytest.MonkeyPatch) -> None:
    raised: list[tuple[int, int]] = []
    monkeypatch.setattr(resource, "getrlimit", lambda what: (1024, 4096))
    monkeypatch.setattr(resource, "setrlimit", lambda what, limits: raised.append(limits))
    with structlog.testing.capture_logs() as logs:
        cli._raise_open_file_limit(10_000)
        cli._raise_open_file_limit(1_000)
    assert raised == [(4096, 4096), (4096, 4096)]  # the soft limit goes up to the hard one
    (warning,) = logs
    assert warning["log_level"] == "warning" and warning["short_by"] == 30_256 - 4096
