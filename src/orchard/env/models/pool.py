"""Wire models of warm pools (docs/pools.md): the pool itself and what a claim tells the agent.

`SandboxCreate.pool` and `Sandbox.from_pool` live with the rest of the create
(`sandbox.py`).
"""

from __future__ import annotations

from datetime import datetime

from pydantic import Field, field_validator

from orchard.env.input_limits import MIN_CPU, MIN_DISK_BYTES, parse_size
from orchard.env.models.base import Env, WireModel
from orchard.env.models.sandbox import NetworkPolicy

MAX_POOL_SIZE = 1000
POOL_NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"


class PoolCreate(WireModel):
    """A warm pool: `size` ready sandboxes of one image and size, claimed by creates with `pool`."""

    name: str = Field(pattern=POOL_NAME_PATTERN, description="unique per owner")
    image: str = Field(min_length=1, max_length=512)
    size: int = Field(ge=0, le=MAX_POOL_SIZE, description="ready sandboxes to keep")
    cpu: float | None = Field(default=None, ge=MIN_CPU, le=256)
    memory: str | int | None = Field(default=None, description="bytes, or e.g. '512m'")
    disk: str | int | None = None
    pids_limit: int | None = Field(default=None, ge=8, le=1_000_000)
    network: NetworkPolicy = Field(
        default_factory=NetworkPolicy,
        description="the egress its sandboxes are born with; a claim asking for the same "
        "one changes nothing, another one is applied at claim",
    )

    @field_validator("disk")
    @classmethod
    def _disk_size(cls, v: str | int | None) -> str | int | None:
        parse_size(v, "disk", MIN_DISK_BYTES)  # as SandboxCreate: 422 here, not later
        return v


class PoolSettings(WireModel):
    """What every sandbox of the pool is made with (the service's defaults filled in)."""

    image: str
    cpu: float | None = None
    memory_bytes: int | None = None
    disk_bytes: int | None = None
    pids_limit: int | None = None
    network: NetworkPolicy = Field(default_factory=NetworkPolicy)


class Pool(WireModel):
    name: str
    size: int
    ready: int = Field(description="sandboxes waiting to be claimed")
    creating: int = Field(description="refills in flight")
    failed: int = Field(description="refills that failed since the pool was made or loaded")
    claimed: int = Field(description="claims served from the pool since then")
    last_error: str | None = Field(default=None, description="why the last refill failed")
    created_at: datetime
    settings: PoolSettings


class PoolList(WireModel):
    pools: list[Pool]


class AgentDefaults(WireModel):
    """`PUT /defaults` on the agent: a claimed sandbox's env, working directory and user,
    the defaults of every later command (a request's own still win)."""

    env: Env | None = None
    cwd: str | None = None
    user: str | None = Field(default=None, max_length=64)
