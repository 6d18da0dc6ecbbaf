"""Fuzzing the outside front: no 5xx, no file for a refused request, no forged caller."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import actorkeep as ak
from actorkeep.testing import open_host

from .conftest import sqlite_files

app = ak.App()


@app.actor("box")
class Box(ak.Actor):
    @ak.rpc
    async def put(self, value: Any = None) -> Any:
        return value

    @ak.route("GET", "/who")
    async def who(self, req: ak.Request) -> ak.Response:
        return ak.Response.json({"caller": req.caller})

    @ak.route("POST", "/items/{item}")
    async def item(self, req: ak.Request, item: str) -> ak.Response:
        return ak.Response(200, body=item.encode())


app.mount(Box, "hidden", access="internal")

segment = st.one_of(
    st.sampled_from(["box", "hidden", "nosuch", "_rpc", "put", "who", "items", "..", ".", ""]),
    st.text(alphabet="aZ09._~:@+=-%/?#& \x00é", max_size=12),
)
paths = st.lists(segment, min_size=0, max_size=5).map(lambda parts: "/" + "/".join(parts))
header_names = st.sampled_from(
    ["content-type", "x-actorkeep-caller", "X-ACTORKEEP-CHAIN", "x-other", "content-length"]
)
header_values = st.sampled_from(
    ["application/json", "application/msgpack", "text/plain", "box/a", "", "1", ";;"]
)
bodies = st.one_of(
    st.binary(max_size=64),
    st.sampled_from([b"{}", b'{"value": 1}', b"\x81\xa5value\x01", b"[]", b"null", b"\xc1"]),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH"]),
    path=paths,
    query=st.text(alphabet="a=&%;b1", max_size=10),
    headers=st.lists(st.tuples(header_names, header_values), max_size=4),
    body=bodies,
)
def test_front_never_fails_and_refusals_create_nothing(
    method: str, path: str, query: str, headers: list[tuple[str, str]], body: bytes
) -> None:
    data = Path(tempfile.mkdtemp())

    async def main() -> None:
        async with open_host(app, data, max_body=48) as host:
            resp = await host.request(
                method, f"{path}?{query}" if query else path, body=body, headers=dict(headers)
            )
            assert resp.status in (200, 400, 403, 404, 413), (resp.status, resp.body)
            if resp.status != 200:
                assert set(resp.json()) == {"error", "message"}
                assert sqlite_files(data) == []
            elif path.endswith("/who"):
                assert resp.json() == {"caller": None}

    try:
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    finally:
        shutil.rmtree(data)


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
