"""Build the sample suite's images offline: one shared base plus a thin layer per task.

The base is Debian minbase with python3, pytest, git and patch (`orchard.env.images`). Each
task's layer holds its project as a git repository in /testbed with one commit, made with
a fixed identity and date so its hash is stable and equals the task's recorded
`base_commit`. Tags are content-addressed (base tag + source tree + recipe), so an image is
built once and reused; the task's own `image` name is a tag on the same image.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import subprocess
import tarfile
import tempfile
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

from orchard.env import images as env_images
from orchard.swe.tasks import Task, sample_repo_dir

log = logging.getLogger("orchard.swe.images")

BASE_PACKAGES: tuple[str, ...] = ("python3", "python3-pytest", "git", "patch")
SAMPLE_REPO = "orchard/swe-sample"
_RECIPE_VERSION = "1"
_SKIP = {"__pycache__", ".pytest_cache", ".git", ".mypy_cache", ".ruff_cache"}
# A fixed identity and date make the commit hash a pure function of the tree.
GIT_ENV = {
    "GIT_AUTHOR_NAME": "Orchard Samples",
    "GIT_AUTHOR_EMAIL": "samples@orchard.invalid",
    "GIT_AUTHOR_DATE": "2024-01-01T00:00:00+00:00",
    "GIT_COMMITTER_NAME": "Orchard Samples",
    "GIT_COMMITTER_EMAIL": "samples@orchard.invalid",
    "GIT_COMMITTER_DATE": "2024-01-01T00:00:00+00:00",
}
_COMMIT_SCRIPT = (
    "git init -q -b main . && git config core.autocrlf false && git add -A"
    " && git commit -q -m 'Initial import' && git rev-parse HEAD"
)


def base_image() -> str:
    """Tag of the shared base (built with mmdebstrap on first use, then cached)."""
    return env_images.debian_python_image(BASE_PACKAGES)


def tree_tar(src: Path) -> bytes:
    """A deterministic tar of `src` (sorted, fixed owner/mtime/modes): the layer's content."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for root, dirs, files in os.walk(src):
            dirs[:] = sorted(d for d in dirs if d not in _SKIP)
            for name in sorted(files):
                if name.endswith(".pyc"):
                    continue
                path = Path(root) / name
                info = tarfile.TarInfo(str(path.relative_to(src)))
                data = path.read_bytes()
                info.size, info.mtime = len(data), 0
                info.mode = 0o755 if os.access(path, os.X_OK) else 0o644
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def commit_hash(src: Path) -> str:
    """The base_commit a tree gets in its image (computed here with the host's git)."""
    with tempfile.TemporaryDirectory(prefix="orchard-swe-") as tmp:
        with tarfile.open(fileobj=io.BytesIO(tree_tar(src))) as tar:
            tar.extractall(tmp, filter="data")
        out = subprocess.run(
            ["bash", "-c", _COMMIT_SCRIPT],
            cwd=tmp,
            env={**os.environ, **GIT_ENV},
            capture_output=True,
            text=True,
            check=True,
        )
    return out.stdout.strip()


def _docker(*args: str, input_bytes: bytes | None = None) -> str:
    proc = subprocess.run(["docker", *args], input=input_bytes, capture_output=True, check=False)
    if proc.returncode != 0:
        raise env_images.ImageBuildError(
            f"docker {args[0]} failed: {proc.stderr.decode(errors='replace').strip()}"
        )
    return proc.stdout.decode().strip()


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
    if not env_images.image_exists(tag):
        with env_images._build_lock(tag):
            if not env_images.image_exists(tag):
                _build(task, base, tar, tag)
    if task.image and task.image != tag:
        _docker("tag", tag, task.image)
    return tag


def _build(task: Task, base: str, tar: bytes, tag: str) -> None:
    name = f"orchard-swe-build-{uuid.uuid4().hex[:8]}"
    script = f"mkdir -p {task.workdir} && cd {task.workdir} && tar -x && {_COMMIT_SCRIPT}"
    env_args = [a for k, v in GIT_ENV.items() for a in ("-e", f"{k}={v}")]
    try:
        head = _docker(
            "run",
            "-i",
            "--name",
            name,
            "--network",
            "none",
            *env_args,
            base,
            "bash",
            "-c",
            script,
            input_bytes=tar,
        )
        if task.base_commit and head != task.base_commit:
            raise env_images.ImageBuildError(
                f"{task.instance_id}: the image's commit {head} is not the recorded "
                f"base_commit {task.base_commit} (was the source tree edited?)"
            )
        _docker(
            "commit",
            "--change",
            f"WORKDIR {task.workdir}",
            "--change",
            'CMD ["bash"]',
            name,
            tag,
        )
        log.info("built %s for %s", tag, task.instance_id)
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)


def build_images(
    tasks: Iterable[Task], *, on_built: Callable[[str, str], None] | None = None
) -> dict[str, str]:
    """Build every task's image (base first); returns instance_id -> tag."""
    base = base_image()
    tags: dict[str, str] = {}
    for t in tasks:
        tags[t.instance_id] = task_image(t, base)
        if on_built is not None:
            on_built(t.instance_id, tags[t.instance_id])
    return tags
