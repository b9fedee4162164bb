"""Claiming a warm-pool sandbox on a backend: it changes hands without being re-made.

A pooled sandbox is started under its pool's own owner (`<owner>:pool:<name>`, which no
API key can be) with no user labels; a claim gives it the caller as owner, the claim's
labels, time to live, idle timeout and default user. Docker labels cannot change after
create, so, like expiry and egress, these go to the sandbox's `meta.json`, which wins
over the labels (`claimed_at` marks that it does); the local backend keeps them there
anyway. Env, working directory and user of later commands are the agent's (PUT /defaults).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from orchard.env.backends.base import SandboxRecord
from orchard.env.backends.host_folders import HostFolders


@dataclass(frozen=True)
class Claim:
    owner: str
    expires_at: float
    labels: dict[str, str] = field(default_factory=dict)
    idle_timeout_s: float | None = None
    default_user: str | None = None  # None: keep the pool's
    agent_defaults: str | None = None  # kubernetes: written with the claim (SandboxRecord)


@runtime_checkable
class Claimable(Protocol):
    async def claim(self, sandbox_id: str, claim: Claim) -> None:
        """Record the new owner and settings; the sandbox keeps running untouched."""
        ...


def claim_meta(claim: Claim) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "owner": claim.owner,
        "expires_at": float(claim.expires_at),
        "labels": dict(claim.labels),
        "idle_timeout_s": claim.idle_timeout_s,
        "claimed_at": time.time(),
    }
    if claim.default_user is not None:
        meta["default_user"] = claim.default_user
    return meta


def claimed(rec: SandboxRecord, meta: dict[str, Any] | None) -> SandboxRecord:
    """`rec` as its claim left it (Docker: the labels say what the pool made)."""
    if not meta or "claimed_at" not in meta:
        return rec
    return dataclasses.replace(
        rec,
        owner=str(meta.get("owner", rec.owner)),
        labels=dict(meta.get("labels") or {}),
        idle_timeout_s=meta.get("idle_timeout_s"),
        default_user=meta.get("default_user", rec.default_user) or None,
    )


class PoolClaims(HostFolders):
    """Mixin of the backends that keep a `meta.json` per sandbox (docker, local)."""

    async def claim(self, sandbox_id: str, claim: Claim) -> None:
        self._update_meta(sandbox_id, **claim_meta(claim))
