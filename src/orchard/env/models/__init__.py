"""The wire contract: pydantic models for every JSON body of the REST API and the agent,
one module per resource (`sandbox`, `exec`, `files`, `agent`, `state`, `pool`, `volume`)
over `base` (`WireModel`, errors).

The service, the SDK and the CLI share them. Per-sandbox routes (exec, processes, files)
mirror the agent's JSON one to one (docs/agent-api.md), so the service forwards them
without re-shaping; `orchard.env.wire` exports those models as JSON Schema, which the Go
agent's structs are tested against (agent/testdata/wire_schema.json).

This package exports the models of sandboxes, commands, files and the agent by name
(`from orchard.env import models as m; m.Sandbox`), as the one `models.py` did; the
state, pool and volume models are read from their modules (`models.state`, ...).
"""

from __future__ import annotations

from orchard.env.models.agent import (
    AgentHealth,
    TokenUpdate,
)
from orchard.env.models.base import (
    MAX_TTL_S,
    Encoding,
    Env,
    ErrorBody,
    ErrorResponse,
    Labels,
    WireModel,
    check_keys,
)
from orchard.env.models.exec import (
    ExecRequest,
    ExecResult,
    ProcessInfo,
    ProcessList,
    ProcessOutput,
    ProcessStart,
    ResizeRequest,
    SignalRequest,
    StdinWrite,
    StreamEvent,
)
from orchard.env.models.files import (
    FileList,
    FileStat,
    MkdirRequest,
    MoveRequest,
    RemoveRequest,
    TarResult,
)
from orchard.env.models.sandbox import (
    MAX_BATCH,
    BatchCreateResult,
    Health,
    NetworkPolicy,
    PortLink,
    PortLinkCreate,
    Resources,
    Sandbox,
    SandboxCreate,
    SandboxList,
    SandboxStatus,
    TimeoutUpdate,
    Usage,
)

__all__ = [
    "MAX_BATCH",
    "MAX_TTL_S",
    "AgentHealth",
    "BatchCreateResult",
    "Encoding",
    "Env",
    "ErrorBody",
    "ErrorResponse",
    "ExecRequest",
    "ExecResult",
    "FileList",
    "FileStat",
    "Health",
    "Labels",
    "MkdirRequest",
    "MoveRequest",
    "NetworkPolicy",
    "PortLink",
    "PortLinkCreate",
    "ProcessInfo",
    "ProcessList",
    "ProcessOutput",
    "ProcessStart",
    "RemoveRequest",
    "ResizeRequest",
    "Resources",
    "Sandbox",
    "SandboxCreate",
    "SandboxList",
    "SandboxStatus",
    "SignalRequest",
    "StdinWrite",
    "StreamEvent",
    "TarResult",
    "TimeoutUpdate",
    "TokenUpdate",
    "Usage",
    "WireModel",
    "check_keys",
]
