"""The project's task image, built offline: the shared Debian Python base, its test
dependencies as wheels, and its source.

The build context (the source tree, and the pinned wheels pip downloaded on the host) goes
in as a deterministic tar on stdin of a `docker run` of the base (no network, no pull, no
Dockerfile): the wheels are installed with the pip wheel among them (`--no-index`), the
source becomes one git commit with the sample suite's fixed identity, and the container is
committed as the image. Tags are content-addressed (base + source + pins + recipe), so a
project is built once and reused; a project without dependencies keeps the tag it had
before wheels were supported.
"""

from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from orchard.env import images as env_images
from orchard.swe import layers
from orchard.swe.synth import deps
from orchard.swe.tasks import DEFAULT_WORKDIR, Task

SYNTH_REPO = "orchard/swe-synth"
_RECIPE = "synth-1"
_CTX = "/tmp/orchard-build"
_PIP = (
    'python3 "$(echo wheels/pip-*.whl)/pip" install -q --no-index --no-deps --break-system-packages'
    " --root-user-action=ignore --disable-pip-version-check wheels/*.whl >&2"
)


def image_tag(root: Path, slug: str, base: str, pins: Sequence[str] = ()) -> tuple[str, bytes]:
    """The content-addressed tag for `root` (with the wheels `pins` names) on `base`, and
    the tar of the tree that goes in it."""
    tar = layers.tree_tar(root)
    parts = [_RECIPE.encode(), base.encode(), tar]
    if pins:
        parts.append("\n".join(sorted(pins)).encode())
    digest = hashlib.sha256(b"\0".join(parts)).hexdigest()
    return f"{SYNTH_REPO}:{slug}-{digest[:12]}", tar


def _context(tree: bytes, wheels: Path) -> bytes:
    """One tar: the tree under `tree/`, the wheels under `wheels/` (sorted, fixed mtime)."""
    buf = io.BytesIO()
    with (
        tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as out,
        tarfile.open(fileobj=io.BytesIO(tree)) as src,
    ):
        for info in src.getmembers():
            data = src.extractfile(info)
            info.name = f"tree/{info.name}"
            out.addfile(info, data)
        for whl in sorted(wheels.glob("*.whl")):
            info = tarfile.TarInfo(f"wheels/{whl.name}")
            body = whl.read_bytes()
            info.size, info.mtime, info.mode = len(body), 0, 0o644
            out.addfile(info, io.BytesIO(body))
    return buf.getvalue()


def project_image(
    root: Path,
    slug: str,
    *,
    workdir: str = DEFAULT_WORKDIR,
    pins: Sequence[str] = (),
    cache: Path | None = None,
) -> tuple[str, bool]:
    """Build (or reuse) the image of an unpacked project with the wheels `pins` names
    installed; returns (tag, built now)."""
    base = layers.base_image()
    tag, tar = image_tag(root, slug, base, pins)

    def build() -> None:
        if not pins:
            layers.commit_layer(base, tag, layers.tree_script(workdir), tar, workdir=workdir)
            return
        wheels = deps.fetch(pins, deps.image_python(base), cache)
        script = (
            f"set -e; mkdir -p {_CTX} && cd {_CTX} && tar -x && {_PIP}"
            f" && mkdir -p {workdir} && cp -a tree/. {workdir}/ && cd {workdir}"
            f" && rm -rf {_CTX} && {layers.COMMIT_SCRIPT}"
        )
        layers.commit_layer(base, tag, script, _context(tar, wheels), workdir=workdir)

    return tag, layers.build_once(tag, build)


def remove_image(tag: str) -> None:
    """Drop a synthesized project's image (tests clean up what they made)."""
    subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, check=False)


def provenance(task: Task) -> dict[str, Any]:
    """The `synth` column of a synthesized row ({} for any other row)."""
    extra = (task.model_extra or {}).get("synth")
    return extra if isinstance(extra, dict) else {}


def ensure_images(tasks: Iterable[Task], cache: Path | None = None) -> dict[str, str]:
    """Build the images of synthesized rows on a fresh machine (their sdists from PyPI or the
    cache, their pinned wheels likewise); each row's recorded `image` is tagged onto the
    build. Returns image -> build. A row that is not synthesized is an ImageBuildError."""
    from orchard.swe.synth import source

    built: dict[str, str] = {}
    for t in tasks:
        if t.image in built:
            continue
        extra = provenance(t)
        spec = str(extra.get("source", "")).removeprefix("pypi:")
        if not spec:
            raise env_images.ImageBuildError(
                f"{t.instance_id}: not a synthesized row (no synth.source): its image "
                f"{t.image} cannot be built here"
            )
        pins = [str(p) for p in extra.get("test_deps") or []]
        project = source.fetch(spec, cache)
        tag, _ = project_image(
            project.root, project.slug, workdir=t.workdir, pins=pins, cache=cache
        )
        if tag != t.image:
            layers.docker("tag", tag, t.image)
        built[t.image] = tag
    return built
