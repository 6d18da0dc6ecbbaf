"""The app ``tests/test_hostile.py`` and ``bench/hostile.py`` serve: targets for hostile input.

- ``sink``: ``hold`` keeps its arguments for ``seconds`` (decoded bodies held in memory).
- ``open``: any name may be created from outside (the default).
- ``closed``: outside requests reach only actors that exist (``create="actors"``).
"""

from __future__ import annotations

from typing import Any

import trio

import actorkeep as ak

app = ak.App()


@app.actor("sink")
class Sink(ak.Actor):
    @ak.rpc
    async def hold(self, data: Any = None, seconds: float = 0.0) -> int:
        await trio.sleep(seconds)
        return 1


class Hello(ak.Actor):
    @ak.rpc
    async def hi(self) -> str:
        return f"hi from {self.address}"

    @ak.rpc
    async def make(self, address: str) -> str:
        """Create another actor by calling it (actors may create any actor)."""
        result: str = await self.actors.ref(address).hi()
        return result


app.mount(Hello, "open")
app.mount(Hello, "closed", create="actors")
