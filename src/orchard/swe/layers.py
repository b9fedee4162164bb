"""The layer recipe every SWE task image shares: one Debian Python base, a tree on stdin.

A layer is a `docker run` of the base with a tar on stdin and no network, then `docker
commit` (no pull, no Dockerfile). The tree becomes one git commit made with a fixed
identity and date, so its hash depends only on the tree. Used by the sample images
(`swe.images`) and the synthesized ones (`swe.synth.image`): `tree_tar`, `COMMIT_SCRIPT` /
`tree_script`, `commit_layer`, and `build_once` (at most one build of a tag across
processes).
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import uuid
from collections.abc import Callable
from pathlib import Path

from orchard.env import images as env_images

BASE_PACKAGES: tuple[str, ...] = ("python3", "python3-pytest", "git", "patch")
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
COMMIT_SCRIPT = (
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


def docker(*args: str, input_bytes: bytes | None = None) -> str:
    """`docker ARGS` on the local engine; its stdout, or ImageBuildError with its stderr."""
    proc = subprocess.run(["docker", *args], input=input_bytes, capture_output=True, check=False)
    if proc.returncode != 0:
        raise env_images.ImageBuildError(
            f"docker {args[0]} failed: {proc.stderr.decode(errors='replace').strip()}"
        )
    return proc.stdout.decode().strip()


def build_once(tag: str, build: Callable[[], None]) -> bool:
    """Run `build` unless `tag` exists, once across processes; True when it built now."""
    if env_images.image_exists(tag):
        return False
    with env_images._build_lock(tag):
        if env_images.image_exists(tag):
            return False
        build()
    return True


def commit_layer(base: str, tag: str, script: str, stdin: bytes, *, workdir: str) -> str:
    """Run `script` (bash) in a container of `base` with `stdin` and no network, then commit
    the container as `tag` (WORKDIR `workdir`, CMD bash); the script's stdout. The script
    sees GIT_ENV, so `COMMIT_SCRIPT` in it makes the same commit everywhere."""
    name = f"orchard-swe-build-{uuid.uuid4().hex[:8]}"
    env_args = [a for k, v in GIT_ENV.items() for a in ("-e", f"{k}={v}")]
    try:
        out = docker(
            "run", "-i", "--name", name, "--network", "none", *env_args, base, "bash", "-c",
            script, input_bytes=stdin,
        )  # fmt: skip
        docker("commit", "--change", f"WORKDIR {workdir}", "--change", 'CMD ["bash"]', name, tag)
        return out
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)


def tree_script(workdir: str) -> str:
    """The layer script for a tree on stdin: unpack it in `workdir`, commit it; prints HEAD."""
    return f"mkdir -p {workdir} && cd {workdir} && tar -x && {COMMIT_SCRIPT}"
