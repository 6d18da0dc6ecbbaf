"""Route and rpc matching (SPEC §2)."""

from __future__ import annotations

from pathlib import Path

import pytest

import actorkeep as ak
from actorkeep.routing import Router


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
    r = Router(Shop)
    assert r.match("GET", "/") == (Shop.index, {})
    assert r.match("GET", "/items/42") == (Shop.item, {"item_id": "42"})
    assert r.match("DELETE", "/items/a%20b") == (Shop.item, {"item_id": "a b"})
    assert r.match("GET", "/items/1/tags/red") == (Shop.tag, {"item_id": "1", "tag": "red"})
    assert r.match("POST", "/items/42") is None
    assert r.match("GET", "/items/") is None
    assert r.match("GET", "/items/1/2") is None
    assert r.match("GET", "/nope") is None


def test_rpc_lookup_and_argument_checks() -> None:
    r = Router(Shop)
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
        Router(Bad)


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


def test_a_handler_has_one_parse_function() -> None:
    with pytest.raises(TypeError, match="two parse functions"):

        class Twice(ak.Actor):
            @ak.route("GET", "/a", parse=_parse_order)
            @ak.route("GET", "/b", parse=lambda address, req: None)
            async def h(self, req: ak.Request) -> ak.Response:
                return ak.Response()
