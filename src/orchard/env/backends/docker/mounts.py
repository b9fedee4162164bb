"""What the Docker backend mounts into a sandbox, besides the agent and its socket folder.

- `/etc/hosts`, `/etc/hostname`, `/etc/resolv.conf`: the engine's own copies are host
  files the sandbox could grow without bound (they live in the engine's container folder,
  outside any disk limit), so the backend mounts its own, read-only, from the sandbox's
  private folder (the engine then makes none); their text is what the engine would
  write, and `/etc/hosts` follows the sandbox's address when its network changes.
- Volumes land where their target leads in the image (symlinks followed inside it,
  volume_base.resolve_target): read from the image's overlay2 layer folders when this
  process can (the engine on this host, as root), else asked of the engine about a
  container made (never started) from the image (`HEAD /containers/{id}/archive`, the
  engine's own scoped path walk; one request per path component).
- The container's log (the agent's output and its entrypoint's): json-file and local
  logs are capped at LOG_MAX_SIZE x LOG_MAX_FILES; the other drivers keep the operator's
  own settings (their storage is not the engine's folder).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from typing import Any

import aiodocker
from aiodocker.exceptions import DockerError

from orchard.env.backends.docker.images import engine
from orchard.env.backends.volume_base import Entry, LayerView, RootfsView

ETC_FILES = ("hostname", "hosts", "resolv.conf")
# What the engine writes, less the sandbox's own line (added once it has an address).
HOSTS = (
    "127.0.0.1\tlocalhost\n"
    "::1\tlocalhost ip6-localhost ip6-loopback\n"
    "fe00::0\tip6-localnet\n"
    "ff00::0\tip6-mcastprefix\n"
    "ff02::1\tip6-allnodes\n"
    "ff02::2\tip6-allrouters\n"
)
# The engine's resolver on a user-defined network (without one a sandbox has no network).
RESOLV_CONF = "nameserver 127.0.0.11\noptions ndots:0\n"
LOG_MAX_SIZE = "1m"
LOG_MAX_FILES = "2"
_CAPPED_LOG_DRIVERS = ("json-file", "local")
_GO_MODE_DIR = 1 << 31
_GO_MODE_SYMLINK = 1 << 27


def docker_mounts(binds: Iterable[tuple[str, str, bool]]) -> list[dict[str, Any]]:
    """`HostConfig.Mounts` of host folders and files: a missing source is an error."""
    return [
        {"Type": "bind", "Source": src, "Target": dst, "ReadOnly": ro} for src, dst, ro in binds
    ]


def etc_binds(folder: Path) -> list[tuple[str, str, bool]]:
    """Make the sandbox's /etc files (placeholders until `write_etc`); their read-only binds."""
    folder.mkdir(exist_ok=True)
    for name in ETC_FILES:
        (folder / name).touch()
    return [(str(folder / n), f"/etc/{n}", True) for n in ETC_FILES]


def write_etc(folder: Path, hostname: str | None, ip: str | None) -> None:
    """Write the files in place (their inodes are what the sandbox has mounted)."""
    if not folder.is_dir():
        return  # made by a version that left them to the engine
    if hostname is None:
        hostname = (folder / "hostname").read_text().strip()
    (folder / "hostname").write_text(hostname + "\n")
    (folder / "hosts").write_text(HOSTS + (f"{ip}\t{hostname}\n" if ip else ""))
    (folder / "resolv.conf").write_text(RESOLV_CONF)


def log_config(driver: str) -> dict[str, Any] | None:
    """`HostConfig.LogConfig` for the engine's default driver, or None to keep it."""
    if driver not in _CAPPED_LOG_DRIVERS:
        return None
    return {"Type": driver, "Config": {"max-size": LOG_MAX_SIZE, "max-file": LOG_MAX_FILES}}


def _overlay2_layers(image: Mapping[str, Any]) -> list[Path] | None:
    """The image's layer folders (top first), if the driver is overlay2 and we can read them."""
    driver = image.get("GraphDriver") or {}
    data = driver.get("Data") or {}
    if driver.get("Name") != "overlay2" or not data.get("UpperDir"):
        return None
    layers = [Path(data["UpperDir"])]
    layers += [Path(p) for p in str(data.get("LowerDir") or "").split(":") if p]
    if not all(os.access(p, os.R_OK | os.X_OK) and p.is_dir() for p in layers):
        return None
    return layers


class ArchiveView:
    """A container's rootfs as the engine walks it: `HEAD /containers/{id}/archive`
    stats a path with its parents resolved in the container, and a symlink's target
    fully resolved there."""

    def __init__(self, docker: aiodocker.Docker, container_id: str) -> None:
        self.docker = docker
        self.container_id = container_id

    async def entry(self, parent: tuple[str, ...], name: str) -> Entry:
        path = "/" + "/".join((*parent, name))
        route = f"containers/{self.container_id}/archive"
        async with engine("look at a path in the image"):
            # HEAD: its answer has no body, which aiodocker cannot turn into an error.
            url = self.docker._canonicalize_url(route)
            async with self.docker.session.head(url, params={"path": path}) as response:
                status = response.status
                raw = response.headers.get("X-Docker-Container-Path-Stat", "")
            if status == 404:
                return "missing", ""
            if status != 200:  # a GET says why, in its body
                try:
                    async with self.docker._query(route, params={"path": path}):
                        pass
                except DockerError as e:
                    if "too many links" in str(e.message):  # the engine's walk gave up
                        return "loop", ""
                    raise
                raise DockerError(status, f"HEAD {route}?path={path}")
        st = json.loads(base64.b64decode(raw)) if raw else {}
        mode = int(st.get("mode") or 0)
        if mode & _GO_MODE_SYMLINK:
            return "symlink", str(st.get("linkTarget") or "")
        return ("dir" if mode & _GO_MODE_DIR else "other"), ""


@contextlib.asynccontextmanager
async def image_rootfs(
    docker: aiodocker.Docker, image_id: str, labels: Mapping[str, str], *, layers: bool = True
) -> AsyncIterator[RootfsView]:
    """The files of `image_id` as a container made from it starts with (see the module
    docstring); `layers=False` always asks the engine (what other drivers get)."""
    async with engine(f"inspect image {image_id}"):
        found = _overlay2_layers(await docker.images.inspect(image_id)) if layers else None
    if found is not None:
        yield LayerView(found)
        return
    config: dict[str, Any] = {
        "Image": image_id,
        "Entrypoint": ["/.orchard/never-started"],
        "NetworkDisabled": True,
        "Labels": {**labels, "orchard.probe": "1"},
    }
    name = f"orchard-probe-{secrets.token_hex(8)}"
    async with engine("create a probe of the image"):
        probe = await docker.containers.create(config, name=name)
    try:
        yield ArchiveView(docker, probe.id)
    finally:
        with contextlib.suppress(DockerError):
            await probe.delete(force=True)
