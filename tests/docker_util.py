"""Docker from the host, for tests: a sandbox's container, and images made by commit.

Container names are an HMAC of the sandbox id (the engine's DNS shows names to other
containers, so they must not reveal ids), so tests look containers up by label instead.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence


def remove_labelled(label_filter: str, *, images: bool = False) -> None:
    """Force-remove the engine's containers (or images) whose labels match the filter."""
    listing = ["docker", "images", "-q"] if images else ["docker", "ps", "-aq"]
    ids = subprocess.run(
        [*listing, "--filter", f"label={label_filter}"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    if ids:
        remove = ["docker", "rmi", "-f"] if images else ["docker", "rm", "-f"]
        subprocess.run([*remove, *set(ids)], capture_output=True, check=False)


def container_of(sandbox_id: str) -> str:
    """The id of the container of `sandbox_id`, or "" if there is none."""
    out = subprocess.run(
        ["docker", "ps", "-aq", "--no-trunc", "--filter", f"label=orchard.sandbox={sandbox_id}"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    return out[0] if out else ""


# The image config a real image has (ENV, WORKDIR, USER, a CMD), for busybox-derived images.
DERIVED_CHANGES = (
    "ENV GREETING=hello-from-image",
    "WORKDIR /srv/app",
    "USER 1000:1000",
    'CMD ["sh", "-c", "echo $GREETING > /tmp/cmd-ran; exec sleep 600"]',
)


def commit_image(base: str, changes: Sequence[str], tag: str | None = None) -> str:
    """`base` with Dockerfile `changes` committed as `tag` (untagged if None); its tag or id."""
    cid = subprocess.run(
        ["docker", "create", "--label", "orchard.test=1", base],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    try:
        args = [a for c in changes for a in ("--change", c)]
        out = subprocess.run(
            ["docker", "commit", *args, cid, *([tag] if tag else [])],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    finally:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True, check=False)
    return tag or out.partition(":")[2]
