"""The `meta.json` beside each sandbox, snapshot and volume folder: the backends' only store."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_meta(folder: Path, data: dict[str, Any]) -> None:
    """`folder/meta.json`, replaced whole: a reader never sees half of it."""
    tmp = folder / "meta.tmp"
    tmp.write_text(json.dumps(data))
    os.replace(tmp, folder / "meta.json")


def read_meta(folder: Path) -> dict[str, Any]:
    """`folder/meta.json`; OSError or ValueError if there is none or it is not an object."""
    data = json.loads((folder / "meta.json").read_text())
    if not isinstance(data, dict):
        raise ValueError("meta.json is not an object")
    return data
