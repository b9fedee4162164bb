"""Build task images offline: the sample suite's, and (through `swe.synth.image`) the
synthesized rows', each a thin layer on one shared base (`swe.layers`).

The base is Debian minbase with python3, pytest, git and patch (`orchard.env.images`). A
sample task's layer holds its project as a git repository in /testbed with one commit, made
with a fixed identity and date so its hash is stable and equals the task's recorded
`base_commit`. Tags are content-addressed (base tag + source tree + recipe), so an image is
built once and reused; the task's own `image` name is a tag on the same image.
`build_images` builds sample and synthesized rows alike; `missing` says which still need it.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from orchard.env import images as env_images
from orchard.swe.layers import (
    COMMIT_SCRIPT,
    GIT_ENV,
    base_image,
    build_once,
    commit_layer,
    docker,
    tree_script,
    tree_tar,
)
from orchard.swe.synth.image import ensure_images
from orchard.swe.tasks import Task, sample_repo_dir

log = logging.getLogger("orchard.swe.images")

SAMPLE_REPO = "orchard/swe-sample"
_RECIPE_VERSION = "1"


def commit_hash(src: Path) -> str:
    """The base_commit a tree gets in its image (computed here with the host's git)."""
    with tempfile.TemporaryDirectory(prefix="orchard-swe-") as tmp:
        with tarfile.open(fileobj=io.BytesIO(tree_tar(src))) as tar:
            tar.extractall(tmp, filter="data")
        out = subprocess.run(
            ["bash", "-c", COMMIT_SCRIPT],
            cwd=tmp,
            env={**os.environ, **GIT_ENV},
            capture_output=True,
            text=True,
            check=True,
        )
    return out.stdout.strip()


def is_sample(task: Task) -> bool:
    """A task of the sample suite (its source tree ships under sample/repos/)."""
    return bool(task.repo) and sample_repo_dir(task).is_dir()


def task_image(task: Task, base: str | None = None) -> str:
    """Build (or reuse) one sample task's image; returns its content-addressed tag.

    The task's own `image` name is pointed at the same image, so rows can name it.
    """
    src = sample_repo_dir(task)
    if not src.is_dir():
        raise env_images.ImageBuildError(f"{task.instance_id}: no source tree at {src}")
    base = base or base_image()
    tar = tree_tar(src)
    digest = hashlib.sha256(
        b"\0".join([_RECIPE_VERSION.encode(), base.encode(), task.workdir.encode(), tar])
    ).hexdigest()[:16]
    tag = f"{SAMPLE_REPO}:{src.name.rsplit('__', 1)[-1]}-{digest}"
    build_once(tag, lambda: _build(task, base, tar, tag))
    if task.image and task.image != tag:
        docker("tag", tag, task.image)
    return tag


def _build(task: Task, base: str, tar: bytes, tag: str) -> None:
    head = commit_layer(base, tag, tree_script(task.workdir), tar, workdir=task.workdir)
    if task.base_commit and head != task.base_commit:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, check=False)
        raise env_images.ImageBuildError(
            f"{task.instance_id}: the image's commit {head} is not the recorded "
            f"base_commit {task.base_commit} (was the source tree edited?)"
        )
    log.info("built %s for %s", tag, task.instance_id)


def buildable(task: Task) -> bool:
    """Whether `build_images` can make this row's image: a sample task, or a synthesized
    one (`orchard swe synth`, the shipped `real` set: built from its sdist)."""
    return is_sample(task) or bool((task.model_extra or {}).get("synth"))


def build_images(
    tasks: Iterable[Task],
    *,
    on_built: Callable[[str, str], None] | None = None,
    cache: Path | None = None,
) -> dict[str, str]:
    """Build every task's image (base first), offline but for PyPI: sample tasks from
    their trees, synthesized rows from their sdists and pinned wheels (`cache`: where those
    are kept). Returns instance_id -> tag; a row of neither kind is an ImageBuildError."""
    chosen = list(tasks)
    base = base_image()
    synthesized = ensure_images([t for t in chosen if not is_sample(t)], cache)
    tags: dict[str, str] = {}
    for t in chosen:
        tags[t.instance_id] = task_image(t, base) if is_sample(t) else synthesized[t.image]
        if on_built is not None:
            on_built(t.instance_id, tags[t.instance_id])
    return tags


def missing(tasks: Iterable[Task]) -> list[Task]:
    """The rows `build_images` can build whose image is not on the local engine yet."""
    seen: dict[str, bool] = {}
    out: list[Task] = []
    for t in tasks:
        if t.image not in seen:
            seen[t.image] = buildable(t) and not env_images.image_exists(t.image)
        if seen[t.image]:
            out.append(t)
    return out
