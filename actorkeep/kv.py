"""``ak.kv``: the client of the KV shards (docs/kv.md, docs/reference.md).

Use it inside an actor's event: it calls the shards through the actor whose event is running,
by the actor's own call path (``self.actors.call``), with the frames of ``actorkeep.wire.kv``.

    kv = ak.kv.Client("kv", shards=16)
    version = await kv.put("settings/theme", b"dark")
    entry = await kv.get("settings/theme")
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Final

import trio

from . import codec
from .address import check_class_name
from .errors import RemoteError
from .hashing import fnv1a64
from .http import Response
from .runtime.activation import current_actor
from .wire import Op
from .wire import kv as wire
from .wire.kv import check_key, check_value

__all__ = [
    "ABSENT",
    "ANY",
    "Client",
    "Conflict",
    "Entry",
    "Page",
    "PutOptions",
    "shard_for",
]

_CACHE_ATTR: Final = "_actorkeep_kv_cache"
_CACHE_MAX_ENTRIES: Final = 10_000
#: Bytes of keys and values a read cache holds at most (per actor instance and KV class).
_CACHE_MAX_BYTES: Final = 4 << 20


class _Expectation:
    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return f"ak.kv.{self._name}"


#: Expect nothing: the write happens whatever the key holds.
ANY: Final = _Expectation("ANY")
#: Expect the key to be absent (or expired).
ABSENT: Final = _Expectation("ABSENT")

Expect = _Expectation | int


@dataclass(frozen=True, slots=True)
class Entry:
    """A live key: its value, its version, and when it expires (epoch seconds) or None."""

    key: bytes
    value: bytes
    version: int
    expires_at: float | None


@dataclass(frozen=True, slots=True)
class Page:
    """Entries in key byte order. ``cursor`` is the ``after`` of the next page; None at the end."""

    entries: list[Entry]
    cursor: bytes | None


@dataclass(frozen=True, slots=True)
class PutOptions:
    """``expect``: ANY, ABSENT or a version; ``ttl`` in seconds; ``local``: skip the fsync."""

    expect: Expect = ANY
    ttl: float | None = None
    local: bool = False


class Conflict(RemoteError):
    """409: the expectation failed and nothing was written. ``current_version`` is the live
    version of the key, or None if it is absent."""

    def __init__(self, message: str, current_version: int | None) -> None:
        super().__init__(409, "Conflict", message)
        self.current_version = current_version


def shard_for(key: bytes | str, n: int) -> int:
    """The shard of ``key``: FNV-1a 64-bit of the key bytes, mod ``n``."""
    data = key.encode() if isinstance(key, str) else key
    return 0 if n == 1 else fnv1a64(data) % n  # one shard: no hash


def _wire_expect(expect: object) -> int | None:
    if expect is ANY:
        return None
    if expect is ABSENT:
        return wire.EXPECT_ABSENT
    if isinstance(expect, bool) or not isinstance(expect, int) or expect < 1:
        raise ValueError(
            f"expect must be ak.kv.ANY, ak.kv.ABSENT or a version >= 1, not {expect!r}"
        )
    return expect


def _seconds(ms: int | None) -> float | None:
    return None if ms is None else ms / 1000


class Client:
    """Reads and writes keys spread over ``shards`` actors ``<class_name>/shard-<i>``.

    ``read_cache``: keep what this actor instance read for up to that many seconds (None: no
    cache). Reads of other actors' writes may then be that stale; this actor's own writes
    through the client update the cache. The cache is lost with the instance.
    ``timeout``: seconds each call to a shard may take (``CallTimeout`` after).
    ``via``: for tools outside any actor, what makes a call, ``await via(address, path,
    frame)``; by default the actor whose event is running calls.
    """

    def __init__(
        self,
        class_name: str = "kv",
        shards: int = 16,
        read_cache: float | None = None,
        timeout: float | None = 30.0,
        via: Callable[[str, str, bytes], Awaitable[Response]] | None = None,
    ) -> None:
        check_class_name(class_name)
        if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
            raise ValueError(f"shards must be a positive int, not {shards!r}")
        if read_cache is not None and not (read_cache > 0):
            raise ValueError("read_cache must be a positive number of seconds or None")
        self.class_name = class_name
        self.shards = shards
        self.read_cache = read_cache
        self.timeout = timeout
        self._addresses = [f"{class_name}/shard-{i}" for i in range(shards)]
        self._via = via

    def address_of(self, key: bytes | str) -> str:
        """The shard actor that holds ``key``."""
        return self._addresses[shard_for(check_key(key), self.shards)]

    # -- reads ----------------------------------------------------------------------------
    async def get(self, key: bytes | str) -> Entry | None:
        """The live entry of ``key``, or None. May come from the read cache."""
        k = check_key(key)
        if self.read_cache is not None:
            cache = self._cache()
            hit = cache.get(k)
            if hit is not None:
                entry, fetched_at = hit
                now = current_actor().now()
                if now - fetched_at <= self.read_cache:
                    if (
                        entry is not None
                        and entry.expires_at is not None
                        and entry.expires_at <= now
                    ):
                        return None
                    return entry
        return await self._get(k)

    async def get_fresh(self, key: bytes | str) -> Entry | None:
        """The live entry of ``key`` from its shard, bypassing (and refreshing) the read cache."""
        return await self._get(check_key(key))

    async def _get(self, k: bytes) -> Entry | None:
        reply = await self._call(k, wire.GET, {"key": k})  # k is checked
        found = reply["entry"]
        entry = None if found is None else Entry(k, found[0], found[1], _seconds(found[2]))
        self._remember(k, entry)
        return entry

    async def list(
        self, prefix: bytes | str = b"", after: bytes | str | None = None, limit: int = 100
    ) -> Page:
        """Live entries whose key starts with ``prefix`` and is greater than ``after``.

        Merges the shards in key byte order, fetching from each only about its share of the
        page: a full page unless the listing ends there (``cursor is None``).
        """
        checked = wire.LIST.check({"prefix": prefix, "after": after, "limit": limit})
        prefix, limit = checked["prefix"], checked["limit"]
        # Keys spread evenly over the shards: twice a shard's share of the page, so that one
        # round of asks nearly always fills it.
        batch = min(2 * limit // self.shards + 2, wire.MAX_LIMIT)
        rows: list[list[Any]] = []
        asks: list[tuple[int, bytes | None]] = [(i, checked["after"]) for i in range(self.shards)]
        waiting: dict[int, bytes] = {}  # the shards that have more rows: where each stopped
        while True:
            frames = [(i, {"prefix": prefix, "after": a, "limit": batch}) for i, a in asks]
            for (i, _), reply in zip(asks, await self._ask_shards(frames), strict=True):
                entries = reply["entries"]
                rows.extend(entries)
                if reply["more"] and entries:
                    waiting[i] = entries[-1][0]
                else:
                    waiting.pop(i, None)
            if not waiting:
                known = rows
                break
            # Up to the lowest key a shard with more rows stopped at, every row is known.
            bound = min(waiting.values())
            known = [row for row in rows if row[0] <= bound]
            if len(known) > limit:
                break
            asks = [(i, stop) for i, stop in waiting.items() if stop == bound]
        known.sort(key=lambda row: row[0])
        more = len(known) > limit
        entries = [Entry(r[0], r[1], r[2], _seconds(r[3])) for r in known[:limit]]
        return Page(entries, entries[-1].key if more else None)

    async def _ask_shards(
        self, asks: Sequence[tuple[int, dict[str, Any]]]
    ) -> Sequence[dict[str, Any]]:
        """``LIST`` frames to shards, all at once; their replies in the same order. The first
        error is raised as itself, and the other asks are cancelled."""
        replies: list[dict[str, Any]] = [{} for _ in asks]
        errors: list[Exception] = []

        async def ask(
            n: int, shard: int, frame: dict[str, Any], cancel_scope: trio.CancelScope
        ) -> None:
            try:
                replies[n] = await self._call_shard(self._addresses[shard], wire.LIST, frame)
            except Exception as exc:  # raised below as itself, not in an ExceptionGroup
                errors.append(exc)
                cancel_scope.cancel()

        async with trio.open_nursery() as nursery:
            for n, (shard, frame) in enumerate(asks):
                nursery.start_soon(ask, n, shard, frame, nursery.cancel_scope)
        if errors:
            raise errors[0]
        return replies

    # -- writes ---------------------------------------------------------------------------
    async def put(
        self, key: bytes | str, value: bytes, ttl: float | None = None, local: bool = False
    ) -> int:
        """Write ``value`` and return its new version. Durable unless ``local``."""
        return await self.put_with(key, value, PutOptions(ANY, ttl, local))

    async def put_with(self, key: bytes | str, value: bytes, options: PutOptions) -> int:
        """Write with an expectation; ``Conflict`` if it fails (nothing is written)."""
        k = check_key(key)
        v = check_value(value)
        ttl, local = wire.check_ttl(options.ttl), bool(options.local)
        # Every field checked above with the protocol's own checks (expect by _wire_expect).
        frame = {"key": k, "value": v, "expect": _wire_expect(options.expect), "ttl": ttl,
                 "local": local}  # fmt: skip
        try:
            # A local put without TTL runs in the caller's task when it can (put_now). Durable
            # puts go to put, on the shard's worker: with many callers that takes 1.35x the
            # puts per second of running them in the callers' tasks (bench/gates.py).
            op = wire.PUT_NOW if local and ttl is None else wire.PUT
            reply = await self._call(k, op, frame)
        except Conflict:
            self._forget(k)
            raise
        version: int = reply["version"]
        self._remember(k, Entry(k, v, version, _seconds(reply["expires_at"])))
        return version

    async def compare_and_set(self, key: bytes | str, expect: Expect, value: bytes) -> int:
        """Write only if the key is as ``expect`` says (ANY, ABSENT or a version)."""
        return await self.put_with(key, value, PutOptions(expect=expect))

    async def delete(self, key: bytes | str) -> bool:
        """Delete ``key``; True if a live key was deleted. Durable when it returns."""
        return await self.delete_if(key, ANY)

    async def delete_if(self, key: bytes | str, expect: Expect) -> bool:
        """Delete ``key`` if it is as ``expect`` says, else ``Conflict``."""
        k = check_key(key)
        try:
            frame = {"key": k, "expect": _wire_expect(expect)}  # both checked
            reply = await self._call(k, wire.DELETE, frame)
        except Conflict:
            self._forget(k)
            raise
        self._remember(k, None)
        deleted: bool = reply["deleted"]
        return deleted

    # -- plumbing -------------------------------------------------------------------------
    def _call(
        self, key: bytes, op: Op, frame: dict[str, Any]
    ) -> Coroutine[Any, Any, dict[str, Any]]:
        return self._call_shard(self._addresses[shard_for(key, self.shards)], op, frame)

    async def _call_shard(self, address: str, op: Op, frame: dict[str, Any]) -> dict[str, Any]:
        """``op`` of the shard at ``address`` with ``frame`` (its fields checked by the
        caller with the protocol's own checks)."""
        if self._via is not None:
            resp = await self._via(address, op.path, codec.pack(frame))
        else:
            resp = await current_actor().actors.call_op(address, op, frame, self.timeout)
        if resp.status == 409:
            err = resp.json()
            raise Conflict(str(err["message"]), err["current_version"])
        return op.result(resp)

    def _cache(self) -> _ReadCache:
        caches: dict[str, _ReadCache] = current_actor().__dict__.setdefault(_CACHE_ATTR, {})
        cache = caches.get(self.class_name)
        if cache is None:
            cache = caches[self.class_name] = _ReadCache()
        return cache

    def _remember(self, key: bytes, entry: Entry | None) -> None:
        if self.read_cache is not None:
            self._cache().put(key, entry, current_actor().now())

    def _forget(self, key: bytes) -> None:
        if self.read_cache is not None:
            self._cache().pop(key)


class _ReadCache:
    """What one actor instance read of one KV class, least recently stored first out: at most
    ``_CACHE_MAX_ENTRIES`` entries and ``_CACHE_MAX_BYTES`` of their keys and values."""

    __slots__ = ("entries", "size")

    def __init__(self) -> None:
        self.entries: OrderedDict[bytes, tuple[Entry | None, float]] = OrderedDict()
        self.size = 0

    def get(self, key: bytes) -> tuple[Entry | None, float] | None:
        return self.entries.get(key)

    def put(self, key: bytes, entry: Entry | None, at: float) -> None:
        self.pop(key)
        self.entries[key] = (entry, at)
        self.size += _footprint(key, entry)
        while len(self.entries) > _CACHE_MAX_ENTRIES or self.size > _CACHE_MAX_BYTES:
            old, (gone, _) = self.entries.popitem(last=False)
            self.size -= _footprint(old, gone)

    def pop(self, key: bytes) -> None:
        hit = self.entries.pop(key, None)
        if hit is not None:
            self.size -= _footprint(key, hit[0])


def _footprint(key: bytes, entry: Entry | None) -> int:
    return len(key) + (0 if entry is None else len(entry.value))
