"""The local backend's image cache: every source, layer order and whiteouts, unpack once."""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
import tempfile
from pathlib import Path

import pytest

from orchard.env.backends.local.oci_images import ImageStore
from orchard.env.errors import ImageNotFound, RegistryUnavailable

pytestmark = pytest.mark.anyio

# Layer 2 deletes a file (a whiteout), replaces a folder (an opaque folder) and changes a
# file of layer 1: only a correct unpacker gets all three right.
DOCKERFILE = """FROM {base}
RUN mkdir -p /d/sub && echo a > /d/a && echo s > /d/sub/s && echo x > /gone && echo 1 > /f
RUN rm /gone && rm -r /d && mkdir /d && echo b > /d/b && echo 2 > /f
ENV LAYERED=yes
WORKDIR /d
USER 1000:1000
"""


@pytest.fixture(scope="module")
def layered_image(busybox_image: str) -> str:
    text = DOCKERFILE.format(base=busybox_image)
    tag = "orchard-test/layered:" + hashlib.sha256(text.encode()).hexdigest()[:12]
    if subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode:
        with tempfile.TemporaryDirectory() as ctx:
            (Path(ctx) / "Dockerfile").write_text(text)
            subprocess.run(
                ["docker", "build", "-q", "--label", "orchard.test=1", "-t", tag, ctx],
                capture_output=True,
                check=True,
            )
    return tag


def _check(rootfs: Path) -> None:
    assert sorted(p.name for p in (rootfs / "d").iterdir()) == ["b"]
    assert not (rootfs / "gone").exists()
    assert (rootfs / "f").read_text() == "2\n"
    assert (rootfs / "bin" / "busybox").is_file()


async def test_every_source_unpacks_the_same_tree(layered_image: str, tmp_state_dir: Path) -> None:
    store = ImageStore(tmp_state_dir / "cache")
    # The engine's store, five creates at once: one unpack.
    images = await asyncio.gather(*(store.resolve(layered_image) for _ in range(5)))
    assert len({i.key for i in images}) == 1
    image = images[0]
    assert image.key.startswith("docker-")
    assert "LAYERED=yes" in image.env and (image.workdir, image.user) == ("/d", "1000:1000")
    _check(image.rootfs)
    entries = [p.name for p in store.cache_dir.iterdir() if not p.name.startswith(".")]
    assert sorted(entries) == sorted([image.key, "names"])

    # A `docker save` tarball and an OCI layout made from it.
    tar = tmp_state_dir / "img.tar"
    subprocess.run(["docker", "save", "-o", str(tar), layered_image], check=True)
    layout = tmp_state_dir / "layout"
    subprocess.run(
        ["skopeo", "copy", "-q", f"docker-archive:{tar}", f"oci:{layout}:v1"], check=True
    )
    other = ImageStore(tmp_state_dir / "cache2", use_docker=False)
    from_tar = await other.resolve(f"docker-archive:{tar}")
    from_layout = await other.resolve(f"oci:{layout}:v1")
    assert from_tar.key == from_layout.key and from_tar.key.startswith("oci-")
    assert (from_tar.env, from_tar.user) == (image.env, image.user)
    _check(from_layout.rootfs)

    with pytest.raises(ImageNotFound):
        await other.resolve(f"oci:{layout}:no-such-tag")


async def test_registry_errors(tmp_state_dir: Path) -> None:
    store = ImageStore(tmp_state_dir / "cache", use_docker=False, pull_timeout_s=20)
    with pytest.raises(RegistryUnavailable) as unreachable:
        await store.resolve("127.0.0.1:1/orchard/missing:v1")  # nothing listens on port 1
    assert "127.0.0.1:1/orchard/missing:v1" in unreachable.value.message
