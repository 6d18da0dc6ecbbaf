"""An app for the KV crash tests: ``store/<name>`` writes through ``ak.kv`` to 4 shards."""

from __future__ import annotations

import actorkeep as ak
import shards

app = ak.App()
app.mount(shards.KVShard, "kv", access="internal")
kv = ak.kv.Client("kv", shards=4)


@app.actor("store")
class Store(ak.Actor):
    @ak.rpc
    async def put(self, key: str, value: str, local: bool = False) -> int:
        return await kv.put(key, value.encode(), local=local)

    @ak.rpc
    async def get(self, key: str) -> list[object] | None:
        entry = await kv.get(key)
        return None if entry is None else [entry.value.decode(), entry.version]

    @ak.rpc
    async def shard_of(self, key: str) -> str:
        return kv.address_of(key)
