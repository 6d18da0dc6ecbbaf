"""Deleting an actor from a running host (``Host.remove``, behind ``actorkeep rm``).

Only an idle actor is deleted: no event running or waiting, no sync of its gate in flight, no
checkpoint, no alarm event queued or cooling down, no registration pending. Anything else is
refused (409), for the operator to try again, rather than cancelled under the actor's feet.

While it is deleted, the address takes no events (503, retry) and fires no alarm. Its registry
entry goes first, durably; then its file; then its quarantine and alarm index entries,
durably. So a crash (or a failed step) never leaves a registered actor without its file (which
the host would take for damage), a damaged file out of quarantine, nor an alarm in a file with
no entry to wake it. A crash before the file goes leaves the whole actor, which its next event
or its alarm takes up again; a crash after it leaves the alarm's entry, which ``rm`` run again
drops, and which, if the alarm comes first, starts an empty actor that finds no alarm (``rm``
deletes that too). Decision 0021.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from ..address import split_address
from ..app import ActorClass
from ..errors import BadRequest, RemoteError
from .activation import Activation
from .alarms import AlarmScheduler
from .backend import StorageBackend
from .dispatch import Dispatcher
from .registry import Quarantine, Registrar, Registry


class Remover:
    """Deletes idle actors of one open host."""

    def __init__(
        self,
        classes: Mapping[str, ActorClass],
        serves: Callable[[str], bool],
        dispatcher: Dispatcher,
        alarms: AlarmScheduler,
        registry: Registry,
        registrar: Registrar,
        quarantine: Quarantine,
        storage: StorageBackend,
        sync_host_db: Callable[[], Awaitable[None]],
    ) -> None:
        self._classes = classes
        self._serves = serves
        self._dispatcher = dispatcher
        self._alarms = alarms
        self._registry = registry
        self._registrar = registrar
        self._quarantine = quarantine
        self._storage = storage
        self._sync_host_db = sync_host_db

    async def remove(self, address: str, known: bool = False) -> int:
        """Delete the actor at ``address``: its alarm, its registry and quarantine entries,
        its database (``known``: it exists, whatever this host knows of it). How many bytes
        its files held. ``RemoteError``: 400 for a bad address, 404 for an actor that does
        not exist, 409 while it is busy or served elsewhere."""
        try:
            class_name, name = split_address(address)
        except ValueError as exc:
            raise BadRequest(400, "BadRequest", str(exc)) from None
        if class_name not in self._classes:
            raise RemoteError(404, "NotFound", f"no actor class {class_name!r}")
        if not self._serves(address):
            raise RemoteError(409, "NotHere", f"{address} is not served by this host")
        dispatcher = self._dispatcher
        act = dispatcher.activations.get(address)
        if act is None and not (
            known
            or self._registry.has(address)
            or address in self._quarantine
            or self._storage.exists(class_name, name)
            or self._alarms.index.get(address) is not None  # left by an rm a crash cut short
        ):
            raise RemoteError(404, "NotFound", f"no actor {address}")
        if dispatcher.sockets.count_of(address):  # their next messages would bring it back
            raise RemoteError(409, "Busy", f"{address} has open WebSockets: close them first")
        if self.busy(address, act):
            raise RemoteError(
                409, "Busy", f"{address} has events in flight: try again once it is idle"
            )
        dispatcher.removing.add(address)
        self._alarms.hold(address)
        try:
            if act is not None:
                dispatcher.activations.evict(act)  # its worker ends at its next step
                act.close_db()  # now: nothing runs on it, and its file is deleted next
            return await self.erase(address, class_name, name)
        finally:
            self._alarms.release(address, forget=False)  # if it is still there
            dispatcher.removing.discard(address)

    def busy(self, address: str, act: Activation | None) -> bool:
        """Whether ``address`` has anything in flight (``act``: its activation, if any)."""
        if address in self._dispatcher.removing or self._alarms.busy(address):
            return True
        if self._registrar.pending(address):
            return True
        if act is None:
            return False
        if act.current is not None or act.inbox or not act.parked or act.checkpointing:
            return True
        return act.gate is not None and act.gate.busy

    async def erase(self, address: str, class_name: str, name: str) -> int:
        """The registry forgets the actor, durably; its file goes; then its quarantine and
        alarm index entries, durably."""
        await self.forget(address)
        freed = await self.delete_database(class_name, name)
        await self.drop_entries(address)
        return freed

    async def forget(self, address: str) -> None:
        """Drop the actor's registry entry, durably."""
        self._registry.forget(address)
        await self._sync_host_db()

    async def delete_database(self, class_name: str, name: str) -> int:
        """Delete the actor's files, durably; how many bytes they held."""
        return await self._storage.remove_actor(class_name, name)

    async def drop_entries(self, address: str) -> None:
        """Drop the actor's quarantine and alarm index entries, durably (last: until the
        file is gone, a damaged actor stays quarantined and an alarm in it has its entry)."""
        self._quarantine.discard(address)
        self._alarms.release(address, forget=True)
        await self._sync_host_db()
