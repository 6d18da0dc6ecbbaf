"""Shared fixtures: a data directory per test and pytest-trio's ``autojump_clock``."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    path = tmp_path / "data"
    path.mkdir()
    return path


def sqlite_files(root: Path) -> list[Path]:
    """Every actor database under a data directory."""
    return sorted((root / "actors").rglob("*.sqlite")) if (root / "actors").exists() else []
