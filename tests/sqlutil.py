"""Counting the rows a piece of code reads through ``actorkeep.Sql``."""

from __future__ import annotations

from typing import Any

import pytest

from actorkeep.sql import Sql


class _Rows:
    def __init__(self, rows: list[Any]) -> None:
        self._rows = rows

    def fetchall(self) -> list[Any]:
        return self._rows


def rows_read(monkeypatch: pytest.MonkeyPatch, prefix: str) -> list[int]:
    """From now on, each statement that starts with ``prefix`` (read with ``fetchall``)
    records how many rows it returned: the list they are appended to."""
    read: list[int] = []
    real_exec = Sql.exec

    def counted(self: Sql, sql: str, params: Any = (), **kw: Any) -> Any:
        cursor = real_exec(self, sql, params, **kw)
        if not sql.startswith(prefix):
            return cursor
        rows = cursor.fetchall()
        read.append(len(rows))
        return _Rows(rows)

    monkeypatch.setattr(Sql, "exec", counted)
    return read
