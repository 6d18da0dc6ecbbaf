"""Planted KV bugs: ``shards.KVShard`` variants the KV checkers must catch
(``python -m sim --bug NAME``)."""

from __future__ import annotations

from typing import Any

import actorkeep as ak
from actorkeep.runtime.gate import Gate
from shards import KVShard

from ..bugs import GATE_BUGS


class ReusingShard(KVShard):
    """Starts after the highest version in its table instead of after its durable
    reservation, so a restart (or eviction) after deleting the newest key reuses versions."""

    async def setup(self) -> None:
        await super().setup()
        (top,) = self.sql.exec("SELECT COALESCE(MAX(version), 0) FROM actorkeep_kv").fetchone()
        self._next_version = int(top) + 1
        self._reserved = 1 << 62


class BlindCasShard(KVShard):
    """Answers every compare-and-set as if its expectation held."""

    @staticmethod
    def conflict(expect: int | None, live: int | None) -> ak.Response | None:
        return None


class LazyDurableShard(KVShard):
    """Acknowledges durable puts after a plain write: power loss can drop them."""

    def insert(self, params: tuple[Any, ...], durable: bool) -> None:
        super().insert(params, durable=False)


BUGS: dict[str, type[KVShard] | type[Gate]] = {
    "reuse-versions": ReusingShard,
    "blind-cas": BlindCasShard,
    "lazy-durable": LazyDurableShard,
    **GATE_BUGS,
}
