"""Fuzzing the outside front (docs/reference.md §6, §13): paths, actor names, methods, headers
(forged ``x-actorkeep-*`` ones among them), content types and bodies, through the same front
logic as HTTP (``Front.handle``, which the server calls with the raw path and header list).

Properties, for every request: no 5xx except the one handler that raises; a non-200 answer is
a JSON error; the host keeps answering; a refused (4xx) request creates no file and changes no
row in any database of the data directory; an actor never sees an ``x-actorkeep-*`` header or
a caller from outside, and sees every other header it was sent.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import string
import tempfile
from pathlib import Path
from typing import Any

import trio
import trio.testing
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import actorkeep as ak
from actorkeep import codec
from actorkeep.testing import open_host

from .conftest import sqlite_files

RESERVED = "x-actorkeep-"
MAX_BODY = 64

app = ak.App()


@app.actor("box")
class Box(ak.Actor):
    async def setup(self) -> None:
        self.sql.exec("CREATE TABLE IF NOT EXISTS log (n INTEGER PRIMARY KEY, v TEXT)")

    @ak.rpc
    async def put(self, value: Any = None) -> Any:
        self.sql.exec("INSERT INTO log (v) VALUES (?)", (repr(value),))
        return value

    @ak.rpc
    async def boom(self) -> None:
        raise RuntimeError("the handler error the fuzz may trigger")

    @ak.route("GET", "/who")
    async def who(self, req: ak.Request) -> ak.Response:
        return ak.Response.json({"caller": req.caller})

    @ak.route("GET", "/echo")
    @ak.route("POST", "/echo")
    async def echo(self, req: ak.Request) -> ak.Response:
        return ak.Response.json({"caller": req.caller, "headers": sorted(req.headers)})

    @ak.route("POST", "/items/{item}")
    async def item(self, req: ak.Request, item: str) -> ak.Response:
        return ak.Response(200, body=item.encode())


app.mount(Box, "hidden", access="internal")


# -- what the data directory holds ----------------------------------------------------------


def file_list(data: Path) -> set[str]:
    """Every file under the data directory (relative paths)."""
    return {p.relative_to(data).as_posix() for p in data.rglob("*") if p.is_file()}


def contents(data: Path) -> dict[str, dict[str, list[tuple[Any, ...]]]]:
    """Every row of every table of every database under the data directory, read from the
    side (read-only) while the host has them open."""
    out: dict[str, dict[str, list[tuple[Any, ...]]]] = {}
    for path in sorted(data.rglob("*.sqlite")):
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            tables = [
                t for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
            ]
            out[path.relative_to(data).as_posix()] = {
                t: sorted(conn.execute(f'SELECT * FROM "{t}"').fetchall(), key=repr) for t in tables
            }
        finally:
            conn.close()
    return out


# -- strategies -----------------------------------------------------------------------------

NAME_CHARS = string.ascii_letters + string.digits + "._~:@+=-"
classes = st.sampled_from(["box", "hidden", "nosuch", "Box", "b%6Fx", "_actorkeep", "", "%00"])
names = st.one_of(
    st.text(alphabet=NAME_CHARS, min_size=1, max_size=12),  # mostly valid
    st.sampled_from(
        [
            ".",
            "..",
            ".hidden",
            "",
            "a%2Fb",
            "%2E%2E",
            "%2e",
            "a%00b",
            "caf%C3%A9",
            "%",
            "%zz",
            "a b",
            "a%20b",
            "n" * 200,
            "n" * 201,
            "a\x00",
            "é",
            "a?b",
            "%3F",
        ]
    ),
    st.text(max_size=8),
)
rests = st.one_of(
    st.sampled_from(
        [
            "_rpc/put",
            "_rpc/boom",
            "_rpc/",
            "_rpc",
            "_rpc/nosuch",
            "_rpc/put/x",
            "echo",
            "who",
            "who/",
            "items/x",
            "items/",
            "items/a/b",
            "items/%2F",
            "",
            "%2e%2e/echo",
            "ECHO",
        ]
    ),
    st.text(alphabet="az/._%?#", max_size=10),
)
shaped_paths = st.builds(lambda c, n, r: f"/{c}/{n}/{r}", classes, names, rests)
free_paths = st.lists(st.one_of(classes, names, rests), min_size=0, max_size=5).map(
    lambda parts: "/" + "/".join(parts)
)
raw_paths = st.one_of(shaped_paths, shaped_paths, free_paths, st.just("/_actorkeep/health"))

forged_names = st.one_of(
    st.sampled_from(
        [
            "x-actorkeep-caller",
            "X-Actorkeep-Caller",
            "X-ACTORKEEP-CHAIN",
            "x-actorkeep-",
            "x-actorkeep-deadline",
            "X-ActorKeep-Caller",
        ]
    ),
    st.text(alphabet=string.ascii_letters + "-", min_size=1, max_size=8).map(
        lambda s: RESERVED + s
    ),
    st.lists(st.booleans(), min_size=18, max_size=18).map(
        lambda up: "".join(
            c.upper() if u else c for c, u in zip(RESERVED + "caller", up, strict=True)
        )
    ),
)
header_names = st.one_of(
    forged_names,
    st.sampled_from(["content-type", "Content-Type", "x-other", "X-Other", "accept", "host"]),
    st.text(alphabet=string.ascii_lowercase + "-", min_size=1, max_size=10),
)
content_types = st.sampled_from(
    ["application/json", "application/json; charset=utf-8", "APPLICATION/JSON",
     "application/problem+json", "application/msgpack", "application/x-msgpack",
     "application/vnd.msgpack", "text/plain", "multipart/form-data; boundary=x", "", ";;",
     "application/json, application/msgpack", "application/msgpack; q=1"]
)  # fmt: skip
header_values = st.one_of(
    content_types, st.sampled_from(["box/a", "hidden/h", "1", ""]), st.text(max_size=12)
)
headers = st.lists(
    st.one_of(
        st.tuples(header_names, header_values), st.tuples(st.just("content-type"), content_types)
    ),
    max_size=5,
)


def _values(ints: st.SearchStrategy[int]) -> st.SearchStrategy[Any]:
    return st.recursive(
        st.none() | st.booleans() | ints | st.floats() | st.text(max_size=8),
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
        ),
        max_leaves=6,
    )


json_values = _values(st.integers())  # JSON numbers have no size limit
msgpack_values = _values(st.integers(-(2**63), 2**64 - 1))  # what msgpack can carry
arg_keys = st.sampled_from(["value", "extra", "self", "by"]) | st.text(max_size=6)


def _json_or_skip(obj: Any) -> bytes:
    try:
        return json.dumps(obj).encode()  # NaN and infinities come out as JSON extensions
    except (TypeError, ValueError):
        return b"{}"


bodies = st.one_of(
    st.binary(max_size=MAX_BODY + 16),
    st.sampled_from(
        [
            b"{}",
            b'{"value": 1}',
            b"\x81\xa5value\x01",
            b"[]",
            b"null",
            b"\xc1",
            b'{"value": NaN}',
            b'{"value": 1e999}',
            b" " * (MAX_BODY + 1),
        ]
    ),
    st.dictionaries(arg_keys, json_values, max_size=3).map(_json_or_skip),
    st.one_of(
        st.dictionaries(arg_keys, msgpack_values, max_size=3),
        st.dictionaries(st.integers(-5, 5) | st.binary(max_size=3), msgpack_values, max_size=2),
    ).map(codec.pack),
)


# -- the property ---------------------------------------------------------------------------


def _is_boom(method: str, raw_path: str) -> bool:
    parts = raw_path.split("/", 3)
    return (
        method.upper() == "POST"
        and len(parts) == 4
        and parts[1] == "box"
        and (parts[3] == "_rpc/boom")
    )


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    method=st.sampled_from(
        ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "post", "BREW", ""]
    ),
    raw_path=raw_paths,
    query=st.text(alphabet="a=&%;b1é", max_size=10),
    hdrs=headers,
    body=bodies,
)
def test_front_never_fails_and_refusals_change_nothing(
    method: str, raw_path: str, query: str, hdrs: list[tuple[str, str]], body: bytes
) -> None:
    data = Path(tempfile.mkdtemp())

    async def main() -> None:
        async with open_host(app, data, max_body=MAX_BODY) as host:
            ok = await host.request("POST", "/box/a/_rpc/put", json={"value": 0})
            assert ok.status == 200
            files, rows = file_list(data), contents(data)

            resp = await host.front.handle(method, raw_path, query, hdrs, body)
            event(f"status {resp.status}")

            handler_error = resp.status == 500 and _is_boom(method, raw_path)
            assert resp.status in (200, 400, 403, 404, 413) or handler_error, (
                resp.status,
                resp.body,
            )
            if resp.status != 200:
                assert resp.headers["content-type"] == "application/json"
                assert set(resp.json()) == {"error", "message"}
            if 400 <= resp.status < 500:  # refused: nothing created, nothing changed
                assert file_list(data) == files
                assert contents(data) == rows
            if resp.status == 200 and raw_path.split("?")[0].endswith(("/who", "/echo")):
                shown = resp.json()
                assert shown["caller"] is None
                if "headers" in shown:
                    sent = {k.lower() for k, _ in hdrs if not k.lower().startswith(RESERVED)}
                    assert set(shown["headers"]) == sent
                    assert not any(h.startswith(RESERVED) for h in shown["headers"])
            # The host keeps serving.
            health = await host.front.handle("GET", "/_actorkeep/health", "", [], b"")
            assert health.status == 200
            again = await host.request("POST", "/box/a/_rpc/put", json={"value": 1})
            assert (again.status, again.json()) == (200, 1)

    try:
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    finally:
        shutil.rmtree(data)


async def test_forged_headers_in_every_spelling_are_dropped(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The echo check above can fail: every header but the reserved ones reaches the actor,
    repeated ones joined, whatever their case."""
    async with open_host(app, tmp_path) as host:
        sent = [
            ("X-Actorkeep-Caller", "box/a"),
            ("x-actorkeep-chain", "box/a"),
            ("X-Other", "1"),
            ("x-other", "2"),
            ("Accept", "*/*"),
        ]
        resp = await host.front.handle("POST", "/box/b/echo", "", sent, b"")
        assert resp.json() == {"caller": None, "headers": ["accept", "x-other"]}
        resp = await host.front.handle("POST", "/hidden/h/echo", "", sent, b"")
        assert resp.status == 403


async def test_two_hosts_in_one_process(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The simulator runs and restarts several hosts in one process: nothing is global."""
    async with open_host(app, tmp_path / "one") as one, open_host(app, tmp_path / "two") as two:
        r1 = await one.request("POST", "/box/a/_rpc/put", json={"value": 1})
        r2 = await two.request("POST", "/box/a/_rpc/put", json={"value": 2})
        assert (r1.json(), r2.json()) == (1, 2)
        await one.restart()
        assert one.host.active_count == 0 and two.host.active_count == 1
    assert len(sqlite_files(tmp_path / "one")) == len(sqlite_files(tmp_path / "two")) == 1
