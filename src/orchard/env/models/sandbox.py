"""Wire models of sandboxes: create (one or a batch), the sandbox itself, its egress
policy and lifetime; the service's health and usage; port links."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from orchard.env.input_limits import MIN_CPU, MIN_DISK_BYTES, parse_size
from orchard.env.models.base import MAX_TTL_S, Env, ErrorBody, Labels, WireModel, check_keys

SandboxStatus = Literal["pending", "ready", "paused", "exited", "failed"]
MAX_BATCH = 1000


class NetworkPolicy(WireModel):
    """Egress policy, enforced on the host, never by anything inside the sandbox.

    `none`: no network interface but loopback. `all`: anything but cloud metadata.
    `allow`: only the CIDRs and host names in `allow` (names resolved when applied).
    """

    egress: Literal["none", "all", "allow"] = "none"
    allow: list[Annotated[str, Field(min_length=1, max_length=253)]] = Field(
        default_factory=list, max_length=256
    )

    @model_validator(mode="after")
    def _allow_only_with_allow(self) -> NetworkPolicy:
        if self.allow and self.egress != "allow":
            raise ValueError("'allow' entries need egress='allow'")
        return self


class SandboxCreate(WireModel):
    image: str = Field(
        default="", max_length=512, description="any OCI image reference (or give `snapshot`)"
    )
    snapshot: str | None = Field(
        default=None,
        max_length=64,
        description="start from this snapshot: its image, files and settings, unless overridden",
    )
    pool: str | None = Field(
        default=None,
        max_length=64,
        description="claim a ready sandbox of this warm pool (docs/pools.md); a fresh create "
        "when it has none ready",
    )
    cmd: list[str] | None = Field(
        default=None,
        description="run this (or, with [], the image's own entrypoint+cmd) under the agent",
    )
    env: Env = Field(default_factory=dict)
    workdir: str | None = None
    user: str | None = Field(default=None, max_length=64)
    cpu: float | None = Field(default=None, ge=MIN_CPU, le=256, description="CPU cores")
    memory: str | int | None = Field(default=None, description="bytes, or e.g. '512m', '2g'")
    disk: str | int | None = Field(
        default=None,
        description="what the sandbox may write to its root filesystem: bytes, or e.g. '10g' "
        "(per backend: docs/backends.md)",
    )
    pids_limit: int | None = Field(default=None, ge=8, le=1_000_000)
    timeout_s: float = Field(default=3600, gt=0, le=MAX_TTL_S, description="time to live")
    idle_timeout_s: float | None = Field(default=None, gt=0, le=MAX_TTL_S)
    network: NetworkPolicy = Field(default_factory=NetworkPolicy)
    labels: Labels = Field(default_factory=dict)
    volumes: dict[str, str] = Field(
        default_factory=dict,
        description='volumes to mount: target path -> "name" or "name:ro" (docs/volumes.md)',
    )
    wait: bool = Field(default=True, description="answer only once the agent is ready")
    count: int = Field(default=1, ge=1, le=MAX_BATCH, description="batch size (batch route)")

    @field_validator("env", "labels")
    @classmethod
    def _no_nul(cls, v: dict[str, str]) -> dict[str, str]:
        check_keys(v)
        return v

    @model_validator(mode="after")
    def _null_size_is_not_given(self) -> SandboxCreate:
        """`"cpu": null` / `"memory": null` mean what leaving them out means (the default
        size, or a snapshot's or a pool's), never "unlimited": a null counted as nothing
        against the quota and ran without a limit (issue 31, hole 1)."""
        for name in ("cpu", "memory"):
            if getattr(self, name) is None:
                self.__pydantic_fields_set__.discard(name)
        return self

    @model_validator(mode="after")
    def _image_or_snapshot(self) -> SandboxCreate:
        if not self.image and not self.snapshot and not self.pool:
            raise ValueError("give an image (or a snapshot to start from, or a pool)")
        return self

    @field_validator("disk")
    @classmethod
    def _disk_size(cls, v: str | int | None) -> str | int | None:
        parse_size(v, "disk", MIN_DISK_BYTES)
        return v

    @property
    def disk_bytes(self) -> int | None:
        """`disk` in bytes (validated already)."""
        return parse_size(self.disk, "disk", MIN_DISK_BYTES)


class Resources(WireModel):
    cpu: float | None = None
    memory_bytes: int | None = None
    pids_limit: int | None = None
    disk_bytes: int | None = None


class Sandbox(WireModel):
    id: str
    image: str
    status: SandboxStatus
    created_at: datetime
    expires_at: datetime
    idle_timeout_s: float | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    network: NetworkPolicy
    resources: Resources = Field(default_factory=Resources)
    exit_code: int | None = None
    error: str | None = None
    volumes: dict[str, str] = Field(
        default_factory=dict, description='its mounts: target -> "name" or "name:ro"'
    )
    from_pool: bool | None = Field(
        default=None,
        description="on the answer to a create with `pool`: whether a ready sandbox was "
        "claimed (false: the pool had none, so it was created fresh)",
    )


class SandboxList(WireModel):
    sandboxes: list[Sandbox]


class BatchCreateResult(WireModel):
    sandboxes: list[Sandbox]
    errors: list[ErrorBody] = Field(default_factory=list)


class TimeoutUpdate(WireModel):
    timeout_s: float = Field(gt=0, le=MAX_TTL_S, description="new time to live, from now")


class Health(WireModel):
    status: Literal["ok", "degraded"]
    version: str
    # Only with a valid API key (counts are not for anyone who can reach the port).
    backend: str | None = None
    sandboxes: int | None = None


class Usage(WireModel):
    """What the caller's key holds now against its limits (`GET /v1/usage`)."""

    owner: str
    sandboxes: int = Field(description="sandboxes that exist, any state, incl. creating")
    creating: int = Field(description="creates in flight")
    cpu: float = Field(description="cores, summed over running and paused sandboxes")
    memory_bytes: int = Field(description="memory limits, summed likewise")
    limits: dict[str, float | int | None] = Field(description="the key's limits; null: none")


class PortLinkCreate(WireModel):
    port: int = Field(ge=1, le=65535)
    ttl_s: float = Field(default=600, gt=0, le=86400, description="how long the link works")


class PortLink(WireModel):
    """A URL a browser may open without the API key: `/p/{token}/...` reaches one port of
    one sandbox until `expires_at` (an HMAC of the service secret, never stored)."""

    url: str = Field(description="path on the service, e.g. /p/<token>/")
    token: str
    expires_at: datetime
