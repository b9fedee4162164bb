"""The registry client against the real in-cluster registry, run here as processes: the
upstream registry binary (distribution v3, built from the Go module proxy by
deploy/kubernetes/images/registry/build.sh) behind its gate, built from source for the test.
Push, pull, delete, and collection that frees exactly the blobs no manifest needs."""

from __future__ import annotations

import io
import os
import re
import shutil
import socket
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from orchard.env.backends.kubernetes.registry import RegistryClient, sha256_digest

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "deploy" / "kubernetes" / "images" / "registry"
CONFIG = """version: 0.1
log: {{level: warn, formatter: text, accesslog: {{disabled: true}}}}
storage:
  filesystem: {{rootdirectory: {root}}}
  delete: {{enabled: true}}
  redirect: {{disable: true}}
http: {{addr: "127.0.0.1:0", relativeurls: true}}
"""


def registry_binary() -> Path | None:
    if os.environ.get("ORCHARD_REGISTRY_BIN"):
        return Path(os.environ["ORCHARD_REGISTRY_BIN"])
    match = re.search(r"^VERSION=(\S+)$", (IMAGES / "build.sh").read_text(), re.M)
    assert match, "build.sh names no VERSION"
    cache = os.environ.get("ORCHARD_REGISTRY_CACHE", f"/var/cache/orchard/registry-v{match[1]}")
    path = Path(cache) / "registry"
    return path if path.exists() else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The gate and the registry behind it, on loopback; yields (url, storage root)."""
    binary = registry_binary()
    if binary is None or shutil.which("go") is None:
        pytest.skip("no registry binary: run deploy/kubernetes/images/registry/build.sh once")
    tmp = tmp_path_factory.mktemp("registry")
    gate = tmp / "orchard-registry"
    subprocess.run(
        ["go", "build", "-o", str(gate), "."],
        cwd=IMAGES / "gate", check=True, env={**os.environ, "CGO_ENABLED": "0"},
    )  # fmt: skip
    root = tmp / "store"
    (tmp / "config.yml").write_text(CONFIG.format(root=root))
    port, upstream = free_port(), free_port()
    proc = subprocess.Popen(
        [str(gate), f"-listen=127.0.0.1:{port}", f"-upstream=127.0.0.1:{upstream}",
         f"-registry={binary}", f"-config={tmp / 'config.yml'}", f"-root={root}",
         "-gc-interval=0", "-gc-quiet=200ms", "-gc-max-wait=10s"],
        env={**os.environ, "OTEL_TRACES_EXPORTER": "none"},
        stdout=subprocess.DEVNULL, stderr=(tmp / "log").open("wb"),
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, (tmp / "log").read_text()
            assert time.monotonic() < deadline, "the registry did not start"
            time.sleep(0.1)
        yield url, root
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def layer(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def blob_files(root: Path) -> set[str]:
    base = root / "docker" / "registry" / "v2" / "blobs" / "sha256"
    return {"sha256:" + p.parent.name for p in base.glob("*/*/data")}


def test_push_pull_delete_and_collect(registry: tuple[str, Path]) -> None:
    url, root = registry
    base = layer({"etc/base.txt": b"shared base\n"})
    with RegistryClient(url) as reg:
        assert reg.ping()
        one = reg.push_image("snap/a", "s1", [base, layer({"one.txt": b"one\n"})])
        two = reg.push_image("snap/b", "s2", [base, layer({"two.txt": b"two\n"})])
        assert one.layers[0] == two.layers[0]  # the base layer is one blob for both
        assert reg.manifest_digest("snap/a", "s1") == one.digest and reg.tags("snap/a") == ["s1"]
        got = httpx.get(f"{url}/v2/snap/a/blobs/{one.layers[1]}").content
        assert sha256_digest(got) == one.layers[1]
        assert set(one.blobs) | set(two.blobs) <= blob_files(root)

        assert reg.delete_manifest("snap/a", "s1")
        assert reg.manifest_digest("snap/a", "s1") is None
        assert not reg.delete_manifest("snap/a", "s1")  # twice: nothing left, no error
        res = reg.collect_garbage()
        # a's manifest (a blob too), config and own layer go; the shared base and all of b
        # stay, still pullable.
        assert res["blobs_removed"] == 3 and res["bytes_removed"] > 0 and not res["forced"]
        left = blob_files(root)
        assert not {one.digest, one.config, one.layers[1]} & left
        assert set(two.blobs) <= left
        for digest in two.blobs:
            assert reg.has_blob("snap/b", digest)
        assert not reg.has_blob("snap/a", one.layers[1])

        # Deleting the last image frees the shared layer too; the store is empty again.
        assert reg.delete_manifest("snap/b", two.digest)
        assert reg.collect_garbage()["blobs_removed"] == 4
        assert not blob_files(root) & {one.digest, two.digest, *one.blobs, *two.blobs}


def test_a_push_after_a_collection_is_whole(registry: tuple[str, Path]) -> None:
    """Blobs a collection removed are uploaded again by the next push (the registry does
    not vouch for them from a cache), so an image pushed again is complete."""
    url, _ = registry
    data = layer({"again.txt": b"again\n"})
    with RegistryClient(url) as reg:
        first = reg.push_image("snap/again", "t", [data])
        assert reg.delete_manifest("snap/again", "t")
        reg.collect_garbage()
        assert not reg.has_blob("snap/again", first.layers[0])
        second = reg.push_image("snap/again", "t", [data])
        assert second.digest == first.digest
        for digest in second.blobs:
            assert reg.has_blob("snap/again", digest)
        assert httpx.get(f"{url}/orchard/gc").json()["blobs_removed"] >= 1
        reg.delete_manifest("snap/again", "t")
        reg.collect_garbage()
