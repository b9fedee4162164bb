"""The project's task image, built offline: the shared Debian Python base plus its source.

The source goes in as a deterministic tar on stdin of a `docker run` of the base (no
network, no pull, no Dockerfile), is committed as one git commit with the sample suite's
fixed identity, and the container is committed as the image. Tags are content-addressed
(base + source + recipe), so a project is built once and reused.
"""

from __future__ import annotations

import hashlib
import subprocess
import uuid
from collections.abc import Iterable
from pathlib import Path

from orchard.env import images as env_images
from orchard.swe import images as swe_images
from orchard.swe.tasks import DEFAULT_WORKDIR, Task

SYNTH_REPO = "orchard/swe-synth"
_RECIPE = "synth-1"


def image_tag(root: Path, slug: str, base: str) -> tuple[str, bytes]:
    """The content-addressed tag for `root` on `base`, and the tar that goes in it."""
    tar = swe_images.tree_tar(root)
    digest = hashlib.sha256(b"\0".join([_RECIPE.encode(), base.encode(), tar])).hexdigest()
    return f"{SYNTH_REPO}:{slug}-{digest[:12]}", tar


def project_image(root: Path, slug: str, *, workdir: str = DEFAULT_WORKDIR) -> tuple[str, bool]:
    """Build (or reuse) the image of an unpacked project; returns (tag, built now)."""
    base = swe_images.base_image()
    tag, tar = image_tag(root, slug, base)
    if env_images.image_exists(tag):
        return tag, False
    with env_images._build_lock(tag):
        if env_images.image_exists(tag):
            return tag, False
        _build(base, tar, tag, workdir)
    return tag, True


def _build(base: str, tar: bytes, tag: str, workdir: str) -> None:
    name = f"orchard-synth-build-{uuid.uuid4().hex[:8]}"
    script = f"mkdir -p {workdir} && cd {workdir} && tar -x && {swe_images._COMMIT_SCRIPT}"
    env_args = [a for k, v in swe_images.GIT_ENV.items() for a in ("-e", f"{k}={v}")]
    try:
        swe_images._docker(
            "run", "-i", "--name", name, "--network", "none", *env_args, base, "bash", "-c",
            script, input_bytes=tar,
        )  # fmt: skip
        swe_images._docker(
            "commit", "--change", f"WORKDIR {workdir}", "--change", 'CMD ["bash"]', name, tag
        )
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)


def remove_image(tag: str) -> None:
    """Drop a synthesized project's image (tests clean up what they made)."""
    subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, check=False)


def ensure_images(tasks: Iterable[Task], cache: Path | None = None) -> dict[str, str]:
    """Build the images of synthesized rows on a fresh machine (their sdists from PyPI or the
    cache); each row's recorded `image` is tagged onto the build. Returns image -> build."""
    from orchard.swe.synth import source

    built: dict[str, str] = {}
    for t in tasks:
        extra = (t.model_extra or {}).get("synth") or {}
        spec = str(extra.get("source", "")).removeprefix("pypi:")
        if not spec or t.image in built:
            continue
        project = source.fetch(spec, cache)
        tag, _ = project_image(project.root, project.slug, workdir=t.workdir)
        if tag != t.image:
            swe_images._docker("tag", tag, t.image)
        built[t.image] = tag
    return built
