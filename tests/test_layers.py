"""The import layers of `src/orchard`, read from the source with `ast`: every import counts,
the ones inside functions and under `TYPE_CHECKING` too, because a lazy import upward is
still a dependency upward. The layers are written down in docs/architecture.md (the picture)
and CONTRIBUTING.md ("Layers")."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
FAMILIES = ("orchard.swe", "orchard.gui", "orchard.claw")
# Higher imports lower, never the reverse. `orchard` (the package root) re-exports the SDK.
RANKS = {
    "orchard_verifiers": 7,  # the name verifiers finds the Orchard taskset by (re-exports)
    "orchard.cli": 6,
    "orchard.integrations": 6,  # adapters over the SDK, the families and train
    "orchard.demo": 6,
    "orchard.dashboard": 6,  # the runs viewer: reads the families' run folders
    **dict.fromkeys(FAMILIES, 5),
    "orchard.train": 4,
    "orchard.families": 3,  # the Family registry and batch runs
    "orchard.llm": 2,  # LLM client, model factory, judge protocol
    "orchard.env": 1,
    "orchard": 1,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def _resolve(importer: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    is_package = modules()[importer].name == "__init__.py"
    base = importer.split(".")[: len(importer.split(".")) - node.level + is_package]
    return ".".join([*base, *([node.module] if node.module else [])])


def _imports(name: str) -> Iterator[str]:
    tree = ast.parse(modules()[name].read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(name, node)
            for a in node.names:  # `from pkg import submodule` imports the submodule
                yield f"{target}.{a.name}" if f"{target}.{a.name}" in modules() else target


@cache
def graph() -> dict[str, frozenset[str]]:
    """Module -> the `orchard` modules it imports (the deepest one that exists)."""
    known = modules()
    edges: dict[str, frozenset[str]] = {}
    for name in known:
        targets = set()
        for target in _imports(name):
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target.startswith("orchard") and target != name:
                targets.add(target)
        edges[name] = frozenset(targets)
    return edges


def layer(name: str) -> str:
    """The entry of RANKS a module belongs to (its longest prefix there); the package root
    counts as env, since all it does is re-export the SDK."""
    found = max((k for k in RANKS if name == k or name.startswith(k + ".")), key=len)
    return "orchard.env" if found == "orchard" else found


def _cycles(edges: dict[str, frozenset[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                found.append(sorted([v, *component]))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def _violations(rule: str, bad: list[tuple[str, str]]) -> str:
    return f"{rule}:\n" + "\n".join(f"  {a} imports {b}" for a, b in sorted(bad))


def edges_where(pred: Callable[[str, str], bool]) -> list[tuple[str, str]]:
    """(importer, imported) pairs, by their layers: `pred(layer(a), layer(b))`."""
    return [(a, b) for a, targets in graph().items() for b in targets if pred(layer(a), layer(b))]


def test_the_graph_is_read() -> None:
    assert "orchard.cli" in modules() and "orchard.families.registry" in modules()
    assert "orchard.llm.client" in graph()["orchard.swe.harness"]
    assert "orchard.cli._common" in graph()["orchard.cli.sandbox"]


def test_no_module_cycles_outside_env() -> None:
    # cycles inside `orchard.env` fall under its own layer rules (env imports nothing above)
    outside = {
        a: frozenset(b for b in targets if layer(b) != "orchard.env")
        for a, targets in graph().items()
        if layer(a) != "orchard.env"
    }
    assert _cycles(outside) == []


def test_no_package_cycles() -> None:
    packages: dict[str, set[str]] = {}
    for a, targets in graph().items():
        packages.setdefault(layer(a), set()).update(layer(b) for b in targets)
    assert _cycles({k: frozenset(v - {k}) for k, v in packages.items()}) == []


def test_imports_run_down_the_layers() -> None:
    up = edges_where(lambda a, b: RANKS[b] > RANKS[a])
    assert not up, _violations("an import upward", up)


def test_env_imports_nothing_above_env() -> None:
    bad = edges_where(lambda a, b: a == "orchard.env" and b != "orchard.env")
    assert not bad, _violations("env depends on a layer above it", bad)


def test_no_family_imports_another() -> None:
    bad = edges_where(lambda a, b: a in FAMILIES and b in FAMILIES and a != b)
    assert not bad, _violations("a family imports another family", bad)


def test_gui_claw_and_train_import_nothing_from_swe() -> None:
    bad = edges_where(
        lambda a, b: a in ("orchard.gui", "orchard.claw", "orchard.train") and b == "orchard.swe"
    )
    assert not bad, _violations("gui, claw and train must not import orchard.swe", bad)


def test_no_library_module_imports_the_cli() -> None:
    bad = edges_where(lambda a, b: b == "orchard.cli" and a != "orchard.cli")
    assert not bad, _violations("a library module imports the CLI", bad)


def test_only_tests_import_the_backend_contract() -> None:
    # It drives backends, the agent client, the service and the SDK, so it sits above all of
    # env; it is there for tests and out-of-tree backends, never for the library itself.
    def inside(name: str) -> bool:
        return name == "orchard.env.backend_contract" or name.startswith(
            "orchard.env.backend_contract."
        )

    bad = [(a, b) for a, targets in graph().items() for b in targets if inside(b) and not inside(a)]
    assert not bad, _violations("a library module imports the backend contract", bad)
