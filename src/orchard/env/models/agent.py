"""Wire models of the agent's own routes: its health and its token."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from orchard.env.models.base import WireModel


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
