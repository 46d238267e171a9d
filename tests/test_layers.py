"""The package's architecture, checked: layers only import downwards, and no import cycles.

The layers, lowest first, are the ones ``docs/design.md`` states::

    proto < membership < raft < services < locks < client < node < agent < testing < cli

(``accord/__init__.py`` only holds the version and sits below everything; ``__main__``
sits above ``cli``.) A module may import its own layer and lower ones, never a higher
one. No two modules may import each other, directly or through a ring of others: every
import counts, including those under ``TYPE_CHECKING`` and inside functions, since a
ring of type-only imports still ties the modules' meaning together. Breaking a ring
means a ``Protocol`` or a small types module both sides import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ACCORD = Path(__file__).resolve().parents[1] / "accord"
LAYERS = ("proto", "membership", "raft", "services", "locks", "client", "node", "agent",
          "testing", "cli")


def _modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (generated code excluded)."""
    mods = {}
    for path in root.rglob("*.py"):
        if "_pb2" in path.name:
            continue
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def import_graph(root: Path = ACCORD) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (``from pkg import sub`` counts as ``sub``)."""
    mods = _modules(root)
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                subs = {f"{target}.{a.name}" for a in node.names} & mods.keys()
                deps.update(subs)
                if len(subs) < len(node.names):
                    deps.add(target)
        graph[name] = {d for d in deps if d in mods and d != name}
    return graph


def layer_of(module: str) -> int:
    """The layer index of a module (``accord`` itself lowest, ``__main__`` highest)."""
    parts = module.split(".")
    if len(parts) == 1:
        return -1
    if parts[1] == "__main__":
        return len(LAYERS)
    return LAYERS.index(parts[1])


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_every_top_level_package_has_a_layer() -> None:
    unknown = {m.split(".")[1] for m in _modules(ACCORD) if "." in m} - set(LAYERS) - {"__main__"}
    assert unknown == set(), f"give these a place in LAYERS and docs/design.md: {unknown}"


def test_no_import_runs_upwards_between_layers() -> None:
    upward = sorted(f"{m} -> {d}" for m, deps in import_graph().items() for d in deps
                    if layer_of(d) > layer_of(m))
    assert upward == []


def test_no_import_cycles() -> None:
    assert cycles(import_graph()) == []


@pytest.mark.parametrize("edges, expected", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": set()}, []),
    ({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}, [["a", "b"], ["c", "d"]]),
])
def test_the_cycle_finder_finds_rings(edges: dict[str, set[str]],
                                      expected: list[list[str]]) -> None:
    assert sorted(cycles(edges)) == expected


def test_the_graph_sees_real_imports() -> None:
    graph = import_graph()
    # guard against a vacuous pass: known edges of each kind are seen
    assert "accord.raft.core.log" in graph["accord.raft.core.raft"]          # from x import Y
    assert "accord.raft.host.multiraft" in graph["accord.node.server"]       # absolute
    assert layer_of("accord.cli") > layer_of("accord.node.server") > layer_of("accord.raft.core.raft")
