"""Access rules and refusals before an actor exists (docs/reference.md §6, §13)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest
import trio
import trio.testing

import actorkeep as ak
from actorkeep.runtime.host import Host
from actorkeep.runtime.storage import FileStorage
from actorkeep.testing import open_host

from .conftest import sqlite_files


class Hello(ak.Actor):
    @ak.rpc
    async def hi(self) -> str:
        return f"hi from {self.address}"

    @ak.rpc
    async def ask(self, target: str) -> list[Any]:
        try:
            return ["ok", await self.actors.ref(target).hi()]
        except ak.Forbidden as exc:
            return ["Forbidden", exc.status, exc.message]


class CallersOnly(Hello):
    callers_only: ClassVar[bool] = True


def make_app() -> ak.App:
    app = ak.App()
    app.mount(Hello, "pub")
    app.mount(Hello, "priv", access="internal")
    app.mount(Hello, "web")
    app.mount(Hello, "jobs")
    app.mount(Hello, "narrow", allow=["jobs"])
    app.mount(CallersOnly, "shard")
    return app


async def test_outside_refusals_create_no_files(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(make_app(), data_dir, max_body=100) as host:
        expect = {
            "/priv/a/_rpc/hi": 403,
            "/narrow/a/_rpc/hi": 403,
            "/shard/a/_rpc/hi": 403,
            "/nosuch/a/_rpc/hi": 404,
            "/pub/a/_rpc/nosuch": 404,
            "/pub/.a/_rpc/hi": 400,
            "/pub/a%2Fb/_rpc/hi": 400,
            "/pub/a%00/_rpc/hi": 400,
            "/pub": 404,
            "/": 404,
            "//a/x": 404,
        }
        for path, status in expect.items():
            resp = await host.request("POST", path)
            assert resp.status == status, (path, resp.body)
            assert set(resp.json()) == {"error", "message"}
        resp = await host.request("POST", "/pub/a/_rpc/hi", body=b"x" * 101)
        assert resp.status == 413
        assert sqlite_files(data_dir) == []
        resp = await host.request("POST", "/priv/a/_rpc/hi")
        assert resp.json()["error"] == "Forbidden"
        assert (await host.request("POST", "/pub/a/_rpc/hi")).json() == "hi from pub/a"


async def test_access_override_like_the_cli_flag(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(make_app(), data_dir, access={"pub": "internal"}) as host:
        assert (await host.request("POST", "/pub/a/_rpc/hi")).status == 403
        assert sqlite_files(data_dir) == []
        # Actors may still call it.
        resp = await host.call_as("web/w", "pub/a", "POST", "/_rpc/hi")
        assert resp.status == 200
    with pytest.raises(ValueError, match="unknown actor class"):
        Host(make_app(), FileStorage(data_dir), access={"nope": "internal"})
    with pytest.raises(ValueError, match="'internal' or 'public'"):
        Host(make_app(), FileStorage(data_dir), access={"pub": "secret"})


async def test_allow_narrows_callers(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(make_app(), data_dir) as host:
        ok = await host.request("POST", "/jobs/j/_rpc/ask", json={"target": "narrow/n"})
        assert ok.json() == ["ok", "hi from narrow/n"]
        no = await host.request("POST", "/web/w/_rpc/ask", json={"target": "narrow/n2"})
        assert no.json() == ["Forbidden", 403, "actor class 'narrow' does not answer 'web/w'"]
        assert not any("n2" in f.name for f in sqlite_files(data_dir))
        shard = await host.request("POST", "/web/w/_rpc/ask", json={"target": "shard/s"})
        assert shard.json() == ["ok", "hi from shard/s"]


def test_app_registration_errors() -> None:
    app = ak.App()
    app.mount(Hello, "a")
    with pytest.raises(ValueError, match="already registered"):
        app.mount(Hello, "a")
    with pytest.raises(ValueError, match="invalid actor class name"):
        app.mount(Hello, "Bad_Name")
    with pytest.raises(ValueError, match="access"):
        app.mount(Hello, "b", access="private")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        app.mount(object, "c")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        app.mount(Hello, "d", allow=["Not A Class"])


# -- who may create actors --------------------------------------------------------------------


def creation_app() -> ak.App:
    app = ak.App()
    app.mount(Hello, "existing", create="actors")
    app.mount(Hello, "named", create=["main", "other"])
    app.mount(Hello, "even", create=lambda name: name.isdigit() and int(name) % 2 == 0)
    app.mount(Hello, "pub")
    return app


async def test_outside_requests_create_only_what_the_class_allows(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_host(creation_app(), data_dir) as host:
        for path in ("/existing/x/_rpc/hi", "/named/x/_rpc/hi", "/even/3/_rpc/hi", "/even/a/"):
            resp = await host.request("POST", path)
            assert resp.status == 404, path
            assert resp.json()["error"] == "NotFound"
        assert (await host.request("POST", "/existing/x/_rpc/hi")).json() == {
            "error": "NotFound",
            "message": "no actor existing/x",
        }
        assert sqlite_files(data_dir) == []
        assert host.host.active_count == 0
        for path in ("/named/main/_rpc/hi", "/even/4/_rpc/hi", "/pub/anything/_rpc/hi"):
            assert (await host.request("POST", path)).status == 200, path
        # Another actor may create any of them; from then on outside requests reach it.
        resp = await host.request("POST", "/pub/p/_rpc/ask", json={"target": "existing/x"})
        assert resp.json() == ["ok", "hi from existing/x"]
        assert (await host.request("POST", "/existing/x/_rpc/hi")).json() == "hi from existing/x"
        await host.restart()  # existing on disk, not only in memory
        assert host.host.active_count == 0
        assert (await host.request("POST", "/existing/x/_rpc/hi")).status == 200
        assert (await host.request("POST", "/existing/y/_rpc/hi")).status == 404
        names = {p.stem for p in sqlite_files(data_dir)}
        assert names == {"main", "4", "anything", "p", "x"}


def test_create_must_be_a_rule_names_or_a_function() -> None:
    app = ak.App()
    for bad in ("nobody", 3, [1, 2]):
        with pytest.raises(ValueError, match="create must be"):
            app.mount(Hello, "bad", create=bad)  # type: ignore[arg-type]


async def test_the_jobs_example_refuses_actors_outsiders_would_create(
    data_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    from examples.jobs.app import app

    async with open_host(app, data_dir) as host:
        for path in ("/worker/w1/start", "/deliverer/d1/deliveries", "/api/other/stats"):
            method = "POST" if path.endswith("start") else "GET"
            assert (await host.request(method, path)).status == 404, path
        assert sqlite_files(data_dir) == []
        assert (await host.request("GET", "/api/main/stats")).status == 200
        # api/main's setup starts worker/main: now it exists for outside requests too.
        assert (await host.request("GET", "/worker/main/results")).json() == []
        assert (await host.request("POST", "/worker/w2/start")).status == 404
