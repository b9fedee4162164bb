"""The wire contract: pydantic models for every JSON body of the REST API and the agent.

The service, the SDK and the CLI share them. Per-sandbox routes (exec, processes, files)
mirror the agent's JSON one to one (docs/agent-api.md), so the service forwards them
without re-shaping; `orchard.env.wire` exports those models as JSON Schema, which the Go
agent's structs are tested against (agent/testdata/wire_schema.json).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from orchard.env.input_limits import MIN_CPU, MIN_DISK_BYTES, check_env, check_labels, parse_size

Encoding = Literal["text", "base64"]
SandboxStatus = Literal["pending", "ready", "paused", "exited", "failed"]

# Upper bounds that keep one request from asking for something absurd.
MAX_TTL_S = 7 * 24 * 3600
MAX_BATCH = 1000


# Bounded in count and size (input_limits.py): 422 past them.
Env = Annotated[dict[str, str], AfterValidator(check_env)]


def check_keys(v: dict[str, str] | None) -> dict[str, str] | None:
    """Env and label keys a container can carry: not empty, no `=`, no NUL (values too)."""
    for k, val in (v or {}).items():
        if not k or "\x00" in k or "\x00" in val or "=" in k:
            raise ValueError(f"invalid key or value: {k[:40]!r}")
    return v


Labels = Annotated[dict[str, str], AfterValidator(check_labels)]


class WireModel(BaseModel):
    """Base of every JSON body on the wire: unknown fields are refused, never ignored.

    (Not to be confused with the LLM model protocol the task families use.)
    """

    model_config = ConfigDict(extra="forbid")


# ---------------------------------------------------------------- errors


class ErrorBody(WireModel):
    code: str = Field(description="stable, machine-readable error code")
    message: str = Field(description="what went wrong, for a human")
    details: dict[str, Any] | None = None


class ErrorResponse(WireModel):
    error: ErrorBody


# ---------------------------------------------------------------- sandboxes


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


# ---------------------------------------------------------------- exec


class ExecRequest(WireModel):
    cmd: str | list[str] = Field(description="a shell string (/bin/sh -c) or an argv list")
    cwd: str | None = None
    env: Env = Field(default_factory=dict)
    user: str | None = None
    stdin: str | None = Field(default=None, description="text for the command's stdin")
    stdin_b64: str | None = Field(default=None, description="stdin bytes, base64 (or `stdin`)")
    timeout_s: float | None = Field(default=None, ge=0, le=MAX_TTL_S)
    max_output_bytes: int | None = Field(default=None, ge=1024, le=1 << 30)
    output_encoding: Encoding = "text"

    @field_validator("cmd")
    @classmethod
    def _nonempty(cls, v: str | list[str]) -> str | list[str]:
        if isinstance(v, list) and not v:
            raise ValueError("cmd must not be an empty list")
        if isinstance(v, str) and not v.strip():
            raise ValueError("cmd must not be empty")
        return v

    @model_validator(mode="after")
    def _one_stdin(self) -> ExecRequest:
        if self.stdin is not None and self.stdin_b64 is not None:
            raise ValueError("give stdin or stdin_b64, not both")
        return self


class ExecResult(WireModel):
    exit_code: int
    stdout: str
    stderr: str
    encoding: Encoding = "text"
    duration_s: float
    timed_out: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    stdout_file: str | None = None
    stderr_file: str | None = None
    signal: str | None = None


class StreamEvent(WireModel):
    """One NDJSON line of a streaming exec or a process follow."""

    model_config = ConfigDict(extra="allow")
    type: Literal["stdout", "stderr", "exit", "error"]
    data: str | None = None
    offset: int | None = None
    exit_code: int | None = None
    duration_s: float | None = None
    timed_out: bool | None = None
    signal: str | None = None
    code: str | None = None
    message: str | None = None


# ---------------------------------------------------------------- processes


class ProcessStart(ExecRequest):
    pty: bool = False
    rows: int = Field(default=24, ge=1, le=1000)
    cols: int = Field(default=80, ge=1, le=1000)
    tag: str | None = Field(default=None, max_length=128)


class ProcessInfo(WireModel):
    model_config = ConfigDict(extra="allow")
    id: str
    pid: int
    cmd: str | list[str]
    tag: str | None = None
    pty: bool = False
    status: Literal["running", "exited"]
    exit_code: int | None = None
    signal: str | None = None
    timed_out: bool = False
    started_at: float
    ended_at: float | None = None
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    stdin_open: bool = False


class ProcessList(WireModel):
    processes: list[ProcessInfo]


class ProcessOutput(WireModel):
    stream: Literal["stdout", "stderr"]
    offset: int
    next_offset: int
    data: str
    encoding: Encoding
    eof: bool
    dropped: bool = False


class StdinWrite(WireModel):
    data: str = ""
    encoding: Encoding = "text"
    close: bool = False


class SignalRequest(WireModel):
    signal: str | int = "TERM"
    group: bool = True


class ResizeRequest(WireModel):
    rows: int = Field(ge=1, le=1000)
    cols: int = Field(ge=1, le=1000)


# ---------------------------------------------------------------- files


class FileStat(WireModel):
    path: str
    name: str
    type: Literal["file", "dir", "symlink", "other"]
    size: int
    mode: int
    mtime: float
    link_target: str | None = None


class FileList(WireModel):
    path: str
    entries: list[FileStat]


class MkdirRequest(WireModel):
    path: str
    mode: int = Field(default=0o755, ge=0, le=0o7777)
    parents: bool = True


class RemoveRequest(WireModel):
    path: str
    recursive: bool = False


class MoveRequest(WireModel):
    src: str
    dst: str
    overwrite: bool = False


class TarResult(WireModel):
    files: int
    bytes: int


# ---------------------------------------------------------------- service


class AgentHealth(WireModel):
    """The agent's `GET /health` (open, no token): what the service polls for readiness."""

    status: Literal["ok"]
    version: str
    uptime_s: float
    pid: int


class TokenUpdate(WireModel):
    """The agent's `POST /token`: its new bearer token (a copy restored from a memory
    snapshot wakes up with its source's; docs/state.md)."""

    token: str = Field(min_length=16)


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
