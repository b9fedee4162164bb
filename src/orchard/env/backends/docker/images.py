"""The Docker backend's images, and how engine failures become typed errors.

`DockerImages.get(name, owner=...)` checks the name against the image policy
(image_policy.py) on every call, then inspects it once per name and TTL even under a
burst of creates, asking the engine by the canonical name only (no id-prefix search) and
keeping the image only if it carries that name; a missing image is pulled after the
policy's check of its registry's addresses. What the image's labels say of its owner
(`Ownership`: a snapshot's image, another owner's build) is checked on every call, so a
snapshot runs only from its record (an `ImageInfo` made from it, no name). `engine(what)`
turns any engine failure into the typed error the caller gets: the engine's, runtime's or
registry's own text only goes to the log (failures.py), unless it is a harmless answer to
a bad request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiodocker
import aiohttp
from aiodocker.exceptions import DockerError

from orchard.env.backends.failures import hidden, public_text
from orchard.env.errors import (
    Conflict,
    ImageNotFound,
    InvalidRequest,
    NotFound,
    OrchardError,
    RegistryUnavailable,
    Unavailable,
)
from orchard.env.image_policy import UNOWNED, ImagePolicy, ImageRef, Ownership, names_image

log = logging.getLogger("orchard.docker")

# How long an image name -> (id, config) lookup is trusted; creates of one image in a burst
# then cost one inspect, and a re-tagged image is picked up soon after.
IMAGE_CACHE_TTL_S = 30.0
_NO_ANSWER = "the docker engine did not answer"
# Markers in a failed pull's text (logged, never shown) that choose the error's code.
_UNREACHABLE = (
    "dial tcp",
    "no such host",
    "connection refused",
    "i/o timeout",
    "timeout",
    "tls",
    "network is unreachable",
    "server misbehaving",
    "eof",
)
_MISSING = (
    "manifest unknown",
    "not found",
    "repository does not exist",
    "pull access denied",
    "name unknown",
    "no such image",
)


@dataclass(frozen=True)
class ImageInfo:
    id: str
    entrypoint: list[str]
    cmd: list[str]
    user: str
    ownership: Ownership = UNOWNED


def engine_error(what: str, e: DockerError) -> OrchardError:
    """The typed error of an engine answer; its text is shown only for a harmless 4xx."""
    raw = str(e.message)
    text = public_text(raw) if e.status < 500 else None
    by_status: dict[int, type[OrchardError]] = {400: InvalidRequest, 404: NotFound, 409: Conflict}
    cls = by_status.get(e.status, Unavailable)
    if text is not None and cls is not Unavailable:
        return cls(f"{what}: {text}")
    failed = "failed" if cls is Unavailable else "refused it"
    return hidden(cls, f"{what}: the docker engine {failed}", f"{e.status}: {raw}", log)


@contextlib.asynccontextmanager
async def engine(what: str) -> AsyncIterator[None]:
    """Turn engine failures into typed errors; callers handle the statuses they expect."""
    try:
        yield
    except OrchardError:
        raise
    except DockerError as e:
        raise engine_error(what, e) from e
    except (aiohttp.ClientError, OSError, TimeoutError) as e:
        raise hidden(Unavailable, f"{what}: {_NO_ANSWER}", str(e), log) from e


class DockerImages:
    """Image lookups and pulls of one Docker backend, under its image policy."""

    def __init__(
        self,
        docker: Callable[[], aiodocker.Docker],
        policy: ImagePolicy,
        pull_timeout_s: float,
    ) -> None:
        self._docker = docker  # the backend's client, made lazily (it needs a running loop)
        self.policy = policy
        self.pull_timeout_s = pull_timeout_s
        self._cache: dict[str, tuple[float, ImageInfo]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def forget(self, name: str) -> None:
        """Drop a cached lookup (the image went away since it was inspected)."""
        self._cache.pop(name, None)

    async def get(self, name: str, *, owner: str | None = None) -> ImageInfo:
        """The image `name` (pulled if missing), once the policy allows it to `owner`."""
        info = await self._get(name)
        info.ownership.check(name, owner)
        return info

    async def _get(self, name: str) -> ImageInfo:
        ref = self.policy.check(name)
        hit = self._cache.get(name)
        if hit and time.monotonic() - hit[0] < IMAGE_CACHE_TTL_S:
            return hit[1]
        async with self._locks.setdefault(name, asyncio.Lock()):
            hit = self._cache.get(name)
            if hit and time.monotonic() - hit[0] < IMAGE_CACHE_TTL_S:
                return hit[1]
            data = await self._inspect(ref)
            if data is None:
                await self.policy.check_pull(ref)
                await self._pull(name, ref.canonical)
                data = await self._inspect(ref)
                if data is None:
                    raise ImageNotFound(f"image {name!r} not found")
            cfg = data.get("Config") or {}
            info = ImageInfo(
                id=str(data["Id"]),
                entrypoint=list(cfg.get("Entrypoint") or []),
                cmd=list(cfg.get("Cmd") or []),
                user=str(cfg.get("User") or ""),
                ownership=Ownership.of(cfg.get("Labels")),
            )
            self._cache[name] = (time.monotonic(), info)
            return info

    async def _inspect(self, ref: ImageRef) -> dict[str, Any] | None:
        """The engine's image named `ref`, or None (not there, or only an id matches)."""
        try:
            async with engine(f"inspect image {ref.canonical!r}"):
                data: dict[str, Any] = await self._docker().images.inspect(ref.canonical)
        except NotFound:
            return None
        return data if names_image(ref, data) else None

    async def _pull(self, name: str, canonical: str) -> None:
        """Pull; the registry's answer is classified, logged, and never shown to the caller."""
        log.info("pulling %s", canonical)
        try:
            async with asyncio.timeout(self.pull_timeout_s):
                await self._docker().images.pull(canonical)
        except TimeoutError as e:
            raise RegistryUnavailable(
                f"pulling image {name!r} took over {self.pull_timeout_s:.0f} s"
            ) from e
        except DockerError as e:
            raw = str(e.message)
            low = raw.lower()
            if e.status == 400 or "invalid reference" in low:
                raise hidden(InvalidRequest, f"invalid image reference {name!r}", raw, log) from e
            if any(m in low for m in _UNREACHABLE):
                raise hidden(
                    RegistryUnavailable, f"cannot pull image {name!r}: no registry answer", raw, log
                ) from e
            if e.status == 404 or any(m in low for m in _MISSING):
                raise hidden(ImageNotFound, f"image {name!r} not found", raw, log) from e
            raise hidden(RegistryUnavailable, f"cannot pull image {name!r}", raw, log) from e
        except (aiohttp.ClientError, OSError) as e:
            raise hidden(Unavailable, f"pulling image {name!r}: {_NO_ANSWER}", str(e), log) from e
