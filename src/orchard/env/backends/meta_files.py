"""The `meta.json` beside each sandbox, snapshot and volume folder: the backends' only store."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

from orchard.env.errors import InvalidRequest


def new_id(prefix: str) -> str:
    """`<prefix>-` and 12 hex characters: a folder name, a label, an argument."""
    return f"{prefix}-{secrets.token_hex(6)}"


def check_id(value: str, prefix: str, what: str) -> None:
    """Refuse anything but what `new_id(prefix)` could have made (it names a folder)."""
    ok = value.startswith(prefix + "-") and len(value) <= 40
    if not ok or not all(c.isalnum() or c == "-" for c in value):
        raise InvalidRequest(f"invalid {what} id {value[:40]!r}")


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
