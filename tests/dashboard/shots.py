"""Where the browser tests write their page screenshots.

docs/dashboard/ holds the committed ones that the docs link to; a plain test run writes to
build/screenshots/ so that it leaves the tree clean. `make screenshots` (ORCHARD_UPDATE_DOCS=1)
rewrites the committed ones."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def shots_dir() -> Path:
    update = os.environ.get("ORCHARD_UPDATE_DOCS") == "1"
    out = REPO_ROOT / ("docs/dashboard" if update else "build/screenshots")
    out.mkdir(parents=True, exist_ok=True)
    return out
