"""Warm pools on disk, and who their sandboxes count against (docs/pools.md).

A pool is one file `<state_dir>/pools/<hash of owner and name>.json`, written whole and
atomically: the service keeps no database, so a restarted service reloads its pools from
here and finds their ready sandboxes through the backend by owner. A pooled sandbox's
owner is `<owner>:pool:<name>`: no API key's owner has a colon (config.key_owner), so no
caller can see, use or delete one before it is claimed; quotas count it as `<owner>`'s.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

POOL_SEP = ":pool:"


def pool_owner(owner: str, name: str) -> str:
    """The owner a pool's unclaimed sandboxes are made under."""
    return f"{owner}{POOL_SEP}{name}"


def holder(owner: str) -> str:
    """Whose quota a sandbox of this owner counts against (a pooled one's: its pool's owner)."""
    return owner.split(POOL_SEP, 1)[0]


def split_pool_owner(owner: str) -> tuple[str, str] | None:
    """(owner, pool name) of a pooled sandbox's owner, else None."""
    head, sep, name = owner.partition(POOL_SEP)
    return (head, name) if sep else None


@dataclass
class PoolRecord:
    """One pool as stored: what its sandboxes are made with (service defaults filled in)."""

    owner: str
    name: str
    image: str
    size: int
    created_at: float
    cpu: float | None = None
    memory_bytes: int | None = None
    disk_bytes: int | None = None
    pids_limit: int | None = None
    network: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str]:
        return self.owner, self.name


class PoolStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, owner: str, name: str) -> Path:
        digest = hashlib.sha256(f"{owner}\0{name}".encode()).hexdigest()[:32]
        return self.root / f"{digest}.json"

    def write(self, rec: PoolRecord) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        path = self._path(rec.owner, rec.name)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(rec)))
        os.replace(tmp, path)

    def delete(self, owner: str, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(owner, name).unlink()

    def load(self) -> list[PoolRecord]:
        """Every complete pool file (a torn `.tmp` from a crash is dropped)."""
        if not self.root.is_dir():
            return []
        out = []
        for path in sorted(self.root.iterdir()):
            if path.suffix == ".tmp":
                with contextlib.suppress(OSError):
                    path.unlink()
                continue
            try:
                out.append(PoolRecord(**json.loads(path.read_text())))
            except (OSError, ValueError, TypeError):
                continue  # unreadable: ignored (its sandboxes go as those of no pool)
        return out
