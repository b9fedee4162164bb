"""Candidate bugs: SWE-smith's procedural modifiers applied to one function or class at a time.

SWE-smith (`swesmith` on PyPI, MIT, github.com/SWE-bench/SWE-smith) is used as a library:
its Python entity adapter and its 13 libcst modifiers. Its package `__init__`s import the
tree-sitter grammars of every other language it supports; those are not needed here, so
the two Python sub-packages are loaded without running their parents' `__init__`.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import random
import sys
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Candidate:
    """One modifier applied to one entity: the bug as a patch, and its reverse (the gold)."""

    id: str
    strategy: str
    explanation: str
    file: str
    entity: str
    line: int
    bug_patch: str
    gold_patch: str
    seed: int


def _load_swesmith() -> tuple[Any, list[Any]]:
    """swesmith's Python entity builder and its Python modifiers (no other language)."""
    import swesmith  # type: ignore[import-untyped]

    base = Path(swesmith.__file__).resolve().parent / "bug_gen"
    for pkg, sub in (
        ("swesmith.bug_gen", base),
        ("swesmith.bug_gen.procedural", base / "procedural"),
        ("swesmith.bug_gen.adapters", base / "adapters"),
    ):
        if pkg not in sys.modules:
            mod = types.ModuleType(pkg)
            mod.__path__ = [str(sub)]
            sys.modules[pkg] = mod
    adapters = importlib.import_module("swesmith.bug_gen.adapters.python")
    procedural = importlib.import_module("swesmith.bug_gen.procedural.python")
    return adapters.get_entities_from_file_py, list(procedural.MODIFIERS_PYTHON)


def modifier_names() -> list[str]:
    """The names SWE-smith gives its Python modifiers (`func_pm_...`), for `--modifiers`."""
    return [m.name for m in _load_swesmith()[1]]


def entities(root: Path, packages: Sequence[str]) -> list[Any]:
    """Every function and class in the packages' modules (tests excluded), in file order."""
    get_entities, _ = _load_swesmith()
    found: list[Any] = []
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            rel = path.relative_to(root)
            if any(p in ("tests", "test") for p in rel.parts) or path.name.startswith("test_"):
                continue
            text = path.read_text(encoding="utf8", errors="replace")
            if not text.endswith("\n") or "\t" in text:
                continue  # keeps the splice and the diff exact
            get_entities(found, str(path))
    return found


def _splice(text: str, entity: Any, rewrite: str) -> str:
    """swesmith's `apply_code_change`, on a string: the entity's lines, re-indented."""
    lines = text.splitlines(keepends=True)
    pad = " " * entity.indent_level * entity.indent_size
    change = [pad + x if x.strip() else x for x in rewrite.splitlines(keepends=True)]
    if not change:
        return text
    change[-1] = change[-1].rstrip("\n") + "\n"
    return "".join(lines[: entity.line_start - 1] + change + lines[entity.line_end :])


def unified_diff(rel: str, before: str, after: str) -> str:
    """A git-style diff of one file that `git apply` takes."""
    body = difflib.unified_diff(
        before.splitlines(keepends=True),
        after.splitlines(keepends=True),
        fromfile=f"a/{rel}",
        tofile=f"b/{rel}",
    )
    return f"diff --git a/{rel} b/{rel}\n" + "".join(body)


def candidates(
    root: Path,
    packages: Sequence[str],
    *,
    seed: int,
    modifiers: Sequence[str] | None = None,
    prefix: str = "",
    stats: dict[str, int] | None = None,
    per_entity: int | None = 2,
) -> Iterator[Candidate]:
    """Candidates in a seeded order: entities shuffled, each tried with every chosen modifier
    that applies to it. A modifier's own randomness is seeded per (seed, entity, modifier),
    so a candidate is a pure function of the source and the seed (what makes runs resumable).
    Candidates that do not compile, or change nothing, are not yielded (`stats` counts
    `generated` and `uncompiled`). At most `per_entity` candidates come from one entity, so a
    set spreads over the code instead of piling bugs into the first functions drawn.
    """
    stats = stats if stats is not None else {}
    _, mods = _load_swesmith()
    if modifiers:
        unknown = set(modifiers) - {m.name for m in mods}
        if unknown:
            raise ValueError(f"unknown modifiers: {', '.join(sorted(unknown))}")
        mods = [m for m in mods if m.name in modifiers]
    found = entities(root, packages)
    random.Random(seed).shuffle(found)
    texts: dict[str, str] = {}
    for ent in found:
        path = Path(ent.file_path)
        rel = str(path.relative_to(root))
        text = texts.setdefault(rel, path.read_text(encoding="utf8"))
        made = 0
        for mod in mods:
            if per_entity is not None and made >= per_entity:
                break
            if not mod.can_change(ent):
                continue
            key = f"{seed}:{rel}:{ent.line_start}:{ent.name}:{mod.name}"
            sub = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)
            fresh = type(mod)(likelihood=mod.likelihood, seed=sub)
            bug = fresh.modify(ent)
            if bug is None or not bug.rewrite.strip():
                continue
            after = _splice(text, ent, bug.rewrite)
            if after == text:
                continue
            stats["generated"] = stats.get("generated", 0) + 1
            if not _compiles(after, rel):
                stats["uncompiled"] = stats.get("uncompiled", 0) + 1
                continue
            digest = hashlib.sha256(after.encode()).hexdigest()[:8]
            made += 1
            yield Candidate(
                id=f"{prefix}{mod.name}__{digest}",
                strategy=mod.name,
                explanation=bug.explanation,
                file=rel,
                entity=ent.name,
                line=ent.line_start,
                bug_patch=unified_diff(rel, text, after),
                gold_patch=unified_diff(rel, after, text),
                seed=sub,
            )


def _compiles(text: str, rel: str) -> bool:
    try:
        compile(text, rel, "exec")
    except (SyntaxError, ValueError):
        return False
    return True
