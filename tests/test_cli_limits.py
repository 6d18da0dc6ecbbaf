"""``actorkeep serve`` keeps ``--max-active`` within what the open-file limit can hold."""

from __future__ import annotations

import resource

import pytest

from actorkeep import cli


def test_max_active_is_lowered_to_what_the_open_file_limit_holds() -> None:
    assert cli.max_active_for(1_000, 1 << 20) == 1_000
    assert cli.max_active_for(1_000, resource.RLIM_INFINITY) == 1_000
    assert cli.max_active_for(10_000, 20_000) == (20_000 - 256) // 3  # three files an actor
    assert cli.max_active_for(10_000, 100) == 1


def test_the_soft_limit_goes_up_to_the_hard_one(monkeypatch: pytest.MonkeyPatch) -> None:
    raised: list[tuple[int, int]] = []
    monkeypatch.setattr(resource, "getrlimit", lambda what: (1024, 4096))
    monkeypatch.setattr(resource, "setrlimit", lambda what, limits: raised.append(limits))
    assert cli._raise_open_file_limit() == 4096
    assert raised == [(4096, 4096)]
