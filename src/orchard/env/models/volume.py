"""Wire models of volumes (docs/volumes.md): folders that outlive sandboxes, per owner.

The mount request itself (`SandboxCreate.volumes`: target -> "name" or "name:ro")
lives with the create (`sandbox.py`).
"""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from orchard.env.models.base import MAX_TTL_S, Labels, WireModel

# Like Docker's volume names: safe as a path component, a label and a CLI argument.
VOLUME_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


class VolumeCreate(WireModel):
    name: str = Field(pattern=VOLUME_NAME_PATTERN, description="unique among the owner's volumes")
    timeout_s: float | None = Field(
        default=None,
        gt=0,
        le=MAX_TTL_S,
        description="time to live; none: kept until deleted",
    )
    size_bytes: int | None = Field(
        default=None,
        gt=0,
        description=(
            "the capacity asked for (kubernetes: the claim's storage request; default the "
            "owner's max_volume_bytes, else 1 GiB); over max_volume_bytes: 429"
        ),
    )
    labels: Labels = Field(default_factory=dict)


class Volume(WireModel):
    id: str
    name: str
    created_at: datetime
    expires_at: datetime | None = None
    size_bytes: int | None = Field(
        default=None,
        description="bytes its files take on disk, measured now; null where the service "
        "cannot see them (kubernetes: the files are on the node)",
    )
    max_bytes: int | None = Field(
        default=None, description="the owner's max_volume_bytes: checked when mounted"
    )
    mounted_by: list[str] = Field(
        default_factory=list, description="the sandboxes that mount it now"
    )
    labels: dict[str, str] = Field(default_factory=dict)


class VolumeList(WireModel):
    volumes: list[Volume]
