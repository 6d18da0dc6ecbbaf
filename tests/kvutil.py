"""A test actor that drives ``ak.kv`` from inside an event, and helpers to call it."""

from __future__ import annotations

from typing import Any

import msgpack

import actorkeep as ak
import shards

SHARDS = 4


def make_app(read_cache: float | None = None, allow: list[str] | None = None) -> ak.App:
    app = ak.App()
    app.mount(shards.KVShard, "kv", access="internal", allow=allow)
    kv = ak.kv.Client("kv", shards=SHARDS, read_cache=read_cache)

    class User(ak.Actor):
        @ak.rpc
        async def op(self, name: str, args: dict[str, Any]) -> Any:
            """Run one client operation; return [ok, result] or ["Conflict", current_version]."""
            try:
                if name == "get" or name == "get_fresh":
                    e = await getattr(kv, name)(args["key"])
                    return ["ok", None if e is None else [e.key, e.value, e.version, e.expires_at]]
                if name == "put":
                    return [
                        "ok",
                        await kv.put(
                            args["key"], args["value"], args.get("ttl"), args.get("local", False)
                        ),
                    ]
                if name == "cas":
                    expect = {"ANY": ak.kv.ANY, "ABSENT": ak.kv.ABSENT}.get(
                        args["expect"], args["expect"]
                    )
                    return ["ok", await kv.compare_and_set(args["key"], expect, args["value"])]
                if name == "delete":
                    return ["ok", await kv.delete(args["key"])]
                if name == "delete_if":
                    expect = {"ANY": ak.kv.ANY, "ABSENT": ak.kv.ABSENT}.get(
                        args["expect"], args["expect"]
                    )
                    return ["ok", await kv.delete_if(args["key"], expect)]
                if name == "list":
                    page = await kv.list(
                        args.get("prefix", b""), args.get("after"), args.get("limit", 100)
                    )
                    return ["ok", [[e.key, e.value, e.version] for e in page.entries], page.cursor]
            except ak.kv.Conflict as exc:
                return ["Conflict", exc.current_version]
            raise AssertionError(name)

    app.mount(User, "user")
    return app


async def kvop(host: ak.testing.TestHost, user: str, name: str, **args: Any) -> Any:
    resp = await host.request(
        "POST",
        f"/user/{user}/_rpc/op",
        body=msgpack.packb({"name": name, "args": args}),
        headers={"content-type": "application/msgpack"},
    )
    assert resp.status == 200, resp.body
    return msgpack.unpackb(resp.body)
