"""Wire models of sandbox state (docs/state.md): snapshots, fork, file diffs.

`SandboxCreate.snapshot` and the `paused` status live with the sandbox (`sandbox.py`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field, field_validator

from orchard.env.models.base import MAX_TTL_S, ErrorBody, Labels, WireModel, check_keys
from orchard.env.models.base import Env as Env
from orchard.env.models.sandbox import NetworkPolicy, Sandbox

# A day: long enough for a GRPO step's groups, short enough that forgotten ones go.
DEFAULT_SNAPSHOT_TTL_S = 24 * 3600.0
# Below a sandbox's week: a snapshot holds disk whether or not anything uses it (issue 31).
MAX_SNAPSHOT_TTL_S = 3 * 24 * 3600.0
MAX_FORK = 100


class SnapshotCreate(WireModel):
    name: str | None = Field(default=None, max_length=128)
    timeout_s: float = Field(
        default=DEFAULT_SNAPSHOT_TTL_S,
        gt=0,
        le=MAX_SNAPSHOT_TTL_S,
        description="time to live (at most 3 days)",
    )
    memory: bool = Field(
        default=False,
        description="keep processes and memory too (CRIU; local backend): sandboxes made "
        "from it resume them; 501 memory_not_supported where CRIU cannot",
    )


class SnapshotSettings(WireModel):
    """What a sandbox made from the snapshot gets unless the create overrides it."""

    image: str
    cpu: float | None = None
    memory_bytes: int | None = None
    pids_limit: int | None = None
    disk_bytes: int | None = None
    idle_timeout_s: float | None = None
    user: str | None = None
    network: NetworkPolicy = Field(default_factory=NetworkPolicy)
    labels: dict[str, str] = Field(default_factory=dict)
    # The mounts (target -> "name[:ro]"), not the volumes' content: docs/volumes.md.
    volumes: dict[str, str] = Field(default_factory=dict)


class Snapshot(WireModel):
    id: str
    name: str | None = None
    source: str = Field(description="the sandbox it was taken of")
    image: str
    created_at: datetime
    expires_at: datetime
    size_bytes: int = Field(
        description="bytes its files (and a memory snapshot's CRIU image) take beyond the image"
    )
    memory: bool = Field(default=False, description="whether processes and memory are kept")
    settings: SnapshotSettings


class SnapshotList(WireModel):
    snapshots: list[Snapshot]


class ForkRequest(WireModel):
    count: int = Field(default=1, ge=1, le=MAX_FORK)
    name: str | None = Field(default=None, max_length=128)
    memory: bool = Field(default=False, description="fork the running processes too (CRIU)")
    snapshot_timeout_s: float = Field(default=DEFAULT_SNAPSHOT_TTL_S, gt=0, le=MAX_SNAPSHOT_TTL_S)
    timeout_s: float | None = Field(default=None, gt=0, le=MAX_TTL_S)
    env: Env = Field(default_factory=dict)
    labels: Labels | None = None
    network: NetworkPolicy | None = None
    wait: bool = True

    @field_validator("env", "labels")
    @classmethod
    def _keys(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        """The keys a create accepts: the fork's creates are built from these."""
        return check_keys(v)


class ForkResult(WireModel):
    snapshot: Snapshot
    sandboxes: list[Sandbox]
    errors: list[ErrorBody] = Field(default_factory=list)


ChangeKind = Literal["added", "modified", "deleted"]


class FileDiff(WireModel):
    since: str = Field(description="`start` or the snapshot id compared with")
    added: list[str] = Field(default_factory=list)
    modified: list[str] = Field(default_factory=list)
    deleted: list[str] = Field(default_factory=list)
