"""Route and rpc matching (docs/reference.md §2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import actorkeep as ak
from actorkeep.routing import RouteTable

from .conftest import sqlite_files


class Shop(ak.Actor):
    @ak.route("GET", "/")
    async def index(self, req: ak.Request) -> ak.Response:
        return ak.Response()

    @ak.route("GET", "/items/{item_id}")
    @ak.route("DELETE", "/items/{item_id}")
    async def item(self, req: ak.Request, item_id: str) -> ak.Response:
        return ak.Response()

    @ak.route("GET", "/items/{item_id}/tags/{tag}")
    async def tag(self, req: ak.Request, item_id: str, tag: str) -> ak.Response:
        return ak.Response()

    @ak.rpc
    async def add(self, a: int, b: int = 0) -> int:
        return a + b

    @ak.rpc
    async def anything(self, **kw: int) -> int:
        return len(kw)


def test_static_and_param_routes() -> None:
    r = RouteTable(Shop)
    assert r.match("GET", "/") == (Shop.index, {})
    assert r.match("GET", "/items/42") == (Shop.item, {"item_id": "42"})
    assert r.match("DELETE", "/items/a%20b") == (Shop.item, {"item_id": "a b"})
    assert r.match("GET", "/items/1/tags/red") == (Shop.tag, {"item_id": "1", "tag": "red"})
    assert r.match("POST", "/items/42") is None
    assert r.match("GET", "/items/") is None
    assert r.match("GET", "/items/1/2") is None
    assert r.match("GET", "/nope") is None


def test_rpc_lookup_and_argument_checks() -> None:
    r = RouteTable(Shop)
    add = r.rpc_for("POST", "/_rpc/add")
    assert add is not None and add.fn is Shop.add
    assert r.rpc_for("GET", "/_rpc/add") is None
    assert r.rpc_for("POST", "/_rpc/index") is None  # routes are not rpc methods
    add.check_args({"a": 1})
    add.check_args({"a": 1, "b": 2})
    with pytest.raises(ValueError, match="missing"):
        add.check_args({"b": 2})
    with pytest.raises(ValueError, match="unexpected"):
        add.check_args({"a": 1, "c": 2})
    anything = r.rpc_for("POST", "/_rpc/anything")
    assert anything is not None
    anything.check_args({"x": 1, "y": 2})


def test_decorators_refuse_sync_functions_and_bad_routes() -> None:
    with pytest.raises(TypeError):
        ak.rpc(lambda self: None)  # type: ignore[type-var]
    with pytest.raises(ValueError):
        ak.route("FETCH", "/")
    with pytest.raises(ValueError):
        ak.route("GET", "no-slash")


def test_rpc_positional_only_is_refused() -> None:
    class Bad(ak.Actor):
        @ak.rpc
        async def f(self, a: int, /) -> int:
            return a

    with pytest.raises(TypeError, match="by name"):
        RouteTable(Bad)


# -- parse: checked before the actor exists --------------------------------------------------
def _parse_order(address: str, req: ak.Request, shop: str) -> object:
    body = req.json()
    if body.get("refuse"):
        return ak.Response(409, body=b"refused by parse")
    if not isinstance(body.get("qty"), int):
        raise ValueError("qty must be an integer")
    return (address, shop, body["qty"])


parse_app = ak.App()
created: list[str] = []


@parse_app.actor("orders")
class Orders(ak.Actor):
    async def setup(self) -> None:
        created.append(self.address)

    @ak.route("POST", "/shops/{shop}/orders", parse=_parse_order)
    async def order(self, req: ak.Request, shop: str) -> ak.Response:
        return ak.Response(body=repr(req.parsed).encode())


async def test_parse_refuses_before_the_actor_is_created(tmp_path: Path) -> None:
    created.clear()
    async with ak.testing.open_host(parse_app, tmp_path) as host:
        bad = await host.request("POST", "/orders/o1/shops/s/orders", json={"qty": "two"})
        assert (bad.status, bad.json()["error"]) == (400, "BadRequest")
        assert "qty must be an integer" in bad.json()["message"]
        refused = await host.request("POST", "/orders/o1/shops/s/orders", json={"refuse": 1})
        assert (refused.status, refused.body) == (409, b"refused by parse")
        assert created == [] and not (tmp_path / "actors").exists()
        ok = await host.request("POST", "/orders/o1/shops/s%20x/orders", json={"qty": 3})
        assert ok.status == 200 and ok.body == b"('orders/o1', 's x', 3)"
        assert created == ["orders/o1"]


def _no_parse(address: str, req: ak.Request) -> None:
    return None


@pytest.mark.parametrize(
    ("upper", "lower"),
    [(_parse_order, _no_parse), (None, _no_parse), (_no_parse, None)],
    ids=["two-functions", "parse-only-below", "parse-only-above"],
)
def test_stacked_routes_of_a_handler_share_one_parse_function(upper: Any, lower: Any) -> None:
    with pytest.raises(TypeError, match="same parse function"):

        class Twice(ak.Actor):
            @ak.route("GET", "/a", parse=upper)
            @ak.route("GET", "/b", parse=lower)
            async def h(self, req: ak.Request) -> ak.Response:
                return ak.Response()


def test_parse_must_be_a_plain_function() -> None:
    async def later(address: str, req: ak.Request) -> None:
        return None

    with pytest.raises(TypeError, match="plain function"):
        ak.route("GET", "/a", parse=later)


def _parse_badly(address: str, req: ak.Request) -> object:
    return req.json()["qty"] + 1  # a list body raises TypeError: a bug, not bad input


bug_app = ak.App()


@bug_app.actor("buggy")
class Buggy(ak.Actor):
    @ak.route("POST", "/order", parse=_parse_badly)
    async def order(self, req: ak.Request) -> ak.Response:
        return ak.Response()

    @ak.rpc
    async def call(self) -> int:
        resp = await self.actors.call("buggy/b", "POST", "/order", b"[1]")
        return resp.status


async def test_a_failing_parse_is_a_json_500_never_an_exception(tmp_path: Path) -> None:
    async with ak.testing.open_host(bug_app, tmp_path) as host:
        resp = await host.request("POST", "/buggy/a/order", json=[1, 2])
        assert resp.status == 500 and resp.json()["error"] == "TypeError"
        via_actor = await host.request("POST", "/buggy/c/_rpc/call", json={})
        assert via_actor.status == 200 and via_actor.json() == 500
        # Only buggy/c, the caller, has a file: the refused requests opened nothing.
        assert [p.name for p in sqlite_files(tmp_path)] == ["c.sqlite"]
