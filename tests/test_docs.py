"""docs/architecture.md cannot drift from the tree: it names every module of `src/` and every
package of the Go agent, and every path it names exists.

A path is a backticked token that looks like one (`env/server/app.py`, `agent/internal/exec/`,
`scripts/criu.sh`), read relative to `src/orchard/`, then to the repository root; a bare
name (no folder) first relative to the folder of the path named before it on the same line
(so "`env/backends/docker/backend.py` (+ `images.py`)" names env/backends/docker/images.py).
A module is named by its path, a package (`__init__.py`) by its folder too. After a module
moves, the failure lists what to change in the doc.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
PKG = ROOT / "src" / "orchard"
# Sample repositories the SWE tasks ship (package data, not Orchard's code).
NOT_MODULES = (PKG / "swe" / "sample",)
_TOKEN = re.compile(r"`([^`\s]+)`")
# Outside backticks, a path in prose: a known top folder, a slash, more ("(docs/state.md)").
_PROSE_PATH = re.compile(
    r"(?<![\w/.`-])((?:agent|agents|bench|claw|cli|deploy|docs|env|gui|integrations|scripts"
    r"|src|swe|tests|train)/[\w./-]*[\w/])"
)
_PATHLIKE = re.compile(r"^[\w.-][\w./-]*$")
_SUFFIXES = {".py", ".go", ".sh", ".md", ".json", ".yaml", ".toml", ".mod"}


def _looks_like_path(token: str) -> bool:
    return bool(_PATHLIKE.match(token)) and ("/" in token or Path(token).suffix in _SUFFIXES)


def named_paths(text: str | None = None) -> tuple[set[Path], list[str]]:
    """The paths the doc names (resolved), and the ones that do not exist, as `token` (line N)."""
    found: set[Path] = set()
    missing: list[str] = []
    for number, line in enumerate((text or DOC.read_text()).splitlines(), 1):
        base: Path | None = None
        prose = _PROSE_PATH.findall(_TOKEN.sub(" ", line))
        for token in [*_TOKEN.findall(line), *prose]:
            if not _looks_like_path(token):
                continue
            roots = [PKG, ROOT]
            if base is not None:  # a bare name is first of all a neighbour of the path before
                roots.insert(0 if "/" not in token.rstrip("/") else 2, base)
            hit = next((r / token for r in roots if (r / token).exists()), None)
            if hit is None:
                missing.append(f"`{token}` (line {number})")
                continue
            hit = hit.resolve()
            found.add(hit)
            base = hit if hit.is_dir() else hit.parent
    return found, missing


def src_modules() -> list[Path]:
    files = sorted((ROOT / "src").rglob("*.py"))
    return [p for p in files if not any(p.is_relative_to(d) for d in NOT_MODULES)]


def agent_packages() -> list[Path]:
    """The Go agent's packages: agent/ itself and each folder of Go files under it."""
    return sorted({p.parent for p in (ROOT / "agent").rglob("*.go") if "testdata" not in p.parts})


def _is_named(path: Path, named: set[Path]) -> bool:
    return path in named or (path.name == "__init__.py" and path.parent in named)


def test_every_path_named_exists() -> None:
    _, missing = named_paths()
    assert not missing, (
        "docs/architecture.md names paths that do not exist (moved or removed? update the doc):\n  "
        + "\n  ".join(missing)
    )


def test_every_module_is_named() -> None:
    named, _ = named_paths()
    absent = [p for p in src_modules() if not _is_named(p, named)]
    rel = [str(p.relative_to(ROOT)) for p in absent]
    assert not rel, (
        "docs/architecture.md does not name these modules of src/ (add each to a 'Where does "
        "X live' row, by its path under src/orchard/ or, for a package, its folder):\n  "
        + "\n  ".join(rel)
    )


def test_every_agent_package_is_named() -> None:
    named, _ = named_paths()
    absent = [p for p in agent_packages() if p not in named and not (named & set(p.glob("*.go")))]
    assert not absent, "docs/architecture.md does not name these Go packages:\n  " + "\n  ".join(
        f"{p.relative_to(ROOT)}/" for p in absent
    )


def test_the_check_finds_gone_paths_and_reads_neighbours() -> None:
    named, missing = named_paths(
        "runs it (agent/exec.go); `env/backends/docker/backend.py` (+ `mounts.py`, `gone.py`)\n"
        "| x | `Orchard()`, `ORCHARD_*`, `/v1/usage`, `--limits`, `orchard.test=1` |\n"
    )
    assert missing == ["`gone.py` (line 1)", "`agent/exec.go` (line 1)"]
    assert PKG / "env" / "backends" / "docker" / "mounts.py" in named


def test_the_check_reads_the_doc() -> None:
    named, _ = named_paths()
    assert PKG / "env" / "server" / "app.py" in named
    assert ROOT / "tests" / "test_layers.py" in named
    assert len(src_modules()) > 100
