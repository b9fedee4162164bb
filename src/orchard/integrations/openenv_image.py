"""Build an OpenEnv environment server image offline (`python -m ...openenv_image DIR`).

OpenEnv images are usually built by `openenv build` from a base image pulled from a
registry; here nothing is pulled. The image is Debian minbase with python3
(`orchard.env.images`, made by mmdebstrap from the host's apt sources) plus:

- the packages the server imports, copied from this Python environment: the server is
  imported once on the host (with uvicorn's protocol classes loaded), and every
  distribution that provided a loaded module is copied whole, with its metadata
  (a wheelhouse taken from the venv, so no package index is needed); a module the server
  imports only later, at a request, is named with `include`;
- `DIR` itself (the environment folder, holding `server/app.py`), as the working folder.

The image runs `uvicorn <app> --host 0.0.0.0 --port 8000`, as OpenEnv images do. Tags are
content hashes of the recipe, the base, the folder and every installed distribution's
version, so an image is built once and reused by every later call. With `owner` (the
owner of the API key that will run it; `--owner`) the image is labelled `orchard.owner`
and a service runs it for that owner only (image_policy.Ownership); without, any key may.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from orchard.env.image_policy import OWNER_LABEL
from orchard.env.images import ImageBuildError, debian_python_image, image_exists

__all__ = ["DEFAULT_APP", "DEFAULT_EXCLUDE", "SERVER_PORT", "server_image"]

log = logging.getLogger("orchard.integrations.openenv_image")

_RECIPE_VERSION = "1"
REPO = "orchard-openenv"
DEFAULT_APP = "server.app:app"
SERVER_PORT = 8000
APP_DIR = "/opt/openenv/env"
SITE_DIR = "/opt/openenv/site"
_SKIP = {"__pycache__", ".git", ".venv", ".pytest_cache", ".mypy_cache", ".ruff_cache"}
# OpenEnv imports its Gradio web UI only if it can (it is off unless ENABLE_WEB_INTERFACE):
# without it the image is ~75 MB of packages instead of ~470.
DEFAULT_EXCLUDE: tuple[str, ...] = ("gradio", "gradio_client")
# Imports the app (`exclude` made unimportable) and uvicorn's chosen protocol classes, then
# prints the files of every distribution that provided a loaded module (in a child process,
# so this one stays clean).
_CLOSURE = r"""
import importlib.abc, importlib.metadata as md, json, sys
skip, extra = (set(json.loads(a)) for a in sys.argv[2:4])
class Skip(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.partition(".")[0] in skip:
            raise ModuleNotFoundError(f"{name} is left out of the image", name=name)
sys.meta_path.insert(0, Skip())
import uvicorn
config = uvicorn.Config(sys.argv[1], host="127.0.0.1", port=0)
config.load()
import uvicorn.lifespan.on, uvicorn.loops.auto  # noqa: E401 (what uvicorn.run loads later)
import importlib
for name in extra:
    importlib.import_module(name)
tops = {name.partition(".")[0] for name in list(sys.modules)}
owners = md.packages_distributions()
dists = sorted({d for t in tops for d in owners.get(t, ())})
files = {}
for name in dists:
    dist = md.distribution(name)
    base = dist.locate_file("")
    files[name] = [str(base), [str(f) for f in dist.files or ()]]
print(json.dumps(files))
"""


def _tree_digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(_files(folder)):
        h.update(str(path.relative_to(folder)).encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def _files(folder: Path) -> list[Path]:
    out = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if d not in _SKIP]
        out += [Path(root) / n for n in names if not n.endswith(".pyc")]
    return out


def _installed() -> str:
    """Every distribution of this environment with its version: a change rebuilds."""
    seen = sorted(f"{d.metadata['Name']}=={d.version}" for d in md.distributions())
    return "\n".join(seen)


def _closure(
    env_dir: Path, app: str, exclude: Sequence[str], include: Sequence[str]
) -> dict[str, tuple[Path, list[str]]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(env_dir), *sys.path])}
    proc = subprocess.run(
        [sys.executable, "-c", _CLOSURE, app, json.dumps(list(exclude)), json.dumps(list(include))],
        cwd=env_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode != 0:
        raise ImageBuildError(f"importing {app} from {env_dir} failed:\n{proc.stderr[-3000:]}")
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    return {name: (Path(base), files) for name, (base, files) in data.items()}


def _copy_site(closure: dict[str, tuple[Path, list[str]]], dest: Path) -> None:
    """Each distribution's files under `dest`, as they sit in site-packages (no scripts)."""
    for base, files in closure.values():
        for rel in files:
            src = (base / rel).resolve()
            if rel.startswith("..") or "__pycache__" in rel or not src.is_file():
                continue  # console scripts live outside site-packages; caches are rebuilt
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)


def _python_minor(image: str) -> str:
    probe = "import sys; print('%d.%d' % sys.version_info[:2])"
    argv = ["docker", "run", "--rm", "--network", "none", image, "python3", "-c", probe]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ImageBuildError(f"cannot run python3 in {image}: {proc.stderr[-1000:]}")
    return proc.stdout.strip()


def _dockerfile(base: str, app: str, key: str, owner: str | None) -> str:
    cmd = ["python3", "-m", "uvicorn", app, "--host", "0.0.0.0", "--port", str(SERVER_PORT)]
    return "\n".join(
        [
            f"FROM {base}",
            f"COPY site {SITE_DIR}",
            f"COPY env {APP_DIR}",
            f"ENV PYTHONPATH={SITE_DIR}:{APP_DIR} PYTHONDONTWRITEBYTECODE=1"
            " PYTHONUNBUFFERED=1 ENABLE_WEB_INTERFACE=false",
            f"WORKDIR {APP_DIR}",
            f"EXPOSE {SERVER_PORT}",
            f'LABEL orchard.openenv.build="{key}"',
            *([f"LABEL {OWNER_LABEL}={json.dumps(owner)}"] if owner else []),
            "CMD " + json.dumps(cmd),
            "",
        ]
    )


def server_image(
    env_dir: str | os.PathLike[str],
    *,
    app: str = DEFAULT_APP,
    base: str | None = None,
    exclude: Sequence[str] = DEFAULT_EXCLUDE,
    include: Sequence[str] = (),
    force: bool = False,
    owner: str | None = None,
) -> str:
    """Return the tag of an OpenEnv server image for `env_dir` (built offline, then reused).

    :param env_dir: the environment folder (`server/app.py` in it, for the default `app`)
    :param app: the ASGI app, as uvicorn names it (`module:attribute`, from `env_dir`)
    :param base: the base image (default: Debian minbase + python3, built offline)
    :param exclude: top-level packages to leave out (imported only if present)
    :param include: modules to add that the server imports only later (at a request)
    :param force: build again even when the tag exists
    :param owner: the only owner a service runs it for (default: any)
    :return: the image tag, `orchard-openenv/<folder name>:<content hash>`
    """
    folder = Path(env_dir).resolve()
    if not folder.is_dir():
        raise ImageBuildError(f"{folder} is not a folder")
    base = base or debian_python_image()
    key = hashlib.sha256(
        "\0".join(
            [
                _RECIPE_VERSION,
                base,
                app,
                ",".join(sorted(exclude)),
                ",".join(sorted(include)),
                sys.version,
                _tree_digest(folder),
                _installed(),
                *([f"owner={owner}"] if owner else []),
            ]
        ).encode()
    ).hexdigest()[:16]
    name = "".join(c if c.isalnum() or c in "-_." else "-" for c in folder.name.lower())
    tag = f"{REPO}/{name.strip('-.') or 'env'}:{key}"
    if image_exists(tag) and not force:
        return tag
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    there = _python_minor(base)
    if here != there:
        raise ImageBuildError(
            f"{base} has Python {there} but this environment is {here}: the packages copied"
            " from here would not load there; run this with a Python of the base's version"
        )
    log.info("building %s from %s", tag, folder)
    with tempfile.TemporaryDirectory(prefix="orchard-openenv-") as tmp:
        ctx = Path(tmp)
        _copy_site(_closure(folder, app, exclude, include), ctx / "site")
        shutil.copytree(folder, ctx / "env", ignore=shutil.ignore_patterns(*_SKIP, "*.pyc"))
        (ctx / "Dockerfile").write_text(_dockerfile(base, app, key, owner))
        proc = subprocess.run(
            ["docker", "build", "-q", "-t", tag, str(ctx)],
            env={**os.environ, "DOCKER_BUILDKIT": "0"},
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise ImageBuildError(f"docker build of {tag} failed:\n{proc.stderr[-3000:]}")
    log.info("built %s", tag)
    return tag


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m orchard.integrations.openenv_image",
        description="Build an OpenEnv server image offline from an environment folder; "
        "print its tag.",
    )
    parser.add_argument("env_dir", type=Path, help="the environment folder (server/app.py)")
    parser.add_argument("--app", default=DEFAULT_APP, help=f"the ASGI app (default {DEFAULT_APP})")
    parser.add_argument("--base", help="base image with python3 (default: built offline)")
    parser.add_argument(
        "--exclude",
        action="append",
        help=f"a package to leave out (default: {', '.join(DEFAULT_EXCLUDE)})",
    )
    parser.add_argument(
        "--include", action="append", default=[], help="a module the server imports later"
    )
    parser.add_argument("--force", action="store_true", help="rebuild even if the tag exists")
    parser.add_argument("--owner", help="run only for this owner's API key (default: any)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    try:
        exclude = DEFAULT_EXCLUDE if args.exclude is None else args.exclude
        print(
            server_image(
                args.env_dir,
                app=args.app,
                base=args.base,
                exclude=exclude,
                include=args.include,
                force=args.force,
                owner=args.owner,
            )
        )
    except ImageBuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
