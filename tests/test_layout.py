"""The layout's rules (docs/decisions/0014-layout.md), checked from the source: no import
circle, each package imports only what it may, nothing outside the runtime takes its private
names, and no module of ``actorkeep`` grows past 500 lines."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("actorkeep", "shards", "queues", "sim")
MAX_LINES = 500


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {
    module_name(path): path
    for package in PACKAGES
    for path in sorted((ROOT / package).rglob("*.py"))
}


def imports(name: str) -> Iterator[tuple[str, str]]:
    """``(module, imported name or "")`` for every import in module ``name``, type-only and
    function-level imports included."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, ""
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                yield (submodule, "") if submodule in MODULES else (source, alias.name)


def first_party(target: str) -> str | None:
    """The module of this tree that ``target`` names (a module or the package above it)."""
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target or None


GRAPH = {
    name: {m for target, _ in imports(name) if (m := first_party(target)) and m != name}
    for name in MODULES
}


def circles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(GRAPH[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return found


def in_package(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_the_checker_reads_the_tree() -> None:
    """A sanity check of the checker itself: it sees the modules and the known edges."""
    assert "actorkeep.runtime.host" in MODULES and "sim.kv.workload" in MODULES
    assert "actorkeep.runtime.dispatch" in GRAPH["actorkeep.runtime.host"]
    assert "actorkeep.wire" in GRAPH["queues.queue"]


def test_there_is_no_import_circle() -> None:
    assert circles() == []


def test_a_planted_circle_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(GRAPH, "actorkeep.codec", {*GRAPH["actorkeep.codec"], "actorkeep.kv"})
    assert any("actorkeep.codec" in c and "actorkeep.kv" in c for c in circles())


FORBIDDEN = [
    # (importer, imported): the runtime knows no HTTP edge, protocol, SDK client or ready class
    ("actorkeep.runtime", "actorkeep.front"),
    ("actorkeep.runtime", "actorkeep.wire"),
    ("actorkeep.runtime", "actorkeep.kv"),
    ("actorkeep.runtime", "actorkeep.queue"),
    ("actorkeep.runtime", "actorkeep.testing"),
    ("actorkeep.runtime", "actorkeep.cli"),
    # operations tooling reads the runtime and serves on the front; neither knows it
    ("actorkeep.runtime", "actorkeep.ops"),
    ("actorkeep.front", "actorkeep.ops"),
    ("actorkeep.cluster", "actorkeep.ops"),
    # the cluster stands on the runtime's seams (decision 0016), never the reverse; its store
    # knows no HTTP edge
    ("actorkeep.runtime", "actorkeep.cluster"),
    ("actorkeep.cluster", "actorkeep.front"),
    # the protocols are plain data: no runtime, no HTTP edge
    ("actorkeep.wire", "actorkeep.runtime"),
    ("actorkeep.wire", "actorkeep.front"),
    # the front turns requests into calls of the host; it is not imported by the host's side
    ("actorkeep.kv", "actorkeep.front"),
    ("actorkeep.queue", "actorkeep.front"),
    # nothing of actorkeep depends on the ready classes or the simulator
    ("actorkeep", "shards"),
    ("actorkeep", "queues"),
    ("actorkeep", "sim"),
    ("shards", "sim"),
    ("queues", "sim"),
]


def test_packages_import_only_what_they_may() -> None:
    broken = [
        f"{name} imports {target}"
        for name, targets in GRAPH.items()
        for target in targets
        for importer, imported in FORBIDDEN
        if in_package(name, importer) and in_package(target, imported)
    ]
    assert broken == []


def test_the_ready_classes_use_only_the_facade_and_the_wire() -> None:
    allowed = {"actorkeep"} | {m for m in MODULES if in_package(m, "actorkeep.wire")}
    broken = [
        f"{name} imports {target}"
        for name, targets in GRAPH.items()
        if in_package(name, "shards") or in_package(name, "queues")
        for target in targets
        if in_package(target, "actorkeep") and target not in allowed
    ]
    assert broken == []


def test_nothing_outside_the_runtime_imports_its_private_names() -> None:
    broken = [
        f"{name} imports {source}.{imported}"
        for name in MODULES
        if not in_package(name, "actorkeep.runtime")
        for source, imported in imports(name)
        if in_package(source, "actorkeep.runtime") and imported.startswith("_")
    ]
    assert broken == []


def test_no_module_of_actorkeep_is_over_500_lines() -> None:
    long = {
        name: n
        for name, path in MODULES.items()
        if in_package(name, "actorkeep") and (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}
