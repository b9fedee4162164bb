"""Typed errors: one class per stable error code, shared by the service and the SDK.

The service raises these; the API layer turns them into `{"error": {code, message}}`
with the right status; the SDK turns such a response back into the same class.
"""

from __future__ import annotations

from typing import Any, ClassVar

NOT_APPLIED = "Orchard-Not-Applied"


class OrchardError(Exception):
    """Base of every error Orchard reports on purpose."""

    code: ClassVar[str] = "internal"
    status: ClassVar[int] = 500
    # The service took no effect of the request: even a create may be resent. Sent as the
    # NOT_APPLIED header, so a client can tell without parsing the body.
    not_applied: ClassVar[bool] = False

    def __init__(self, message: str, *, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details:
            body["details"] = self.details
        return {"error": body}


class BadRequest(OrchardError):
    code, status = "bad_request", 400


class InvalidRequest(OrchardError):
    code, status = "invalid_request", 422


class EgressDenied(InvalidRequest):
    """An allow entry that could only reach what no sandbox may: another sandbox, the host."""

    code = "egress_denied"


class InvalidMount(InvalidRequest):
    """A `volumes` entry of a create: a bad target or mode (`details.reason` says which)."""

    code = "invalid_mount"


class ImageRefused(InvalidRequest):
    """An image reference the image policy refuses (an image id, a registry not allowed)."""

    code = "image_refused"


class Unauthorized(OrchardError):
    code, status = "unauthorized", 401


class Forbidden(OrchardError):
    code, status = "forbidden", 403


class NotFound(OrchardError):
    code, status = "not_found", 404


class ImageNotFound(OrchardError):
    code, status = "image_not_found", 404


class Conflict(OrchardError):
    code, status = "conflict", 409


class VolumeInUse(Conflict):
    """Deleting a volume that a running (or paused, or starting) sandbox mounts."""

    code = "volume_in_use"


class VolumeExists(Conflict):
    """Creating a volume under a name the owner already uses."""

    code = "volume_exists"


class SandboxPaused(Conflict):
    """A per-sandbox request (exec, files, ports) to a paused sandbox: resume it first."""

    code = "sandbox_paused"


class PoolMismatch(Conflict):
    """A create with `pool` that asks for another image, size or start-up than the pool's."""

    code = "pool_mismatch"


class SandboxExited(OrchardError):
    code, status = "sandbox_exited", 410


class MemorySnapshotFailed(Conflict):
    """CRIU could not checkpoint or restore this sandbox's processes as they are now (e.g. a
    request to its agent in flight); `details.criu` holds CRIU's own error lines."""

    code = "memory_snapshot_failed"


class TooLarge(OrchardError):
    code, status = "too_large", 413


class VolumeFull(TooLarge):
    """Mounting a volume that holds more than the owner's max_volume_bytes."""

    code = "volume_full"


class RateLimited(OrchardError):
    code, status = "rate_limited", 429


class QuotaExceeded(RateLimited):
    """Over a quota (Orchard's own, or the cluster's ResourceQuota): nothing was created."""

    code = "quota_exceeded"


class AdmissionDenied(Forbidden):
    """The platform's admission (e.g. Kubernetes Pod Security) refused what was asked."""

    code = "admission_denied"


class NotSupported(OrchardError):
    """The backend cannot do this at all (e.g. pause on kubernetes): docs/state.md says why."""

    code, status = "not_supported", 501


class MemoryNotSupported(NotSupported):
    """Memory snapshots (CRIU) cannot work on this backend or host; `details.reason` says why."""

    code = "memory_not_supported"


class Unavailable(OrchardError):
    """Transient: the backend, the registry or the agent did not answer. Safe to retry."""

    code, status = "unavailable", 503


class ServiceStopping(Unavailable):
    """This replica is stopping and made nothing of the request (a create in flight was
    undone): any call may be sent again, to another replica or once it is back."""

    code = "service_stopping"
    not_applied = True
    UNDONE: ClassVar[str] = "the service is stopping: the create was undone"


class RegistryUnavailable(Unavailable):
    code = "registry_unavailable"


class AgentUnavailable(Unavailable):
    code = "agent_unavailable"


class SandboxUnresponsive(AgentUnavailable):
    """The sandbox runs, but its agent answers nothing, not even its health check (something
    in the sandbox stopped it, e.g. a debugger attached to PID 1). Retry once it runs again."""

    code = "sandbox_unresponsive"


class Unschedulable(Unavailable):
    """No node can take the sandbox now (too big, or the cluster is full)."""

    code = "unschedulable"


class CapacityExceeded(Unavailable):
    """The host has no room for the sandbox now (memory, disk, pids): nothing was created."""

    code = "capacity"


class Internal(OrchardError):
    code, status = "internal", 500


def _all_subclasses(cls: type[OrchardError]) -> list[type[OrchardError]]:
    out: list[type[OrchardError]] = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_all_subclasses(sub))
    return out


_BY_CODE: dict[str, type[OrchardError]] = {c.code: c for c in _all_subclasses(OrchardError)}
_BY_STATUS: dict[int, type[OrchardError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: SandboxExited,
    413: TooLarge,
    422: InvalidRequest,
    429: RateLimited,
    501: NotSupported,
    503: Unavailable,
}


def error_from_response(status: int, body: Any) -> OrchardError:
    """Rebuild the typed error from an HTTP error response (service or agent)."""
    code, message, details = None, f"HTTP {status}", None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        err = body["error"]
        code = err.get("code")
        message = str(err.get("message", message))
        details = err.get("details")
    cls = _BY_CODE.get(str(code)) or _BY_STATUS.get(status) or OrchardError
    exc = cls(message, details=details)
    if code and cls.code != code:
        exc.code = str(code)  # type: ignore[misc]
    return exc
