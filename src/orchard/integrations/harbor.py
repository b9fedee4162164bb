"""A Harbor environment on Orchard, loaded by Harbor's environment import path.

    harbor run -p examples/harbor/fix-greeting -a oracle \\
        --env orchard.integrations.harbor:OrchardEnvironment

Harbor (the Terminal-Bench 2 / SWE-bench runner) needs Python >= 3.12; `scripts/setup.sh`
makes `.venv-harbor` with Harbor and Orchard in it. Each trial gets one sandbox:
the task's `docker_image`, or its `environment/Dockerfile` built on the local Docker engine
(offline when its base image is local), reused by content tag and labelled with the key's
owner (the service runs it for that owner only: image_policy.Ownership). cpu/memory, the network
policy (no-network, allowlist of hosts/IPs/CIDRs, public, changed between phases), exec with
cwd/env/user/timeout and file/folder transfer all map onto the SDK. Options (`--ek k=v`):
`url`, `api_key` (else ORCHARD_URL / ORCHARD_API_KEY, else an in-process service on the
local Docker engine) and `timeout_s` (the sandbox's time to live).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
from pathlib import Path
from typing import Any

from harbor.environments.base import BaseEnvironment, ExecResult  # type: ignore[import-not-found]
from harbor.environments.capabilities import (  # type: ignore[import-not-found]
    EnvironmentCapabilities,
    EnvironmentResourceCapabilities,
)
from harbor.environments.options import EnvironmentOptions  # type: ignore[import-not-found]
from harbor.models.task.config import NetworkMode, NetworkPolicy  # type: ignore[import-not-found]

from orchard import AsyncOrchard
from orchard.env.errors import InvalidRequest
from orchard.env.image_policy import OWNER_LABEL
from orchard.integrations._common import label_value, labels_for

__all__ = ["OrchardEnvironment", "OrchardOptions", "build_image"]

TOOL = "harbor"
_EGRESS = {
    NetworkMode.NO_NETWORK: "none",
    NetworkMode.PUBLIC: "all",
    NetworkMode.ALLOWLIST: "allow",
}


class OrchardOptions(EnvironmentOptions):  # type: ignore[misc]
    """`--ek` options of the Orchard environment."""

    url: str | None = None
    api_key: str | None = None
    timeout_s: float = 4 * 3600.0


def build_image(
    environment_dir: Path, name: str, *, force: bool = False, owner: str | None = None
) -> str:
    """Build `environment_dir/Dockerfile` on the local engine; tag by content, reuse the tag.

    With `owner` the build is labelled `orchard.owner`, and the service runs it for that
    owner only (image_policy.Ownership); the owner is part of the tag, so two owners'
    builds of one task never share an image.
    """
    digest = hashlib.sha256(f"{owner or ''}\0".encode())
    for path in sorted(p for p in environment_dir.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(environment_dir)).encode() + b"\0")
        digest.update(path.read_bytes())
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in name.lower()).strip("-.")
    tag = f"orchard-harbor/{safe or 'task'}:{digest.hexdigest()[:16]}"
    exists = subprocess.run(["docker", "image", "inspect", tag], capture_output=True, check=False)
    if exists.returncode == 0 and not force:
        return tag
    label = ["--label", f"{OWNER_LABEL}={owner}"] if owner else []
    proc = subprocess.run(
        ["docker", "build", "-q", *label, "-t", tag, str(environment_dir)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"docker build of {environment_dir} failed:\n{proc.stderr[-4000:]}")
    return tag


def _network(policy: NetworkPolicy) -> dict[str, Any]:
    egress = _EGRESS[policy.network_mode]
    return {"egress": egress, "allow": list(policy.allowed_hosts) if egress == "allow" else []}


class OrchardEnvironment(BaseEnvironment):  # type: ignore[misc]
    """One Harbor trial's environment: one Orchard sandbox."""

    options_model = OrchardOptions

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._client: AsyncOrchard | None = None
        self._sandbox: Any = None  # an orchard AsyncSandbox
        self._shell = "bash"

    @staticmethod
    def type() -> str:
        return "orchard"

    @property
    def capabilities(self) -> Any:
        return EnvironmentCapabilities(
            disable_internet=True,
            network_allowlist=True,
            network_allowlist_hostnames=True,
            network_allowlist_ipv4_addresses=True,
            network_allowlist_ipv4_cidrs=True,
            dynamic_network_policy=True,
        )

    @classmethod
    def resource_capabilities(cls) -> Any:
        return EnvironmentResourceCapabilities(
            cpu_limit=True, memory_limit=True, fractional_cpus=True
        )

    def _validate_definition(self) -> None:
        dockerfile = Path(self.environment_dir) / "Dockerfile"
        if not self.task_env_config.docker_image and not dockerfile.is_file():
            raise FileNotFoundError(
                f"{dockerfile} not found and the task names no [environment].docker_image"
            )

    def _require(self) -> Any:
        if self._sandbox is None:
            raise RuntimeError("the Orchard environment is not started: call start() first")
        return self._sandbox

    # ---- lifecycle

    async def start(self, force_build: bool) -> None:
        image = self.task_env_config.docker_image
        has_dockerfile = (Path(self.environment_dir) / "Dockerfile").is_file()
        opts: OrchardOptions = self.options
        self._client = await asyncio.to_thread(AsyncOrchard, opts.url, opts.api_key)
        memory_mb = self._effective_memory_mb
        try:
            if not image or (force_build and has_dockerfile):
                owner = (await self._client.usage()).owner  # the build runs for this key only
                image = await asyncio.to_thread(
                    build_image,
                    Path(self.environment_dir),
                    self.environment_name,
                    force=force_build,
                    owner=owner,
                )
            self._sandbox = await self._client.sandboxes.create(
                image,
                cpu=self._effective_cpus,
                memory=f"{memory_mb}m" if memory_mb else None,
                env=self._startup_env(),
                workdir=self.task_env_config.workdir,
                network=_network(self.network_policy),
                timeout_s=opts.timeout_s,
                labels=labels_for(TOOL, {"harbor-session": label_value(self.session_id)}),
            )
            await self.ensure_dirs(self._mount_targets(writable_only=True))
            await self._upload_environment_dir_after_start()
        except BaseException:
            await self.stop(delete=True)
            raise

    async def stop(self, delete: bool) -> None:
        sandbox, self._sandbox = self._sandbox, None
        client, self._client = self._client, None
        try:
            if sandbox is not None and delete:
                await sandbox.delete()
        finally:
            if client is not None:
                await client.close()

    async def _apply_network_policy(self, network_policy: Any) -> None:
        net = _network(network_policy)
        await self._require().network.update(net["egress"], net["allow"])

    # ---- exec and files

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> Any:
        sb = self._require()
        resolved = self._resolve_user(user)
        opts: dict[str, Any] = {
            "cwd": cwd,
            "env": self._merge_env(env) or {},
            "user": None if resolved is None else str(resolved),
            "timeout_s": timeout_sec,
        }
        try:
            result = await sb.exec([self._shell, "-c", command], **opts)
        except InvalidRequest as exc:
            if exc.code != "exec_failed" or self._shell == "sh":
                raise
            self._shell = "sh"  # an image without bash
            result = await sb.exec(["sh", "-c", command], **opts)
        if result.timed_out:
            raise RuntimeError(f"Command timed out after {timeout_sec} seconds")
        return ExecResult(stdout=result.stdout, stderr=result.stderr, return_code=result.exit_code)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        with open(source_path, "rb") as fh:
            await self._require().files.write(target_path, fh)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        await self._require().files.upload_dir(source_dir, target_dir)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        data = await self._require().files.read(source_path)
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        os.makedirs(target_dir, exist_ok=True)
        await self._require().files.download_dir(source_dir, target_dir)
