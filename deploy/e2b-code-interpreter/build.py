"""Build the code-interpreter image for E2B's `e2b-code-interpreter` SDK on Orchard.

    python deploy/e2b-code-interpreter/build.py --base IMAGE [--tag TAG] [--pip PIP]

`IMAGE` is a Debian-based image with python3 (e.g. `orchard/debian-python:...` from
`python -m orchard.env.images debian-python`, or `python:3.11-slim-bookworm`) whose Python
matches the `pip` used here (the wheels are fetched for it, on this machine, from PyPI).
The build itself runs with no network: the wheels are unpacked into the image's
site-packages by a container started with `--network none`, and `server.py` becomes the
image's command. Prints the tag. The operator then aliases the SDK's default template:
`ORCHARD_E2B_TEMPLATES=code-interpreter-v1=TAG,...` (docs/e2b.md).
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REQUIREMENTS = ("ipykernel==7.4.0", "jupyter_client==8.10.0")
REPO = "orchard/e2b-code-interpreter"
SERVER_DIR = "/opt/orchard-e2b"
# Runs in the build container: every wheel unpacked where the image's python3 finds it.
INSTALL = f"""
import glob, os, shutil, site, sys, sysconfig, zipfile
target = "/usr/local/lib/python%d.%d/dist-packages" % sys.version_info[:2]
if target not in sys.path:
    target = sysconfig.get_paths()["purelib"]
os.makedirs(target, exist_ok=True)
for wheel in sorted(glob.glob("/build/wheels/*.whl")):
    zipfile.ZipFile(wheel).extractall(target)
os.makedirs("{SERVER_DIR}", exist_ok=True)
shutil.copy("/build/server.py", "{SERVER_DIR}/server.py")
os.makedirs("/home/user", exist_ok=True)
import jupyter_client, ipykernel  # the install works, or the build fails here
print("installed into", target)
"""


def _run(*args: str, capture: bool = False) -> str:
    done = subprocess.run(args, check=False, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args[:3])} ... failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout.strip() if capture else ""


def image_exists(tag: str) -> bool:
    done = subprocess.run(["docker", "image", "inspect", tag], capture_output=True, check=False)
    return done.returncode == 0


def default_tag(base: str) -> str:
    """A tag naming what went in: the base image's id, the requirements, the server."""
    base_id = _run("docker", "image", "inspect", "--format", "{{.Id}}", base, capture=True)
    digest = hashlib.sha256()
    for part in (base_id, *REQUIREMENTS, (HERE / "server.py").read_text()):
        digest.update(part.encode() + b"\0")
    return f"{REPO}:{digest.hexdigest()[:16]}"


def build(base: str, tag: str, pip: list[str]) -> str:
    with tempfile.TemporaryDirectory(prefix="orchard-ci-") as tmp:
        work = Path(tmp)
        _run(
            *pip, "download", "-q", "--only-binary=:all:", "-d", str(work / "wheels"), *REQUIREMENTS
        )
        shutil.copy(HERE / "server.py", work / "server.py")
        (work / "install.py").write_text(INSTALL)
        work.chmod(0o755)
        cid = _run(
            "docker",
            "create",
            "--network",
            "none",
            "-v",
            f"{work}:/build:ro",
            base,
            "python3",
            "/build/install.py",
            capture=True,
        )
        try:
            _run("docker", "start", "-a", cid)
            _run(
                "docker",
                "commit",
                "--change",
                f'CMD ["python3", "{SERVER_DIR}/server.py"]',
                "--change",
                "ENV PYTHONUNBUFFERED=1",
                "--change",
                f'LABEL orchard.e2b.requirements="{" ".join(REQUIREMENTS)}"',
                cid,
                tag,
            )
        finally:
            subprocess.run(["docker", "rm", "-f", cid], capture_output=True, check=False)
    return tag


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="a Debian-based image with python3")
    parser.add_argument("--tag", help="the image's tag (default: named by its inputs)")
    parser.add_argument("--pip", default=f"{sys.executable} -m pip", help="the pip to fetch with")
    args = parser.parse_args(argv)
    tag = args.tag or default_tag(args.base)
    if not image_exists(tag):
        build(args.base, tag, args.pip.split())
    print(tag)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
