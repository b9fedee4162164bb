"""docs/benchmarks.md names the code behind each figure: every backticked source path in it
exists (under the repository, `src/orchard/` or `src/orchard/env/`), except one written
after "then " (where the code lived when it was measured, beside where it is now)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASES = (ROOT, ROOT / "src" / "orchard", ROOT / "src" / "orchard" / "env", ROOT / "bench")
_PATH = re.compile(r"(then )?`([\w./-]+/[\w.-]+\.(?:py|go|sh))`")


def gone_paths(text: str) -> list[str]:
    return [
        path
        for then, path in _PATH.findall(text)
        if not then and not any((base / path).exists() for base in BASES)
    ]


def test_every_source_path_in_benchmarks_exists() -> None:
    gone = gone_paths((ROOT / "docs" / "benchmarks.md").read_text())
    assert not gone, f"docs/benchmarks.md names paths that are gone: {gone}"


def test_the_check_finds_gone_paths() -> None:
    text = "a (`env/_sdk_http.py`) b (then `env/_old.py`, now `env/http11/sync.py`)"
    assert gone_paths(text) == ["env/_sdk_http.py"]
