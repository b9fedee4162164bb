"""Service configuration: API keys, the service secret, the state folder and limits.

Built from environment variables (`ServiceConfig.from_env`) or directly in code/tests.
The secret derives every sandbox's agent token, so it must be the same for every
replica and survive restarts: it comes from ORCHARD_SECRET or a file in the state folder.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchard.env.backends.runtimes import LOCAL_RUNTIMES
from orchard.env.image_policy import DEFAULT_REGISTRIES, ImagePolicy
from orchard.env.input_limits import MIN_CPU, MIN_DISK_BYTES, parse_size
from orchard.env.limits import Limits

DEFAULT_MAX_UPLOAD_BYTES = 1 << 30


class ConfigError(ValueError):
    """The configuration cannot work (e.g. no API keys on a public address)."""


def default_state_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/var/lib/orchard")
    return Path.home() / ".local" / "state" / "orchard"


def key_owner(entry: str) -> tuple[str, str]:
    """Split one configured key into (owner, key): `name:key`, or a bare key owned by its hash."""
    entry = entry.strip()
    name, sep, key = entry.partition(":")
    if sep and name and key:
        return name, key
    return hashlib.sha256(entry.encode()).hexdigest()[:12], entry


def parse_api_keys(entries: list[str]) -> dict[str, str]:
    """Map key -> owner from `name:key` / `key` entries; blank lines and `#` comments skipped."""
    keys: dict[str, str] = {}
    for raw in entries:
        raw = raw.strip()
        if not raw or raw.startswith("#"):
            continue
        owner, key = key_owner(raw)
        keys[key] = owner
    return keys


def load_secret(state_dir: Path, name: str = "secret") -> bytes:
    """Read `<state_dir>/<name>`, creating it (0600, exclusively) on first use."""
    path = state_dir / name
    state_dir.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        # Written in one call; a replica racing us reads it only once it is non-empty.
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    for _ in range(100):
        text = path.read_text().strip()
        if text:
            return text.encode()
        time.sleep(0.01)
    raise ConfigError(f"secret file {path} is empty")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass
class ServiceConfig:
    """Everything the service needs; `api_keys` maps key -> owner (empty = auth off)."""

    state_dir: Path = field(default_factory=default_state_dir)
    api_keys: dict[str, str] = field(default_factory=dict)
    secret: bytes = b""
    backend: str = "auto"  # docker | local | kubernetes; auto: docker if an engine answers
    agent_binary: str | None = None
    reconcile_interval_s: float = 5.0
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES
    ready_timeout_s: float = 60.0
    # Bounds a backend call that never returns (a stalled engine); generous for big pulls.
    create_timeout_s: float = 600.0
    batch_concurrency: int = 32
    # Extra backend labels on every sandbox's container (tests use {"orchard.test": "1"}).
    extra_labels: dict[str, str] = field(default_factory=dict)
    # Registries images may come from (image_policy.py): listed ones are trusted; `*` adds
    # every other public one. Folders the local backend may read oci:/docker-archive: from.
    registries: tuple[str, ...] = DEFAULT_REGISTRIES
    image_dirs: tuple[str, ...] = ()
    # Ranges no sandbox may reach besides the sandbox networks (a cluster's pod/service CIDRs).
    egress_protect: tuple[str, ...] = ()
    # The disk limit of sandboxes that ask for none (None: unlimited); docs/backends.md.
    default_disk_bytes: int | None = None
    # The OCI runtime of new local sandboxes: auto (crun if installed) | crun | runc.
    local_runtime: str = "auto"
    # Per-owner quotas (limits.py; `orchard serve --limits FILE`, ORCHARD_LIMITS).
    limits: Limits = field(default_factory=Limits)
    # The cpu/memory of sandboxes that ask for none, so an unlimited one is the operator's
    # deliberate choice (ORCHARD_DEFAULT_CPU / ORCHARD_DEFAULT_MEMORY = "none").
    default_cpu: float | None = 1.0
    default_memory_bytes: int | None = 1 << 30
    # Host capacity (docker, local): a create is 503 `capacity` when its memory limit is
    # more than what the host has available minus this, or the state dir's free disk is
    # below `reserve_disk_bytes`, or the host's pids are over 90% used.
    reserve_memory_bytes: int = 256 << 20
    reserve_disk_bytes: int = 1 << 30
    # Owners whose keys see the whole service in /metrics and /healthz (every owner's
    # figures); any other key sees its own only (ORCHARD_OPERATORS, `serve --operator`).
    operators: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir)
        if not self.secret:
            self.secret = load_secret(self.state_dir)
        if self.reconcile_interval_s <= 0:
            raise ConfigError("reconcile interval must be > 0")
        if self.max_upload_bytes <= 0:
            raise ConfigError("max upload bytes must be > 0")
        for cidr in self.egress_protect:
            try:
                ipaddress.IPv4Network(cidr, strict=False)
            except ValueError as e:
                raise ConfigError(f"egress_protect: {e}") from None
        if self.default_disk_bytes is not None and self.default_disk_bytes < MIN_DISK_BYTES:
            raise ConfigError(f"default disk must be at least {MIN_DISK_BYTES >> 20} MiB")
        if self.local_runtime not in LOCAL_RUNTIMES:
            choices = ", ".join(LOCAL_RUNTIMES)
            raise ConfigError(f"local runtime must be one of {choices}, not {self.local_runtime!r}")
        if self.default_cpu is not None and self.default_cpu < MIN_CPU:
            raise ConfigError(f"default cpu must be at least {MIN_CPU}")
        if self.default_memory_bytes is not None and self.default_memory_bytes < 4 << 20:
            raise ConfigError("default memory must be at least 4 MiB")
        self.operators = frozenset(self.operators)
        unknown = sorted(self.operators - set(self.api_keys.values())) if self.api_keys else []
        if unknown:
            raise ConfigError(f"operators {unknown} own no API key (name them as name:key)")

    @property
    def image_policy(self) -> ImagePolicy:
        return ImagePolicy.from_lists(self.registries, self.image_dirs)

    def backend_options(self) -> dict[str, Any]:
        """The keyword arguments both local backends (docker, local) take from the config."""
        return {
            "extra_labels": self.extra_labels,
            "image_policy": self.image_policy,
            "protect": self.egress_protect,
            "default_disk_bytes": self.default_disk_bytes,
        }

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> ServiceConfig:
        """Read ORCHARD_* variables; keyword arguments (e.g. from CLI flags) win."""
        env = os.environ if env is None else env
        kw: dict[str, object] = {}
        if env.get("ORCHARD_STATE_DIR"):
            kw["state_dir"] = Path(env["ORCHARD_STATE_DIR"])
        entries = [e for e in env.get("ORCHARD_API_KEYS", "").split(",") if e.strip()]
        if env.get("ORCHARD_API_KEYS_FILE"):
            entries += Path(env["ORCHARD_API_KEYS_FILE"]).read_text().splitlines()
        kw["api_keys"] = parse_api_keys(entries)
        if env.get("ORCHARD_OPERATORS"):
            kw["operators"] = frozenset(
                o.strip() for o in env["ORCHARD_OPERATORS"].split(",") if o.strip()
            )
        if env.get("ORCHARD_SECRET"):
            kw["secret"] = env["ORCHARD_SECRET"].encode()
        if env.get("ORCHARD_BACKEND"):
            kw["backend"] = env["ORCHARD_BACKEND"]
        if env.get("ORCHARD_LOCAL_RUNTIME"):
            kw["local_runtime"] = env["ORCHARD_LOCAL_RUNTIME"].strip().lower()
        if env.get("ORCHARD_AGENT_BINARY"):
            kw["agent_binary"] = env["ORCHARD_AGENT_BINARY"]
        for var, name in (
            ("ORCHARD_REGISTRIES", "registries"),
            ("ORCHARD_IMAGE_DIRS", "image_dirs"),
            ("ORCHARD_EGRESS_PROTECT", "egress_protect"),
        ):
            if env.get(var):
                kw[name] = tuple(e.strip() for e in env[var].split(",") if e.strip())
        if env.get("ORCHARD_DEFAULT_DISK"):
            try:
                kw["default_disk_bytes"] = parse_size(
                    env["ORCHARD_DEFAULT_DISK"], "ORCHARD_DEFAULT_DISK", MIN_DISK_BYTES
                )
            except ValueError as e:
                raise ConfigError(str(e)) from None
        try:
            if env.get("ORCHARD_LIMITS"):
                kw["limits"] = Limits.load(env["ORCHARD_LIMITS"])
            if env.get("ORCHARD_DEFAULT_CPU"):
                raw = env["ORCHARD_DEFAULT_CPU"].strip().lower()
                kw["default_cpu"] = None if raw == "none" else float(raw)
            if env.get("ORCHARD_DEFAULT_MEMORY"):
                raw = env["ORCHARD_DEFAULT_MEMORY"].strip().lower()
                memory = None if raw == "none" else parse_size(raw, "ORCHARD_DEFAULT_MEMORY", 0)
                kw["default_memory_bytes"] = memory
        except (OSError, ValueError) as e:
            raise ConfigError(str(e)) from None
        for var, name, conv in (
            ("ORCHARD_RECONCILE_INTERVAL_S", "reconcile_interval_s", float),
            ("ORCHARD_MAX_UPLOAD_BYTES", "max_upload_bytes", int),
            ("ORCHARD_READY_TIMEOUT_S", "ready_timeout_s", float),
            ("ORCHARD_CREATE_TIMEOUT_S", "create_timeout_s", float),
        ):
            if env.get(var):
                try:
                    kw[name] = conv(env[var])
                except ValueError as e:
                    raise ConfigError(f"{var}: {e}") from None
        kw.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**kw)  # type: ignore[arg-type]

    @property
    def auth_enabled(self) -> bool:
        return bool(self.api_keys)

    def owner_for(self, key: str | None) -> str | None:
        """The owner of an API key, or None; with no keys configured everyone is "local".

        Every configured key is compared in constant time so timing reveals nothing.
        """
        if not self.api_keys:
            return "local"
        if not key:
            return None
        found: str | None = None
        given = key.encode()
        for candidate, owner in self.api_keys.items():
            if hmac.compare_digest(candidate.encode(), given):
                found = owner
        return found

    def is_operator(self, owner: str) -> bool:
        """Whether this owner's key sees every owner's figures (auth off: the one user does)."""
        return not self.api_keys or owner in self.operators

    def agent_token(self, sandbox_id: str) -> str:
        """The sandbox's agent token: derived, never stored, so any replica can recompute it."""
        return hmac.new(self.secret, sandbox_id.encode(), hashlib.sha256).hexdigest()

    def check_bind(self, host: str | None, uds: str | None) -> None:
        """Refuse to expose an unauthenticated service beyond this machine."""
        if self.auth_enabled or uds:
            return
        if host is None or not is_loopback(host):
            raise ConfigError(
                f"refusing to listen on {host!r} without API keys: set ORCHARD_API_KEYS "
                "(or ORCHARD_API_KEYS_FILE), or listen on 127.0.0.1 or a Unix socket"
            )
