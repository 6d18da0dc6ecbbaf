"""Run the examples of the user guide (docs/*.md), so that the guide stays true of the code.

The convention, which every page of docs/ follows:

- A fenced block that opens with ```` ```python ```` and whose first line is ``# runnable`` is a
  complete program. It imports what it uses, defines ``async def main() -> None``, keeps its files
  in a temporary directory of its own, and checks what the page claims with ``assert``. It may end
  with ``if __name__ == "__main__": trio.run(main, clock=...)`` so that a reader can run it as a
  script; that footer does not run here.
- This test executes each runnable block in a fresh namespace (``__name__`` is
  ``"actorkeep_docs_example"``), then runs its ``main`` with
  ``trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))`` from inside a fresh
  temporary working directory. Virtual time makes alarms and call timeouts instant; an example
  that waits on nothing fails after a week of virtual time instead of hanging.
- A runnable block whose first line is ``# runnable: postgres`` needs a real PostgreSQL: it runs
  with the real clock (for at most ``POSTGRES_TIME_LIMIT`` seconds) and finds a fresh
  database's conninfo in the environment variable ``ACTORKEEP_POSTGRES``.
- A runnable block whose first line is ``# runnable: network`` talks to a real socket (a server
  on loopback): it runs with the real clock, for at most ``NETWORK_TIME_LIMIT`` seconds.
- Every other ``python`` block is an illustration: it must compile (top-level ``await`` allowed)
  but is not run.

An example fails the test if it lacks ``main``, raises, or hangs.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGES = tuple(sorted(path.name for path in DOCS.glob("*.md")))  # every page of the guide
MARKER = "# runnable"
TIME_LIMIT = 7 * 24 * 3600.0  # virtual seconds
POSTGRES_MARKER = "# runnable: postgres"
POSTGRES_TIME_LIMIT = 120.0  # real seconds
NETWORK_MARKER = "# runnable: network"
NETWORK_TIME_LIMIT = 60.0  # real seconds

_FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    source: str

    @property
    def runnable(self) -> bool:
        return self.source.lstrip().startswith(MARKER)

    @property
    def needs_postgres(self) -> bool:
        return self.source.lstrip().startswith(POSTGRES_MARKER)

    @property
    def needs_network(self) -> bool:
        return self.source.lstrip().startswith(NETWORK_MARKER)

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def python_blocks() -> list[Block]:
    blocks: list[Block] = []
    for path in sorted(DOCS.glob("*.md")):
        text = path.read_text(encoding="utf-8")
        for match in _FENCE.finditer(text):
            line = text.count("\n", 0, match.start(1)) + 1
            blocks.append(Block(path.name, line, match.group(1)))
    return blocks


BLOCKS = python_blocks()
RUNNABLE = [b for b in BLOCKS if b.runnable]


def test_every_page_has_a_runnable_example() -> None:
    for page in PAGES:
        assert (DOCS / page).is_file(), f"docs/{page} is missing"
        assert any(b.page == page for b in RUNNABLE), f"docs/{page} has no runnable example"


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_block_compiles(block: Block) -> None:
    compile(block.source, block.id, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


@pytest.mark.parametrize("block", RUNNABLE, ids=[b.id for b in RUNNABLE])
def test_runnable_example(
    block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "actorkeep_docs_example"}
    exec(compile(block.source, block.id, "exec"), namespace)
    main = namespace.get("main")
    assert callable(main), f"{block.id}: a runnable example must define async def main()"
    if block.needs_postgres:
        monkeypatch.setenv("ACTORKEEP_POSTGRES", request.getfixturevalue("pg_conninfo"))
        monkeypatch.chdir(Path(__file__).resolve().parent.parent)  # where the app modules are
        trio.run(bounded_by, main, POSTGRES_TIME_LIMIT)
        return
    if block.needs_network:
        trio.run(bounded_by, main, NETWORK_TIME_LIMIT)
        return
    run_example(main)


async def bounded_by(main: Callable[[], Awaitable[object]], seconds: float) -> None:
    with trio.fail_after(seconds):
        await main()


def run_example(main: Callable[[], Awaitable[object]]) -> None:
    async def bounded() -> None:
        with trio.fail_after(TIME_LIMIT):
            await main()

    trio.run(bounded, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_broken_example_fails(tmp_path: Path) -> None:
    """The harness itself: a failing assert inside main() must surface."""
    source = f"{MARKER}\nasync def main() -> None:\n    assert 1 + 1 == 3\n"
    namespace: dict[str, Any] = {"__name__": "actorkeep_docs_example"}
    exec(compile(source, "broken", "exec"), namespace)
    with pytest.raises(AssertionError):
        run_example(namespace["main"])


def test_a_hanging_example_fails() -> None:
    async def main() -> None:
        await trio.sleep_forever()

    with pytest.raises(trio.TooSlowError):
        run_example(main)


def test_every_serve_flag_is_documented(capsys: pytest.CaptureFixture[str]) -> None:
    """``actorkeep serve --help`` and the pages agree: each flag is in getting-started's
    synopsis or table, or (the cluster's) in docs/cluster.md."""
    from actorkeep.cli import main

    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]+)", capsys.readouterr().out)) - {"--help"}
    assert {"--admin-token", "--max-inflight", "--reload"} <= flags
    pages = (DOCS / "getting-started.md").read_text() + (DOCS / "cluster.md").read_text()
    missing = sorted(f for f in flags if f"`{f}" not in pages and f"[{f}" not in pages)
    assert missing == []


def test_getting_started_turns_on_trio_mode_for_its_pytest_example() -> None:
    page = (DOCS / "getting-started.md").read_text()
    assert re.search(r"\[tool\.pytest\.ini_options\]\ntrio_mode = true\n", page)
