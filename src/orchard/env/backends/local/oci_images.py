"""Image cache of the local backend: each image unpacked once, shared read-only by its sandboxes.

Where an image comes from, in order:
- `oci:<layout>[:tag]` or `docker-archive:<file.tar>` (a `docker save` tarball) named as such;
- the local Docker engine's store, when an engine answers and has the image;
- a registry, through skopeo (which honours the usual auth files and registries.conf).

Every image is copied into a throw-away OCI layout by skopeo and unpacked by umoci (layer
order, whiteouts and ownership done by a proven unpacker) into
`<cache>/<key>/rootfs`, with the image config beside it in `image.json`. The key is
content-addressed: the Docker image id for the engine's images, the config digest
otherwise. A name -> key map (`names/`) makes later creates of the same name free, like a
pulled image in Docker's store, and keeps images of the engine's store usable while the
engine does not answer. Concurrent first uses of one image unpack it once (an
asyncio lock per key in this process, a file lock across processes).

With a `policy` (the backend always gives one) names are checked by
`image_policy.ImagePolicy` first, file sources must lie under the folders it allows, and a
name is looked up in the engine's store by its canonical form only (never as an id
prefix). The image's labels (kept in `image.json`) are checked for the caller on every
resolve (`image_policy.Ownership`): the engine's store holds the docker backend's
snapshot images and owners' builds, which no name may reach for another owner. What
skopeo, umoci or the engine answer goes to the log, never to the caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchard.env.backends.failures import hidden
from orchard.env.errors import ImageNotFound, InvalidRequest, RegistryUnavailable, Unavailable
from orchard.env.image_policy import (
    FILE_TRANSPORTS,
    UNOWNED,
    ImagePolicy,
    ImageRef,
    Ownership,
    names_image,
    parse_reference,
)

log = logging.getLogger("orchard.local.images")

NAME_TTL_S = 30.0  # how long name -> image lookups in the Docker store are trusted
ENGINE_TIMEOUT_S = 5.0  # an engine slower than this to inspect an image counts as absent
_MISSING = (
    "manifest unknown",
    "name unknown",
    "not found",
    "no such image",
    "no descriptor found",
    "does not exist",
    "repository name not known",
    "did not resolve to an alias",
    "requested access to the resource is denied",
)
_UNREACHABLE = (
    "dial tcp",
    "connection refused",
    "no such host",
    "i/o timeout",
    "timeout",
    "network is unreachable",
    "tls",
    "server misbehaving",
    "eof",
)


def _copy_error(source: str, name: str, out: str) -> Exception:
    """Classify skopeo's failure; its text (addresses, paths, answers) is only logged."""
    low = out.lower()
    if "invalid reference" in low or "invalid image name" in low:
        return hidden(InvalidRequest, f"invalid image reference {name!r}", out, log)
    if source.startswith("docker://"):
        if any(m in low for m in _UNREACHABLE) and "manifest unknown" not in low:
            return hidden(
                RegistryUnavailable, f"cannot pull image {name!r}: no registry answer", out, log
            )
        if any(m in low for m in _MISSING):
            return hidden(ImageNotFound, f"image {name!r} not found", out, log)
        return hidden(RegistryUnavailable, f"cannot pull image {name!r}", out, log)
    if any(m in low for m in _MISSING) or "no such file" in low:
        return hidden(ImageNotFound, f"image {name!r} not found", out, log)
    return hidden(Unavailable, f"cannot import image {name!r}", out, log)


@dataclass(frozen=True)
class LocalImage:
    """An unpacked image: its rootfs (never written to) and the config a sandbox honours."""

    key: str
    rootfs: Path
    env: tuple[str, ...]
    workdir: str
    user: str
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    ownership: Ownership = UNOWNED


async def _run(*args: str, timeout_s: float) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with asyncio.timeout(timeout_s):
            out, _ = await proc.communicate()
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise
    return proc.returncode or 0, out.decode(errors="replace").strip()


def _layout_config(layout: Path, tag: str) -> tuple[str, dict[str, Any]]:
    """(config digest, image config) of one tag of an OCI layout."""
    index = json.loads((layout / "index.json").read_text())
    manifests = index.get("manifests") or []
    chosen = next(
        (
            m
            for m in manifests
            if (m.get("annotations") or {}).get("org.opencontainers.image.ref.name") == tag
        ),
        manifests[0] if len(manifests) == 1 else None,
    )
    if chosen is None:
        raise ImageNotFound(f"OCI layout {layout} has no tag {tag!r}")

    def blob(digest: str) -> Any:
        algo, _, hexd = digest.partition(":")
        return json.loads((layout / "blobs" / algo / hexd).read_text())

    manifest = blob(chosen["digest"])
    if "manifests" in manifest:  # an image index: take the linux/amd64 (or only) entry
        entries = manifest["manifests"]
        pick = next(
            (
                e
                for e in entries
                if (e.get("platform") or {}).get("architecture") in ("amd64", None)
            ),
            entries[0],
        )
        manifest = blob(pick["digest"])
    digest = str(manifest["config"]["digest"])
    return digest, dict(blob(digest))


class ImageStore:
    """Resolves image names to unpacked, cached root filesystems; see the module docstring."""

    def __init__(
        self,
        cache_dir: Path,
        *,
        docker_url: str | None = None,
        use_docker: bool = True,
        pull_timeout_s: float = 300.0,
        policy: ImagePolicy | None = None,
    ) -> None:
        self.cache_dir = Path(cache_dir)
        self.policy = policy
        (self.cache_dir / "names").mkdir(parents=True, exist_ok=True)
        self.pull_timeout_s = pull_timeout_s
        self._use_docker = use_docker
        self._docker_url = docker_url or os.environ.get("DOCKER_HOST") or None
        self._names: dict[str, tuple[float, LocalImage]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    # ------------------------------------------------------------ public

    async def resolve(self, name: str, *, owner: str | None = None) -> LocalImage:
        """The unpacked image for `name`, unpacking it on first use, if `owner` may run it."""
        image = await self._resolve_cached(name, owner)
        if self.policy is not None:
            image.ownership.check(name, owner)
        return image

    async def _resolve_cached(self, name: str, owner: str | None) -> LocalImage:
        if name.startswith(FILE_TRANSPORTS) and self.policy is not None:
            self.policy.check_file(name)  # names are checked by _resolve (cached once passed)
        hit = self._names.get(name)
        if hit and time.monotonic() - hit[0] < NAME_TTL_S:
            return hit[1]
        async with self._locks.setdefault("name:" + name, asyncio.Lock()):
            hit = self._names.get(name)
            if hit and time.monotonic() - hit[0] < NAME_TTL_S:
                return hit[1]
            image = await self._resolve(name, owner)
            self._names[name] = (time.monotonic(), image)
            return image

    def cached(self, key: str) -> LocalImage | None:
        """The unpacked image with this key, if it is in the cache."""
        try:
            meta = json.loads((self.cache_dir / key / "image.json").read_text())
        except (OSError, ValueError):
            return None
        return LocalImage(
            key=key,
            rootfs=self.cache_dir / key / "rootfs",
            env=tuple(meta.get("Env") or ()),
            workdir=str(meta.get("WorkingDir") or ""),
            user=str(meta.get("User") or ""),
            entrypoint=tuple(meta.get("Entrypoint") or ()),
            cmd=tuple(meta.get("Cmd") or ()),
            ownership=Ownership.of(meta.get("Labels")),
        )

    # ------------------------------------------------------------ sources

    async def _resolve(self, name: str, owner: str | None) -> LocalImage:
        if name.startswith("oci:"):
            path, _, tag = name[4:].partition(":")
            return await self._from_source(f"oci:{path}:{tag or 'latest'}", None, name)
        if name.startswith("docker-archive:"):
            return await self._from_source(name, None, name)
        ref = self.policy.check(name) if self.policy is not None else parse_reference(name)
        remembered: LocalImage | None = None
        with contextlib.suppress(OSError):
            remembered = self.cached(self._name_file(name).read_text().strip())
        try:
            found = await self._docker_image_id(ref) if self._use_docker else None
        except Unavailable:
            if remembered is None:
                raise
            # An engine that does not answer must not stop sandboxes of images we have.
            log.warning(
                "docker engine unavailable; using the cached %s for %s", remembered.key, name
            )
            return remembered
        if found is not None:
            docker_id, ownership = found
            if self.policy is not None:  # before copying it: not this owner's to run
                ownership.check(name, owner)
            key = "docker-" + docker_id.partition(":")[2]
            image = await self._from_source(f"docker-daemon:{docker_id}", key, name)
        elif remembered is not None and not remembered.key.startswith("docker-"):
            return remembered  # pulled from a registry before, as Docker's store keeps it
        else:
            if self.policy is not None:
                await self.policy.check_pull(ref)
            log.info("pulling %s", ref.canonical)
            image = await self._from_source(f"docker://{ref.canonical}", None, name)
        self._remember(name, image.key)
        return image

    def _name_file(self, name: str) -> Path:
        return self.cache_dir / "names" / hashlib.sha256(name.encode()).hexdigest()

    def _remember(self, name: str, key: str) -> None:
        path = self._name_file(name)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(key)
        os.replace(tmp, path)

    async def _docker_image_id(self, ref: ImageRef) -> tuple[str, Ownership] | None:
        """The engine's id for `ref` and what its labels say of its owner, or None when there
        is no engine or no image of that name (one only an id search finds does not count)."""
        import aiodocker
        from aiodocker.exceptions import DockerError

        try:
            async with asyncio.timeout(ENGINE_TIMEOUT_S):
                async with aiodocker.Docker(url=self._docker_url) as docker:
                    data = await docker.images.inspect(ref.canonical)
        except DockerError as e:
            if e.status in (400, 404):
                return None
            raise hidden(
                Unavailable, "the docker engine failed to look up an image", str(e.message), log
            ) from e
        except TimeoutError as e:
            raise Unavailable(f"docker engine did not answer in {ENGINE_TIMEOUT_S:g} s") from e
        except (OSError, ValueError, RuntimeError) as e:
            log.debug("no docker engine for image lookup: %s", e)
            return None
        except Exception as e:  # aiohttp's connector errors: no engine here
            log.debug("no docker engine for image lookup: %s", e)
            return None
        if not names_image(ref, data):
            return None
        return str(data["Id"]), Ownership.of((data.get("Config") or {}).get("Labels"))

    # ------------------------------------------------------------ copy + unpack

    async def _from_source(self, source: str, key: str | None, name: str) -> LocalImage:
        if key is not None and (image := self.cached(key)):
            return image
        lock_key = key or source
        async with self._locks.setdefault(lock_key, asyncio.Lock()):
            if key is not None and (image := self.cached(key)):
                return image
            work = Path(tempfile.mkdtemp(prefix=".unpack-", dir=self.cache_dir))
            try:
                layout = work / "layout"
                await self._copy(source, layout, name)
                digest, config = _layout_config(layout, "img")
                key = key or "oci-" + digest.partition(":")[2]
                if image := self.cached(key):
                    return image
                return await self._unpack(layout, key, config, work)
            finally:
                await asyncio.to_thread(shutil.rmtree, work, True)

    async def _copy(self, source: str, layout: Path, name: str) -> None:
        skopeo = shutil.which("skopeo")
        if skopeo is None:
            raise Unavailable("the local backend needs `skopeo` to import images")
        try:
            rc, out = await _run(
                skopeo,
                "copy",
                "--quiet",
                source,
                f"oci:{layout}:img",
                timeout_s=self.pull_timeout_s,
            )
        except TimeoutError as e:
            raise RegistryUnavailable(
                f"importing image {name!r} took over {self.pull_timeout_s:.0f} s"
            ) from e
        if rc == 0:
            return
        raise _copy_error(source, name, out)

    async def _unpack(
        self, layout: Path, key: str, config: dict[str, Any], work: Path
    ) -> LocalImage:
        umoci = shutil.which("umoci")
        if umoci is None:
            raise Unavailable("the local backend needs `umoci` to unpack images")
        lock_path = self.cache_dir / f".{key}.lock"
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            # Another process may be unpacking the same image: wait for it, then reuse.
            await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
            if image := self.cached(key):
                return image
            staged = work / "image"
            staged.mkdir()
            started = time.monotonic()
            rc, out = await _run(
                umoci,
                "raw",
                "unpack",
                "--image",
                f"{layout}:img",
                str(staged / "rootfs"),
                timeout_s=self.pull_timeout_s,
            )
            if rc != 0:
                raise hidden(Unavailable, f"unpacking image {key} failed", out, log)
            cfg = config.get("config") or {}
            (staged / "image.json").write_text(json.dumps(cfg))
            os.replace(staged, self.cache_dir / key)  # atomic: readers see all or nothing
            log.info("unpacked %s in %.1f s", key, time.monotonic() - started)
        finally:
            os.close(fd)
        image = self.cached(key)
        if image is None:
            raise Unavailable(f"image {key} vanished from the cache after unpacking")
        return image
