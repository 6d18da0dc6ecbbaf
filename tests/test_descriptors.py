"""Out of file descriptors: 503 with Retry-After, never a 500 with a server path."""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import actorkeep as ak
from actorkeep.runtime.storage import FileDatabase, FileStorage
from actorkeep.testing import open_host

app = ak.App()


@app.actor("c")
class C(ak.Actor):
    @ak.rpc
    async def hi(self) -> str:
        return "hi"


class Exhausted(FileStorage):
    """Opening an actor fails as it does when no descriptor is left, until ``fail`` is off."""

    fail = True
    how = "oserror"

    def open_actor(self, class_name: str, name: str, existing: bool = False) -> FileDatabase:
        if self.fail:
            if self.how == "oserror":
                raise OSError(errno.EMFILE, "Too many open files", f"{self.root}/actors/x")
            exc = sqlite3.OperationalError("unable to open database file")
            exc.sqlite_errorcode = 14
            raise exc
        return super().open_actor(class_name, name, existing)


@pytest.mark.parametrize("how", ["oserror", "sqlite"])
async def test_running_out_of_descriptors_is_a_503_with_retry_after(
    data_dir: Path,
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
    how: str,
) -> None:
    storage = Exhausted(data_dir, in_thread=False)
    storage.how = how
    real_open = os.open

    def no_descriptors(path: Any, flags: int, *args: Any) -> int:
        if path == os.devnull:
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", no_descriptors)
    async with open_host(app, storage=storage, debug=False) as host:
        resp = await host.request("POST", "/c/a/_rpc/hi")
        assert resp.status == 503 and resp.headers["retry-after"] == "1"
        assert resp.json()["error"] == "Overloaded"
        assert str(data_dir) not in resp.body.decode()
        monkeypatch.setattr(os, "open", real_open)
        storage.fail = False
        assert (await host.request("POST", "/c/a/_rpc/hi")).json() == "hi"


async def test_an_open_that_fails_for_another_reason_is_not_called_overload(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    storage = Exhausted(data_dir, in_thread=False)
    storage.how = "sqlite"  # "unable to open", with descriptors to spare: not overload
    async with open_host(app, storage=storage, debug=False) as host:
        resp = await host.request("POST", "/c/a/_rpc/hi")
        assert resp.status == 500 and resp.json()["error"] == "InternalError"
        assert "unable to open" not in resp.body.decode()
