"""Which images a tenant may run: named images only, from registries the operator allows.

Both backends check every reference here before the engine (or skopeo) is asked anything:

- **Registries.** A reference names a registry (`docker.io` when it names none). Registries
  the operator lists are trusted as they are; with `*` in the list (the default is
  `docker.io,*`) any other registry is allowed too, but only when it is public: an IP
  literal, `localhost` or a name that resolves (when a pull is needed) to a loopback,
  private, link-local, shared or metadata address is refused. Otherwise
  `image: "127.0.0.1:18903/x"` made the engine connect to a port on the host and echo its
  answer (a port scanner).
- **Names, never ids.** `0`, hex prefixes and `sha256:<id>` started whatever image the
  engine's id search matched, untagged ones included. An id (`sha256:…`, 64 hex) and a
  bare hex word that could be an id prefix (`0`, `3f2a`: no tag, no namespace) are
  refused (write `0:latest` for an image of that name); every other reference is looked
  up by its canonical name (`docker.io/library/busybox:latest`, for which the engine does
  no id search) and the image found must carry that name (`names_image`): a dangling
  image has none, so it never runs. A digest is welcome as part of a name: `repo@sha256:…`.
- **Host files.** The runc backend also reads `oci:<dir>[:tag]` and `docker-archive:<tar>`;
  those paths must lie under a folder the operator lists (none by default). Every other
  transport of containers/image (`docker-daemon:`, `containers-storage:`, `dir:`,
  `docker://`, ...) is refused: it is no name, and would reach a local store past the
  checks below.
- **Orchard's own images.** What Orchard keeps for one owner is reached only through that
  owner's routes, never by a name in `image`. The repository `orchard-snapshot` (a docker
  snapshot's commit) is reserved: refused before the engine is asked, with any tag or
  digest. Whatever name or digest an image is found by, its labels are checked too
  (`Ownership`): a snapshot's image (`orchard.snapshot`) never runs by name (create with
  `snapshot`, or fork), and a build labelled `orchard.owner` (Harbor's builder labels
  builds so) runs by name for that owner only.

Refusals are `ImageRefused` (422, `image_refused`); a malformed reference is
`InvalidRequest`. The pull-time name check is best effort against DNS rebinding (the
engine resolves again): list the registries you use to rely on names alone.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import re
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from orchard.env.errors import ImageRefused, InvalidRequest

DEFAULT_REGISTRY = "docker.io"
DEFAULT_REGISTRIES: tuple[str, ...] = (DEFAULT_REGISTRY, "*")
FILE_TRANSPORTS = ("oci:", "docker-archive:")
# containers/image's other transports (`docker:` alone is Docker's own image, `docker:24`).
LOCAL_TRANSPORTS = (
    "docker-daemon:",
    "containers-storage:",
    "dir:",
    "oci-archive:",
    "docker://",
    "ostree:",
    "sif:",
    "tarball:",
    "atomic:",
)
# The repository of the docker backend's snapshot commits; reserved (see the docstring).
SNAPSHOT_REPOSITORY = "orchard-snapshot"
RESERVED_REPOSITORIES = (SNAPSHOT_REPOSITORY,)
SNAPSHOT_LABEL = "orchard.snapshot"
OWNER_LABEL = "orchard.owner"
# Global unicast IPv6; anything else (IPv4-compatible and -translated forms, NAT64,
# site-local, multicast) is no public registry's address.
_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")
_LEGACY_REGISTRIES = {"index.docker.io", "registry-1.docker.io"}
_MAX_NAME = 255
_ALNUM = r"[a-z0-9]+"
_PATH_COMPONENT = rf"{_ALNUM}(?:(?:[._]|__|-+){_ALNUM})*"
_PATH_RE = re.compile(rf"{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*")
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN_RE = re.compile(
    rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9a-fA-F:.]+\])(?::[0-9]+)?"
)
_TAG_RE = re.compile(r"[\w][\w.-]{0,127}")
_DIGEST_RE = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}")
_ID_RE = re.compile(r"(?:sha256:)?[0-9a-f]{64}")
_HEX_RE = re.compile(r"[0-9a-f]+")
RESOLVE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class ImageRef:
    """A named image reference, normalised as the engine normalises it."""

    registry: str  # host[:port], lower-case
    path: str  # library/busybox for docker.io's official images
    tag: str | None
    digest: str | None

    @property
    def host(self) -> str:
        """The registry's host without its port (IPv6 literals without brackets)."""
        host = self.registry
        if host.startswith("["):
            return host[1 : host.index("]")]
        return host.rsplit(":", 1)[0] if ":" in host else host

    @property
    def canonical(self) -> str:
        """`registry/path[:tag][@digest]`, with `:latest` when neither is given."""
        out = f"{self.registry}/{self.path}"
        if self.tag:
            out += f":{self.tag}"
        if self.digest:
            out += f"@{self.digest}"
        return out if self.tag or self.digest else out + ":latest"


def parse_reference(image: str) -> ImageRef:
    """Parse like the engine (`docker/distribution` reference grammar); ids are refused."""
    text = image.strip()
    if _ID_RE.fullmatch(text):
        raise ImageRefused(
            f"image {image[:80]!r} is an image id: name an image (repo:tag or repo@sha256:…)"
        )
    name, _, digest = text.partition("@")
    if digest and not _DIGEST_RE.fullmatch(digest):
        raise InvalidRequest(f"invalid image reference {image[:80]!r}: bad digest")
    tag: str | None = None
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        name, tag = name[:colon], name[colon + 1 :]
        if not _TAG_RE.fullmatch(tag):
            raise InvalidRequest(f"invalid image reference {image[:80]!r}: bad tag")
    if len(name) > _MAX_NAME:
        raise InvalidRequest(f"invalid image reference {image[:80]!r}: name too long")
    if not tag and not digest and _HEX_RE.fullmatch(name):
        raise ImageRefused(
            f"image {image[:80]!r} looks like an image id prefix: name the image "
            f"({name[:40]}:latest, or repo@sha256:…)"
        )
    first, sep, rest = name.partition("/")
    if sep and (any(c in first for c in ".:") or first == "localhost" or first != first.lower()):
        registry, path = first, rest
        if not _DOMAIN_RE.fullmatch(registry):
            raise InvalidRequest(f"invalid image reference {image[:80]!r}: bad registry")
        registry = registry.lower()
    else:
        registry, path = DEFAULT_REGISTRY, name
    if registry in _LEGACY_REGISTRIES:
        registry = DEFAULT_REGISTRY
    if registry == DEFAULT_REGISTRY and "/" not in path:
        path = f"library/{path}"
    if not _PATH_RE.fullmatch(path):
        raise InvalidRequest(
            f"invalid image reference {image[:80]!r}: names are lower-case letters, digits "
            "and separators"
        )
    if _ID_RE.fullmatch(path.removeprefix("library/")) and registry == DEFAULT_REGISTRY:
        raise ImageRefused(f"image {image[:80]!r} is an image id: name an image")
    return ImageRef(registry, path, tag or None, digest or None)


def names_image(ref: ImageRef, inspect: Mapping[str, Any]) -> bool:
    """Whether the engine's image (its inspect data) carries the name `ref` asked for.

    A tag reference must be among its RepoTags, a digest reference among its RepoDigests
    (both compared in canonical form, so Docker's short names and Podman's long ones match).
    """
    if ref.digest:
        wanted = (ref.registry, ref.path, ref.digest)
        found = (_parsed(d) for d in inspect.get("RepoDigests") or ())
        return any(r is not None and (r.registry, r.path, r.digest) == wanted for r in found)
    tags = (_parsed(t) for t in inspect.get("RepoTags") or ())
    return any(r is not None and r.canonical == ref.canonical for r in tags)


def _parsed(name: object) -> ImageRef | None:
    try:
        return parse_reference(str(name))
    except InvalidRequest:  # ImageRefused included: "<none>:<none>" and the like
        return None


def _public(addr: str) -> bool:
    """A global unicast address, and so is any IPv4 address an IPv6 one carries."""
    try:
        ip = ipaddress.ip_address(addr.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return _public(str(ip.ipv4_mapped))
        if ip not in _GLOBAL_UNICAST:
            return False
        embedded = ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if embedded is not None and not _public(str(embedded)):
            return False
    return ip.is_global and not ip.is_multicast


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Ownership:
    """Who an image's labels say may run it by name: nobody (a snapshot's), or one owner."""

    snapshot: str | None = None
    owner: str | None = None

    @classmethod
    def of(cls, labels: Mapping[str, Any] | None) -> Ownership:
        labels = labels or {}
        snapshot, owner = labels.get(SNAPSHOT_LABEL), labels.get(OWNER_LABEL)
        return cls(str(snapshot) if snapshot else None, str(owner) if owner else None)

    def check(self, image: str, owner: str | None) -> None:
        """Raise unless `owner` may run this image by the name `image`. A warm pool's
        sandboxes are made under `<owner>:pool:<name>` (no key's owner has a colon)."""
        holder = owner.partition(":")[0] if owner else None
        if self.snapshot is not None or (self.owner is not None and self.owner != holder):
            raise ImageRefused(
                f"image {image[:80]!r} is one Orchard keeps for its owner: a snapshot's "
                "image runs only from `snapshot` (or a fork), a build only for its owner"
            )


UNOWNED = Ownership()  # an image anyone the policy lets through may run by name


@dataclass(frozen=True)
class ImagePolicy:
    """The operator's image policy (see the module docstring); the default is safe."""

    registries: tuple[str, ...] = DEFAULT_REGISTRIES
    file_dirs: tuple[str, ...] = ()

    @classmethod
    def from_lists(
        cls, registries: Iterable[str] | None = None, file_dirs: Iterable[str] = ()
    ) -> ImagePolicy:
        regs = tuple(r.strip().lower() for r in (registries or ()) if r.strip())
        dirs = tuple(os.path.realpath(d) for d in file_dirs if d.strip())
        return cls(regs or DEFAULT_REGISTRIES, dirs)

    def trusted(self, registry: str) -> bool:
        """Listed by the operator (exactly, or by a `*.domain` pattern without a port)."""
        for entry in self.registries:
            if entry == registry:
                return True
            if entry.startswith("*.") and ":" not in registry and registry.endswith(entry[1:]):
                return True
        return False

    def check(self, image: str) -> ImageRef:
        """The parsed reference if the policy allows it before any pull; else raise."""
        if image.startswith(FILE_TRANSPORTS):
            raise ImageRefused(f"image {image[:80]!r}: local image files are not allowed here")
        if image.strip().lower().startswith(LOCAL_TRANSPORTS):
            raise ImageRefused(
                f"image {image[:80]!r}: transports are not allowed, name the image "
                "(repo:tag or repo@sha256:…)"
            )
        ref = parse_reference(image)
        if ref.path.removeprefix("library/").split("/", 1)[0] in RESERVED_REPOSITORIES:
            raise ImageRefused(
                f"image {image[:80]!r} is in a repository Orchard keeps for its own images: "
                "create from a snapshot with `snapshot`"
            )
        if self.trusted(ref.registry):
            return ref
        if "*" not in self.registries:
            raise ImageRefused(
                f"image {image[:80]!r}: registry {ref.registry!r} is not allowed "
                f"(allowed: {', '.join(self.registries)})"
            )
        host = ref.host.lower()
        local = host == "localhost" or host.endswith(".localhost")
        if local or (_is_ip(host) and not _public(host)):
            raise ImageRefused(self._private(image, ref))
        return ref

    async def check_pull(self, ref: ImageRef, *, timeout_s: float = RESOLVE_TIMEOUT_S) -> None:
        """Before a pull from a registry not listed: every address of its name is public."""
        if self.trusted(ref.registry) or _is_ip(ref.host):
            return  # trusted, or a literal `check` already judged
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout_s):
                infos = await loop.getaddrinfo(ref.host, None, type=socket.SOCK_STREAM)
        except (OSError, TimeoutError):
            return  # unresolvable here: the engine will fail to reach it too
        if any(not _public(str(info[4][0])) for info in infos):
            raise ImageRefused(self._private(ref.canonical, ref))

    def check_file(self, image: str) -> str:
        """The path of an `oci:`/`docker-archive:` image if it lies under a listed folder."""
        transport, _, rest = image.partition(":")
        path = rest.partition(":")[0] if transport == "oci" else rest
        real = os.path.realpath(path) if path else ""
        if not any(real == d or real.startswith(d.rstrip("/") + "/") for d in self.file_dirs):
            raise ImageRefused(
                f"image {image[:80]!r}: local image files are only read from the folders "
                "the operator allows (ORCHARD_IMAGE_DIRS)"
            )
        return real

    @staticmethod
    def _private(image: str, ref: ImageRef) -> str:
        return (
            f"image {image[:80]!r}: registry {ref.registry!r} is on this host or a private "
            "network; only public registries (or ones the operator lists) are allowed"
        )
