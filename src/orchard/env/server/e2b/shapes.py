"""E2B's control-API shapes for Orchard's sandboxes, errors and templates (E2B's
`spec/openapi.yml`: Sandbox, SandboxDetail, ListedSandbox, Error).

A template id is an image: an alias named in `ORCHARD_E2B_TEMPLATES`
(`base=IMAGE,name=IMAGE`), else the id itself, which the image policy then judges like
any create's image. The template id and E2B's metadata are kept as the sandbox's
labels (`e2b.template`; metadata keys as they are), so any replica reads them back.
"""

from __future__ import annotations

import math
import os
from datetime import datetime
from typing import Any

from fastapi.responses import JSONResponse

from orchard.env.errors import (
    ImageNotFound,
    InvalidRequest,
    NotFound,
    OrchardError,
    QuotaExceeded,
    SandboxExited,
)
from orchard.env.models import NetworkPolicy, Sandbox

TEMPLATES_ENV = "ORCHARD_E2B_TEMPLATES"
READY_ENV = "ORCHARD_E2B_READY_PORTS"
DOMAIN_ENV = "ORCHARD_E2B_DOMAIN"
TEMPLATE_LABEL = "e2b.template"
LABEL_PREFIX = "e2b."
# What the SDK reads to decide which envd features it may use: a default user (0.4.0),
# closing stdin (0.5.2), octet-stream and gzip uploads (0.5.7), file metadata (0.6.2:
# refused with a 400, not dropped: files.py), entries in watch events (0.6.3), watching
# network mounts (0.6.4: a polled watch works on any file system).
ENVD_VERSION = "0.6.4"
CLIENT_ID = "orchard"
DEFAULT_TIMEOUT_S = 300


def parse_templates(raw: str) -> dict[str, str]:
    """`base=IMAGE,python=IMAGE` -> {"base": IMAGE, ...} (blank entries ignored)."""
    out: dict[str, str] = {}
    for entry in raw.split(","):
        name, sep, image = entry.strip().partition("=")
        if entry.strip() and (not sep or not name.strip() or not image.strip()):
            raise ValueError(f"{entry.strip()!r} is not NAME=VALUE")
        if sep:
            out[name.strip()] = image.strip()
    return out


def templates() -> dict[str, str]:
    """The operator's template aliases (read per call: cheap, and tests set them per run)."""
    try:
        return parse_templates(os.environ.get(TEMPLATES_ENV, ""))
    except ValueError as e:
        raise InvalidRequest(f"{TEMPLATES_ENV}: {e}") from None


def ready_ports() -> dict[str, int]:
    """Templates whose create waits for a server (`ORCHARD_E2B_READY_PORTS`:
    `code-interpreter-v1=49999`): the port must answer HTTP before create returns."""
    out: dict[str, int] = {}
    try:
        entries = parse_templates(os.environ.get(READY_ENV, ""))
    except ValueError as e:
        raise InvalidRequest(f"{READY_ENV}: {e}") from None
    for name, port in entries.items():
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidRequest(f"{READY_ENV}: {port!r} is not a port")
        out[name] = int(port)
    return out


def sandbox_domain() -> str | None:
    """The domain sandboxes are reached under by host name (`ORCHARD_E2B_DOMAIN`, with a
    `:port` if the listener is not on 443), answered as a sandbox's `domain`: the SDK then
    names its hosts (`get_host`, and its URLs when E2B_SANDBOX_URL is unset) under it."""
    return os.environ.get(DOMAIN_ENV, "").strip().strip(".").lower() or None


def image_for(template_id: str) -> str:
    return templates().get(template_id, template_id)


def network_policy(body: dict[str, Any]) -> NetworkPolicy:
    """E2B allows the internet unless told not to (`allow_internet_access: false`, or a
    network whose denyOut holds 0.0.0.0/0); an allowOut list then opens just those."""
    network = body.get("network")
    network = network if isinstance(network, dict) else {}
    deny = network.get("denyOut") or []
    allow = network.get("allowOut") or []
    if body.get("allow_internet_access") is False or "0.0.0.0/0" in deny:
        return NetworkPolicy(egress="allow", allow=allow) if allow else NetworkPolicy()
    return NetworkPolicy(egress="all")


def _rfc3339(when: datetime) -> str:
    return when.isoformat().replace("+00:00", "Z")


def metadata_of(sandbox: Sandbox) -> dict[str, str]:
    return {k: v for k, v in sandbox.labels.items() if not k.startswith(LABEL_PREFIX)}


def template_of(sandbox: Sandbox) -> str:
    return sandbox.labels.get(TEMPLATE_LABEL, sandbox.image)


def state_of(sandbox: Sandbox) -> str | None:
    """E2B's state (running | paused), or None for one E2B has no word for (exited)."""
    if sandbox.status in ("ready", "pending"):
        return "running"
    if sandbox.status == "paused":
        return "paused"
    return None


def created(sandbox: Sandbox, token: str, traffic: str | None = None) -> dict[str, Any]:
    """E2B's `Sandbox`: what create and connect answer."""
    return {
        "templateID": template_of(sandbox),
        "sandboxID": sandbox.id,
        "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": token,
        "alias": template_of(sandbox),
        "domain": sandbox_domain(),
        "trafficAccessToken": traffic,
    }


def listed(sandbox: Sandbox) -> dict[str, Any]:
    """E2B's `ListedSandbox`."""
    res = sandbox.resources
    return {
        "templateID": template_of(sandbox),
        "alias": template_of(sandbox),
        "sandboxID": sandbox.id,
        "clientID": CLIENT_ID,
        "startedAt": _rfc3339(sandbox.created_at),
        "endAt": _rfc3339(sandbox.expires_at),
        "cpuCount": max(1, math.ceil(res.cpu or 1)),
        "memoryMB": (res.memory_bytes or 0) >> 20,
        "diskSizeMB": (res.disk_bytes or 0) >> 20,
        "state": state_of(sandbox) or "running",
        "envdVersion": ENVD_VERSION,
        "metadata": metadata_of(sandbox),
    }


def detail(sandbox: Sandbox, token: str) -> dict[str, Any]:
    """E2B's `SandboxDetail` (get_info)."""
    return {
        **listed(sandbox),
        "envdAccessToken": token,
        "domain": sandbox_domain(),
        "allowInternetAccess": sandbox.network.egress != "none",
    }


# ---------------------------------------------------------------- errors


def error(status: int, message: str, *, retry_after_s: float | None = None) -> JSONResponse:
    """E2B's `Error`: `{"code": status, "message": ...}`, which the SDK maps by status."""
    resp = JSONResponse({"code": status, "message": message}, status_code=status)
    if retry_after_s:
        resp.headers["Retry-After"] = str(max(1, math.ceil(retry_after_s)))
    return resp


def from_orchard(err: OrchardError, template_id: str | None = None) -> JSONResponse:
    """E2B's error answer for one of Orchard's (codes per errors.py; E2B uses 400 for
    every invalid input, and knows no exited sandbox: that is a 404)."""
    status = err.status
    message = err.message
    if isinstance(err, SandboxExited):
        status = 404
    elif isinstance(err, ImageNotFound | NotFound) and template_id is not None:
        status = 404
        if template_id not in templates():
            message = (
                f"template {template_id!r} not found: {message} (a template is an image, or "
                f"an alias the operator names in {TEMPLATES_ENV})"
            )
    elif status == 422:
        status = 400
    resp = error(status, message, retry_after_s=(err.details or {}).get("retry_after_s"))
    if isinstance(err, QuotaExceeded):
        # Waiting does not lower a quota of sandboxes held: the SDK should not retry blindly.
        resp.headers["Should-Retry"] = "false"
    return resp
