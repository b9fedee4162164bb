"""Per-owner quotas (`orchard serve --limits FILE`, or ORCHARD_LIMITS): parsed and checked here.

The file is YAML or JSON with a `default:` block and one block per owner (the name of a
key in ORCHARD_API_KEYS); an owner's block overrides the default key by key, and `null`
means unlimited. The defaults are sized so that one user's 1,000-sandbox stress run (one
batch of 1,000, or 1,000 single creates in a tight loop, at the default size) never hits
one: they stop a runaway loop or a fuzzer, not work. docs/security.md lists them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from orchard.env.input_limits import DEFAULT_LIMITS, parse_size

# For the sandbox-state work: max_volume_bytes is checked when a volume is mounted
# (server/volumes.py, docs/volumes.md); max_snapshots and max_snapshot_bytes when a
# snapshot is taken (server/state.py, docs/state.md).
STATE_KEYS = ("max_snapshots", "max_snapshot_bytes", "max_volume_bytes")
_SIZES = (
    "max_memory",
    "max_label_bytes",
    "max_env_bytes",
    "max_volume_bytes",
    "max_snapshot_bytes",
)


@dataclass(frozen=True)
class OwnerLimits:
    """What one owner may hold at once (sums over its live sandboxes) and create per second."""

    max_sandboxes: int | None = 2000
    max_batch: int | None = 1000
    max_cpu: float | None = 2048.0  # cores: 2,000 sandboxes at the default 1 core, with room
    max_memory: int | None = 4 << 40  # 4 TiB of limits: 2,000 at the default 1 GiB, doubled
    creates_per_second: float | None = 100.0
    create_burst: int | None = 1000  # the bucket's size: a whole max_batch at once
    max_label_bytes: int | None = DEFAULT_LIMITS.max_label_bytes
    max_env_bytes: int | None = DEFAULT_LIMITS.max_env_bytes
    # Snapshots that exist at once, and the bytes they hold together (each one's size_bytes):
    # a fork per sandbox of a 1,000-sandbox run fits; a loop snapshotting without end does not.
    max_snapshots: int | None = 1000
    max_snapshot_bytes: int | None = 100 << 30
    max_volume_bytes: int | None = None

    def as_dict(self) -> dict[str, float | int | None]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


_KEYS = {f.name for f in fields(OwnerLimits)}


def _owner_limits(block: Any, base: OwnerLimits, where: str) -> OwnerLimits:
    if block is None:
        return base
    if not isinstance(block, Mapping):
        raise ValueError(f"limits: {where} must be a mapping of limit names to values")
    unknown = sorted(set(block) - _KEYS)
    if unknown:
        raise ValueError(f"limits: {where}: unknown keys {unknown} (known: {sorted(_KEYS)})")
    values: dict[str, Any] = {}
    for key, raw in block.items():
        if raw is None:
            values[key] = None
        elif key in _SIZES:
            values[key] = parse_size(raw, f"limits: {where}.{key}", 0)
        elif isinstance(raw, bool) or not isinstance(raw, int | float):
            raise ValueError(f"limits: {where}.{key} must be a number or null, got {raw!r}")
        elif raw < 0:
            raise ValueError(f"limits: {where}.{key} must be >= 0, got {raw!r}")
        elif key in ("max_cpu", "creates_per_second"):
            values[key] = float(raw)
        elif raw != int(raw):
            raise ValueError(f"limits: {where}.{key} must be a whole number, got {raw!r}")
        else:
            values[key] = int(raw)
    return replace(base, **values)


@dataclass(frozen=True)
class Limits:
    """The default block and the per-owner blocks (each already merged over the default)."""

    default: OwnerLimits = field(default_factory=OwnerLimits)
    owners: dict[str, OwnerLimits] = field(default_factory=dict)

    def of(self, owner: str) -> OwnerLimits:
        return self.owners.get(owner, self.default)

    @classmethod
    def from_mapping(cls, data: Any) -> Limits:
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise ValueError("limits: the file must hold a mapping (`default:` and owners)")
        default = _owner_limits(data.get("default"), OwnerLimits(), "default")
        owners = {
            str(name): _owner_limits(block, default, str(name))
            for name, block in data.items()
            if name != "default"
        }
        return cls(default, owners)

    @classmethod
    def load(cls, path: str | Path) -> Limits:
        """Read a YAML or JSON limits file (JSON is YAML, but its errors read better)."""
        text = Path(path).read_text()
        try:
            if str(path).endswith(".json"):
                data = json.loads(text)
            else:
                import yaml  # the server extra's; only YAML files need it

                data = yaml.safe_load(text)
        except Exception as e:  # ValueError, yaml.YAMLError, ImportError
            raise ValueError(f"limits: cannot parse {path}: {e}") from None
        return cls.from_mapping(data)
