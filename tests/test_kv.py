"""KV shards and the ak.kv client (docs/reference.md §7, docs/decisions/0007-kv.md)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import msgpack
import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

import actorkeep as ak
import shards
from actorkeep.testing import open_host
from actorkeep.wire import kv as kv_wire
from shards.kv import EXPIRY_BATCH, VERSION_BLOCK, list_query, prefix_end

from .conftest import sqlite_files
from .kvutil import SHARDS, kvop, make_app

# -- placement ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [  # FNV-1a 64 reference vectors
        (b"", 0xCBF29CE484222325),
        (b"a", 0xAF63DC4C8601EC8C),
        (b"foobar", 0x85944171F73967E8),
        (b"chongo was here!\n", 0x46810940EFF5F915),
    ],
)
def test_fnv1a_vectors(data: bytes, expected: int) -> None:
    assert ak.kv.shard_for(data, 1 << 64) == expected
    assert ak.kv.shard_for(data, 16) == expected % 16


@given(st.text(max_size=50), st.integers(min_value=1, max_value=1000))
def test_placement_str_is_utf8_and_in_range(key: str, n: int) -> None:
    i = ak.kv.shard_for(key, n)
    assert 0 <= i < n
    assert i == ak.kv.shard_for(key.encode(), n)


def test_placement_spreads_keys() -> None:
    counts = [0] * 16
    for i in range(16_000):
        counts[ak.kv.shard_for(f"user:{i}", 16)] += 1
    assert min(counts) > 800 and max(counts) < 1200


def test_client_addresses() -> None:
    kv = ak.kv.Client("kv", shards=16)
    assert kv.address_of("foobar") == f"kv/shard-{0x85944171F73967E8 % 16}"
    with pytest.raises(ValueError):
        ak.kv.Client("Bad Name")
    with pytest.raises(ValueError):
        ak.kv.Client("kv", shards=0)


# -- operations --------------------------------------------------------------------------------


async def test_put_get_delete_versions(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(make_app(), data_dir) as host:
        assert await kvop(host, "u", "get", key=b"a") == ["ok", None]
        v1 = (await kvop(host, "u", "put", key=b"a", value=b"1"))[1]
        assert await kvop(host, "u", "get", key="a") == ["ok", [b"a", b"1", v1, None]]
        v2 = (await kvop(host, "u", "put", key=b"a", value=b"2"))[1]
        assert v2 > v1
        assert await kvop(host, "u", "get_fresh", key=b"a") == ["ok", [b"a", b"2", v2, None]]
        assert await kvop(host, "u", "delete", key=b"a") == ["ok", True]
        assert await kvop(host, "u", "delete", key=b"a") == ["ok", False]
        v3 = (await kvop(host, "u", "put", key=b"a", value=b"3"))[1]
        assert v3 > v2  # not reused after a delete


async def test_compare_and_set(data_dir: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with open_host(make_app(), data_dir) as host:
        v1 = (await kvop(host, "u", "cas", key=b"k", expect="ABSENT", value=b"1"))[1]
        assert await kvop(host, "u", "cas", key=b"k", expect="ABSENT", value=b"x") == [
            "Conflict",
            v1,
        ]
        v2 = (await kvop(host, "u", "cas", key=b"k", expect=v1, value=b"2"))[1]
        assert await kvop(host, "u", "cas", key=b"k", expect=v1, value=b"x") == ["Conflict", v2]
        v3 = (await kvop(host, "u", "cas", key=b"k", expect="ANY", value=b"3"))[1]
        assert v3 > v2
        # ABA: delete and re-create; the old version still loses.
        assert await kvop(host, "u", "delete_if", key=b"k", expect=v2) == ["Conflict", v3]
        assert await kvop(host, "u", "delete_if", key=b"k", expect=v3) == ["ok", True]
        v4 = (await kvop(host, "u", "cas", key=b"k", expect="ABSENT", value=b"3"))[1]
        assert await kvop(host, "u", "cas", key=b"k", expect=v3, value=b"x") == ["Conflict", v4]
        assert await kvop(host, "u", "cas", key=b"gone", expect=v4, value=b"x") == [
            "Conflict",
            None,
        ]
        assert await kvop(host, "u", "delete_if", key=b"gone", expect="ABSENT") == ["ok", False]
        assert await kvop(host, "u", "get", key=b"k") == ["ok", [b"k", b"3", v4, None]]


async def test_versions_survive_restarts_and_never_repeat(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    seen: list[int] = []
    async with open_host(make_app(), data_dir) as host:
        for round_ in range(3):
            for i in range(5):
                seen.append(
                    (await kvop(host, "u", "put", key=b"same", value=b"%d" % i, local=round_ == 1))[
                        1
                    ]
                )
            await host.restart()
    assert seen == sorted(seen) and len(set(seen)) == len(seen)
    # Each instance starts past the block reserved by the one before.
    assert seen[5] > seen[4] + VERSION_BLOCK - 10


async def test_lost_local_write_cannot_reuse_its_version(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Power loss may drop a local write and the counter's plain update: the durable
    reservation still keeps its version from being handed out again."""
    app = make_app()
    async with open_host(app, data_dir) as host:
        v_local = (await kvop(host, "u", "put", key=b"p", value=b"local", local=True))[1]
    shard = ak.kv.Client("kv", shards=SHARDS).address_of(b"p").split("/")[1]
    (path,) = [p for p in sqlite_files(data_dir) if p.name == f"{shard}.sqlite"]
    with sqlite3.connect(path) as conn:  # what power loss could leave: the row is gone
        conn.execute("DELETE FROM actorkeep_kv")
    async with open_host(app, data_dir) as host:
        v_next = (await kvop(host, "u", "put", key=b"p", value=b"other"))[1]
    assert v_next > v_local


async def test_list_merges_shards_with_cursor(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(make_app(), data_dir) as host:
        keys = sorted({f"item/{i:03d}".encode() for i in range(57)} | {b"other/1", b"item0"})
        for k in keys:
            await kvop(host, "u", "put", key=k, value=k[::-1], local=True)
        got: list[bytes] = []
        after = None
        pages = 0
        while True:
            _, entries, cursor = await kvop(
                host, "u", "list", prefix=b"item/", after=after, limit=10
            )
            got += [e[0] for e in entries]
            assert all(e[1] == e[0][::-1] for e in entries)
            pages += 1
            if cursor is None:
                break
            after = cursor
        assert got == [k for k in keys if k.startswith(b"item/")]
        assert pages == 6
        _, everything, cursor = await kvop(host, "u", "list", limit=1000)
        assert [e[0] for e in everything] == keys and cursor is None


@given(st.binary(max_size=4))
def test_prefix_end(prefix: bytes) -> None:
    end = prefix_end(prefix)
    for candidate in [prefix, prefix + b"\x00", prefix + b"\xff\xff", prefix[:-1]]:
        inside = candidate.startswith(prefix)
        below_end = end is None or candidate < end
        assert inside == (candidate >= prefix and below_end)


# -- expiry ------------------------------------------------------------------------------------


async def test_ttl_lazy_and_swept_by_alarm(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(make_app(), data_dir) as host:
        v = (await kvop(host, "u", "put", key=b"t", value=b"x", ttl=10))[1]
        _ok, entry = await kvop(host, "u", "get", key=b"t")
        assert entry[2] == v and entry[3] == pytest.approx(host.host.clock.now() + 10, abs=0.002)
        await trio.sleep(9.9)
        assert (await kvop(host, "u", "get", key=b"t"))[1] is not None
        await trio.sleep(0.2)
        assert await kvop(host, "u", "get", key=b"t") == ["ok", None]
        assert (await kvop(host, "u", "list"))[1] == []
        # An expired key is absent for expectations too.
        assert (await kvop(host, "u", "cas", key=b"t", expect="ABSENT", value=b"y"))[0] == "ok"


async def test_expiry_alarm_deletes_in_batches(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    app = ak.App()
    import shards as shards_pkg

    app.mount(shards_pkg.KVShard, "kv")
    kv = ak.kv.Client("kv", shards=1)
    counts: list[int] = []

    class Loader(ak.Actor):
        @ak.rpc
        async def load(self, n: int, ttl: float) -> None:
            for i in range(n):
                await kv.put(f"k{i:05d}", b"v", ttl=ttl + i / 1_000_000, local=True)

    app.mount(Loader, "loader")
    async with open_host(app, data_dir) as host:
        await host.request("POST", "/loader/l/_rpc/load", json={"n": 1200, "ttl": 50})
        await host.request("POST", "/loader/l/_rpc/load", json={"n": 1, "ttl": 500})  # k00000
        db = next(p for p in sqlite_files(data_dir) if "shard-0" in p.name)

        def rows() -> int:
            with sqlite3.connect(db) as conn:
                return int(conn.execute("SELECT count(*) FROM actorkeep_kv").fetchone()[0])

        assert rows() == 1200
        await trio.sleep(51)
        counts.append(rows())
        await trio.sleep(500)
        counts.append(rows())
    # 1199 expired at ~50 s: three sweep events of at most 500; k00000 was renewed to 500 s.
    assert counts == [1, 0]
    assert EXPIRY_BATCH == 500


# -- read cache --------------------------------------------------------------------------------


async def test_read_cache(data_dir: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with open_host(make_app(read_cache=5.0), data_dir) as host:
        v1 = (await kvop(host, "reader", "put", key=b"c", value=b"1"))[1]
        await kvop(host, "reader", "get", key=b"c")
        v2 = (await kvop(host, "writer", "put", key=b"c", value=b"2"))[1]
        # The reader's cache is stale for up to 5 s...
        assert (await kvop(host, "reader", "get", key=b"c"))[1][1:3] == [b"1", v1]
        assert (await kvop(host, "reader", "get_fresh", key=b"c"))[1][1:3] == [b"2", v2]
        v3 = (await kvop(host, "writer", "put", key=b"c", value=b"3"))[1]
        await trio.sleep(5.1)
        assert (await kvop(host, "reader", "get", key=b"c"))[1][1:3] == [b"3", v3]
        # ...and its own writes update it at once.
        v4 = (await kvop(host, "reader", "put", key=b"c", value=b"4"))[1]
        await kvop(host, "writer", "put", key=b"c", value=b"5")
        assert (await kvop(host, "reader", "get", key=b"c"))[1][1:3] == [b"4", v4]
        await kvop(host, "reader", "delete", key=b"c")
        assert (await kvop(host, "reader", "get", key=b"c"))[1] is None
        # Lost with the instance.
        await kvop(host, "writer", "put", key=b"c", value=b"6")
        await host.restart()
        assert (await kvop(host, "reader", "get", key=b"c"))[1][1] == b"6"


async def test_the_read_cache_holds_a_bounded_number_of_bytes(
    data_dir: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past its bytes of keys and values the cache lets its oldest reads go: with room for
    three values of 1 KiB, the first of five keys read is read from its shard again (fresh),
    the last from the cache (stale, within its 5 s)."""
    import actorkeep.kv

    monkeypatch.setattr(actorkeep.kv, "_CACHE_MAX_BYTES", 3 * (2 + 1024))
    async with open_host(make_app(read_cache=5.0), data_dir) as host:
        keys = [f"k{i}".encode() for i in range(5)]
        for k in keys:
            await kvop(host, "writer", "put", key=k, value=b"a" * 1024)
        for k in keys:
            await kvop(host, "reader", "get", key=k)
        for k in keys:
            await kvop(host, "writer", "put", key=k, value=b"b" * 1024)
        first = (await kvop(host, "reader", "get", key=keys[0]))[1][1]
        last = (await kvop(host, "reader", "get", key=keys[-1]))[1][1]
        assert (first, last) == (b"b" * 1024, b"a" * 1024)


# -- access and bad input ----------------------------------------------------------------------


async def test_outside_requests_are_refused_without_files(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(make_app(), data_dir) as host:
        frame = msgpack.packb({"key": b"a"})
        resp = await host.request(
            "POST",
            "/kv/shard-0/actorkeep-kv/v2/get",
            body=frame,
            headers={"content-type": "application/msgpack", "x-actorkeep-caller": "user/u"},
        )
        assert resp.status == 403
        assert sqlite_files(data_dir) == []


async def test_allow_narrows_callers(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(make_app(allow=["jobs"]), data_dir) as host:
        resp = await host.request(
            "POST", "/user/u/_rpc/op", json={"name": "get", "args": {"key": "a"}}
        )
        assert resp.status == 500 and resp.json()["error"] == "Forbidden"
        ok = await host.call_as(
            "jobs/j",
            "kv/shard-0",
            "POST",
            "/actorkeep-kv/v2/get",
            msgpack.packb({"key": b"a"}),
            {"content-type": "application/msgpack"},
        )
        assert ok.status == 200


async def test_client_refuses_bad_input_before_any_call(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    app = make_app()
    kv = ak.kv.Client("kv", shards=SHARDS)
    messages: list[str] = []

    class Bad(ak.Actor):
        @ak.rpc
        async def run(self) -> list[str]:
            attempts: list[Any] = [
                lambda: kv.get(b"k" * 2049),
                lambda: kv.get(42),  # type: ignore[arg-type]
                lambda: kv.put(b"k", "str value"),  # type: ignore[arg-type]
                lambda: kv.put(b"k", b"v" * ((1 << 20) + 1)),
                lambda: kv.put(b"k", b"v", ttl=-1),
                lambda: kv.put(b"k", b"v", ttl=float("nan")),
                lambda: kv.compare_and_set(b"k", 0, b"v"),
                lambda: kv.compare_and_set(b"k", True, b"v"),
                lambda: kv.compare_and_set(b"k", "1", b"v"),  # type: ignore[arg-type]
                lambda: kv.list(limit=1001),
                lambda: kv.list(limit=0),
                lambda: kv.list(prefix=b"p" * 3000),
            ]
            for attempt in attempts:
                try:
                    await attempt()
                except ValueError as exc:
                    messages.append(str(exc))
            # The largest legal key and value go through: calls between actors are not
            # limited by the front's max_body.
            version = await kv.put(b"k" * 2048, b"v" * (1 << 20))
            entry = await kv.get(b"k" * 2048)
            assert entry is not None and entry.version == version
            return messages

    app.mount(Bad, "bad")
    async with open_host(app, data_dir) as host:
        resp = await host.request("POST", "/bad/b/_rpc/run")
        assert resp.status == 200
        assert len(resp.json()) == 12
        assert all("must" in m or "limit" in m for m in resp.json())


GOOD_GET = msgpack.packb({"key": b"a"})
MSGPACK_CT = {"content-type": "application/msgpack"}


async def test_malformed_frames_are_400_and_write_nothing(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    bad_frames: list[tuple[str, bytes]] = [
        ("get", b"\xc1"),
        ("get", msgpack.packb([1, 2])),
        ("get", msgpack.packb({})),
        ("get", msgpack.packb({"key": 5})),
        ("put", msgpack.packb({"key": b"a"})),
        ("put", msgpack.packb({"key": b"a", "value": "text"})),
        ("put", msgpack.packb({"key": b"a", "value": b"x", "expect": -1})),
        ("put", msgpack.packb({"key": b"a", "value": b"x", "ttl": 0})),
        ("put", msgpack.packb({"key": b"a", "value": b"x", "local": 1})),
        ("put", msgpack.packb({"key": b"a", "value": b"x", "zz": 1})),
        ("list", msgpack.packb({"limit": 5000})),
    ]
    async with open_host(make_app(), data_dir) as host:
        for op, body in bad_frames:
            resp = await host.call_as(
                "user/u",
                "kv/shard-0",
                "POST",
                f"/actorkeep-kv/v2/{op}",
                body,
                {"content-type": "application/msgpack"},
            )
            assert resp.status == 400, (op, body)
            assert resp.json()["error"] == "BadRequest"
        # An operation the protocol does not have: no such route.
        resp = await host.call_as(
            "user/u", "kv/shard-0", "POST", "/actorkeep-kv/v2/nope", GOOD_GET, MSGPACK_CT
        )
        assert resp.status == 404
        # Refused before the shard was opened: not even its file exists.
        assert sqlite_files(data_dir) == []
        await host.call_as("user/u", "kv/shard-0", "POST", "/actorkeep-kv/v2/get", GOOD_GET)
        (db,) = sqlite_files(data_dir)
        with sqlite3.connect(db) as conn:
            assert conn.execute("SELECT count(*) FROM actorkeep_kv").fetchone()[0] == 0
            assert conn.execute("SELECT seq FROM actorkeep_kv_meta").fetchone()[0] == 0


@given(st.sampled_from(["get", "put", "delete", "list", "put_now"]), st.binary(max_size=64))
def test_frame_decoder_never_fails_otherwise(op: str, body: bytes) -> None:
    try:
        frame = kv_wire.KV.ops[op].decode(body)
    except ValueError:
        return
    assert isinstance(frame, dict)


@given(
    st.sampled_from(["get", "put", "delete", "list"]),
    st.dictionaries(
        st.sampled_from(
            ["key", "value", "expect", "ttl", "local", "prefix", "after", "limit", "zz"]
        ),
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(-(2**63), 2**64 - 1),
            st.floats(),
            st.binary(max_size=8),
            st.text(max_size=8),
            st.lists(st.integers(-5, 5), max_size=2),
        ),
    ),
)
def test_frame_decoder_checks_every_field(op: str, fields: dict[str, Any]) -> None:
    try:
        frame = kv_wire.KV.ops[op].decode(msgpack.packb(fields))
    except ValueError:
        return
    if "key" in frame:
        assert isinstance(frame["key"], bytes) and len(frame["key"]) <= 2048
    if "value" in frame:
        assert isinstance(frame["value"], bytes)
    if frame.get("ttl") is not None:
        assert frame["ttl"] > 0
    if frame.get("expect") is not None:
        assert isinstance(frame["expect"], int) and frame["expect"] >= 0
    if "limit" in frame:
        assert 1 <= frame["limit"] <= 1000


class CountingShard(shards.KVShard):
    """A shard that counts the rows its ``list`` returns."""

    returned = 0

    @kv_wire.LIST.handler
    def list(self, frame: dict[str, Any]) -> dict[str, Any]:
        reply: dict[str, Any] = shards.KVShard.list.__wrapped__(self, frame)  # type: ignore[attr-defined]
        CountingShard.returned += len(reply["entries"])
        return reply


@pytest.mark.parametrize("limit", [1, 7, 100, 1000])
async def test_a_listing_fetches_about_its_own_size_from_the_shards(
    data_dir: Path, autojump_clock: trio.testing.MockClock, limit: int
) -> None:
    app = ak.App()
    app.mount(CountingShard, "kv", access="internal")
    kv = ak.kv.Client("kv", shards=16)

    class Lister(ak.Actor):
        @ak.rpc
        async def fill(self, n: int) -> None:
            for i in range(n):
                await kv.put(f"k/{i:05d}", b"v", local=True)

        @ak.rpc
        async def pages(self, limit: int) -> list[int]:
            sizes: list[int] = []
            after = None
            while True:
                page = await kv.list("k/", after=after, limit=limit)
                sizes.append(len(page.entries))
                if page.cursor is None:
                    return sizes
                after = page.cursor

    app.mount(Lister, "lister")
    keys = 3000
    async with open_host(app, data_dir) as host:
        filled = await host.request("POST", "/lister/a/_rpc/fill", json={"n": keys})
        assert filled.status == 200, filled.body
        CountingShard.returned = 0
        listed = await host.request("POST", "/lister/a/_rpc/pages", json={"limit": limit})
        assert listed.status == 200, listed.body
        sizes: list[int] = listed.json()
    assert sum(sizes) == keys
    assert all(size == limit for size in sizes[:-1])  # every page full but the last
    # A shard's share of each page, twice over, and two rows a shard for small pages.
    assert CountingShard.returned <= 2 * keys + 3 * 16 * len(sizes), CountingShard.returned


def test_a_page_deep_into_a_prefix_costs_what_the_first_one_does() -> None:
    """``list_query`` seeks to ``after``: counted in SQLite's own steps (its progress
    handler), page 200 of a prefix costs about what page 1 does."""
    conn = sqlite3.connect(":memory:")
    conn.execute(
        "CREATE TABLE actorkeep_kv (key BLOB PRIMARY KEY, value BLOB NOT NULL, "
        "version INTEGER NOT NULL, expires_at INTEGER, sum INTEGER) WITHOUT ROWID"
    )
    conn.execute(
        "CREATE INDEX actorkeep_kv_expiry ON actorkeep_kv (expires_at) WHERE expires_at IS NOT NULL"
    )
    conn.executemany(
        "INSERT INTO actorkeep_kv VALUES (?, 'v', 1, NULL, NULL)",
        [(b"p/%06d" % i,) for i in range(20_000)] + [(b"o/%06d" % i,) for i in range(100)],
    )

    def steps(after: bytes | None) -> int:
        count = 0

        def tick() -> int:
            nonlocal count
            count += 1
            return 0

        conn.set_progress_handler(tick, 10)
        sql, params = list_query(b"p/", after, 100, 0)
        rows = conn.execute(sql, params).fetchall()
        conn.set_progress_handler(None, 10)
        assert len(rows) == 101 and rows[0][0] > (after or b"")
        return count

    first, deep = steps(None), steps(b"p/%06d" % 19_800)
    assert deep <= 2 * first, (first, deep)
    assert steps(b"a") <= 2 * first  # an ``after`` below the prefix: its start
