"""``ak.testing``: run a real host in-process, on the test's trio clock (docs/reference.md §9)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any

import trio
import trio.testing

from .app import App
from .front import Front
from .http import Response
from .runtime.clock import Clock
from .runtime.host import Host
from .runtime.storage import FileStorage, StorageBackend


class TestHost:
    """A running host plus helpers to reach it as an outside client or as an actor.

    The host runs in a task of a nursery owned by ``open_host``, so ``restart()`` stops that
    task and starts a fresh one: nurseries stay properly nested however many hosts are open.
    """

    __test__ = False  # not a pytest test class

    def __init__(
        self, app: App, storage: StorageBackend, options: dict[str, Any], nursery: trio.Nursery
    ) -> None:
        self._app = app
        self._storage = storage
        self._options = options
        self._nursery = nursery
        self._stop_requested = trio.Event()
        self._stopped = trio.Event()
        self.host: Host
        self.front: Front

    async def _start(self) -> None:
        self.host = Host(self._app, self._storage, **self._options)
        self.front = Front(self.host)
        self._stop_requested = trio.Event()
        self._stopped = trio.Event()
        await self._nursery.start(self._run, self.host, self._stop_requested, self._stopped)

    @staticmethod
    async def _run(
        host: Host,
        stop_requested: trio.Event,
        stopped: trio.Event,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        try:
            async with host.open():
                task_status.started()
                await stop_requested.wait()
        finally:
            stopped.set()

    async def _stop(self) -> None:
        self._stop_requested.set()
        await self._stopped.wait()

    async def restart(self) -> None:
        """Close everything and open again from disk, like a process restart."""
        await self._stop()
        await self._start()

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        """A request from outside, through the same front logic as HTTP."""
        return await self.front.request(method, path, json=json, body=body, headers=headers)

    async def call_as(
        self,
        caller: str,
        address: str,
        method: str,
        path: str,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
        timeout: float | None = 30.0,
    ) -> Response:
        """A call from the actor ``caller`` (which need not exist) to ``address``."""
        return await self.host.call_as(caller, address, method, path, body, headers, timeout)


@contextlib.asynccontextmanager
async def open_host(
    app: App,
    data_dir: str | os.PathLike[str] | None = None,
    *,
    storage: StorageBackend | None = None,
    clock: Clock | None = None,
    **host_options: Any,
) -> AsyncIterator[TestHost]:
    """Open a host for ``app`` with its files under ``data_dir`` (or on ``storage``).

    Unlike ``actorkeep serve``, a test host shows outside requests the exception of a failed
    event (``debug=True``), so that tests can assert on it; pass ``debug=False`` to see what
    outside clients of a production host get.
    """
    host_options.setdefault("debug", True)
    if storage is None:
        if data_dir is None:
            raise TypeError("open_host needs data_dir or storage")
        # A worker thread looks like idleness to MockClock's autojump, which would then leap
        # to the next timer in the middle of every fsync: fsync inline under a MockClock.
        virtual = isinstance(trio.lowlevel.current_clock(), trio.testing.MockClock)
        storage = FileStorage(data_dir, in_thread=not virtual)
    if clock is not None:
        host_options["clock"] = clock
    async with trio.open_nursery() as nursery:
        test_host = TestHost(app, storage, host_options, nursery)
        await test_host._start()
        try:
            yield test_host
        finally:
            await test_host._stop()
