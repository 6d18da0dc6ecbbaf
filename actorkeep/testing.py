"""``ak.testing``: run a real host in-process, on the test's trio clock (docs/reference.md §9)."""

from __future__ import annotations

import contextlib
import os
from collections import deque
from collections.abc import AsyncIterator, Mapping
from typing import Any

import trio

from .app import App
from .front import Front
from .http import Response
from .runtime.clock import Clock, on_mock_clock
from .runtime.host import Host
from .runtime.sockets import POLICY, TOO_BIG, Sockets
from .runtime.storage import FileStorage, StorageBackend
from .ws import WebSocket


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

    @contextlib.asynccontextmanager
    async def websocket(
        self, path: str, *, headers: Mapping[str, str] | None = None
    ) -> AsyncIterator[TestSocket]:
        """Open a WebSocket to ``path`` (``/<class>/<name>/<route>?query``) in-process, through
        the same checks as an upgrade over HTTP: ``UpgradeRefused`` with the reply if it is
        refused. Closed (1000) on leaving, if it is still open."""
        raw_path, _, query = path.partition("?")
        client = TestSocket(self.host.sockets, self._nursery)
        resp, ws = await self.front.upgrade(raw_path, query, (headers or {}).items(), client.link)
        if ws is None:
            raise UpgradeRefused(resp)
        client.ws = ws
        try:
            yield client
        finally:
            if client.close_code is None:
                await client.close()

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


class UpgradeRefused(Exception):
    """``TestHost.websocket``: the upgrade was refused with ``response``."""

    def __init__(self, response: Response) -> None:
        super().__init__(f"upgrade refused: {response.status} {response.body[:200]!r}")
        self.response = response


class WebSocketClosed(Exception):
    """``TestSocket.receive``: the socket is closed, with ``code`` and ``reason``."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"closed {code}: {reason}")
        self.code = code
        self.reason = reason


class TestSocket:
    """The client's end of an in-process WebSocket (``TestHost.websocket``)."""

    __test__ = False

    def __init__(self, hub: Sockets, nursery: trio.Nursery) -> None:
        self._hub = hub
        self._nursery = nursery
        self.ws: WebSocket | None = None  # the actor's end
        self.link = _Link(self)
        #: Messages the actor sent that ``receive`` has not taken yet.
        self.received: deque[str | bytes] = deque()
        self.queued = 0  # their bytes
        self._arrived = trio.Event()
        #: Set once the socket is closed, by either side.
        self.close_code: int | None = None
        self.close_reason = ""

    async def send(self, message: str | bytes) -> None:
        """Send a message; returns once the actor's event for it has run."""
        ws = self.ws
        assert ws is not None
        if self.close_code is not None:
            raise WebSocketClosed(self.close_code, self.close_reason)
        if _size(message) > self._hub.limits.max_message:
            self._closed(TOO_BIG, "message too big")
            await self._hub.ended(ws, TOO_BIG, "message too big")
            return
        await self._hub.receive(ws, message)

    async def receive(self) -> str | bytes:
        """The next message the actor sent; ``WebSocketClosed`` once none is left and the
        socket is closed."""
        while not self.received:
            if self.close_code is not None:
                raise WebSocketClosed(self.close_code, self.close_reason)
            await self._arrived.wait()
            self._arrived = trio.Event()
        message = self.received.popleft()
        self.queued -= _size(message)
        return message

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """Close from the client's side: the actor's ``websocket_close`` runs, and this
        returns once it has."""
        ws = self.ws
        assert ws is not None
        if self.close_code is None:
            self._closed(code, reason)
            await self._hub.ended(ws, code, reason)

    def _closed(self, code: int, reason: str) -> None:
        if self.close_code is None:
            self.close_code, self.close_reason = code, reason
            self._arrived.set()


class _Link:
    """The host's side of a ``TestSocket`` (runtime/sockets.SocketLink)."""

    def __init__(self, client: TestSocket) -> None:
        self.client = client

    def send(self, message: str | bytes) -> None:
        client = self.client
        if client.close_code is not None:
            return
        client.queued += _size(message)
        if client.queued > client._hub.limits.send_buffer:  # the test reads too slowly
            client._closed(POLICY, "send buffer full: the client reads too slowly")
            assert client.ws is not None
            client._nursery.start_soon(client._hub.ended, client.ws, POLICY, client.close_reason)
            return
        client.received.append(message)
        client._arrived.set()

    def close(self, code: int, reason: str) -> None:
        self.client._closed(code, reason)


def _size(message: str | bytes) -> int:
    return len(message) if isinstance(message, bytes) else len(message.encode())


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
        virtual = on_mock_clock()
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
