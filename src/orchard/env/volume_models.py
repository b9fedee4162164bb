"""Wire models of volumes (docs/volumes.md): folders that outlive sandboxes, per owner.

Kept apart from `models.py` like `state_models.py`; the mount request itself
(`SandboxCreate.volumes`: target -> "name" or "name:ro") lives with the create.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from orchard.env.models import MAX_TTL_S, Labels, WireModel

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
    labels: Labels = Field(default_factory=dict)


class Volume(WireModel):
    id: str
    name: str
    created_at: datetime
    expires_at: datetime | None = None
    size_bytes: int = Field(description="bytes its files take on disk, measured now")
    max_bytes: int | None = Field(
        default=None, description="the owner's max_volume_bytes: checked when mounted"
    )
    mounted_by: list[str] = Field(
        default_factory=list, description="the sandboxes that mount it now"
    )
    labels: dict[str, str] = Field(default_factory=dict)


class VolumeList(WireModel):
    volumes: list[Volume]
