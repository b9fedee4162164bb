"""Holes 2 and 3 of issue 17: image pulls reaching the host's ports, and images by id.

`image: "127.0.0.1:18903/probe:x"` made the engine send requests to a port on the host and
put the answer into the error (closed ports said "connection refused": a port scanner);
`image: "0"` started an untagged image by id prefix. Now references are checked by the
image policy before the engine is asked (registries on the host or a private network are
refused unless the operator lists them; ids are refused; names are looked up by name
only), and no registry's or dialer's text reaches the caller. On docker and local.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import secrets
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchard.env.backends.docker.backend import DockerBackend
from orchard.env.errors import (
    ImageNotFound,
    ImageRefused,
    InvalidRequest,
    OrchardError,
    RegistryUnavailable,
)
from orchard.env.image_policy import ImagePolicy, names_image, parse_reference
from tests.backends.backend_harness import AnyBackend, Harness, owned
from tests.backends.test_backend_contract import make_spec
from tests.docker_util import commit_image
from tests.security.conftest import Service, assert_error
from tests.servers import fake_registry

pytestmark = pytest.mark.anyio
BANNER = "SECRET-BANNER-" + secrets.token_hex(4)


# ---------------------------------------------------------------- listeners on the host


class Listener:
    """A TCP port on 127.0.0.1 that counts connections (and answers nothing)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.port: int = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    lst = Listener()
    try:
        yield lst
    finally:
        lst.close()


@pytest.fixture
def chatty_registry() -> Iterator[str]:
    """A registry that answers with a banner of its own (as any port might)."""
    with fake_registry(BANNER.encode()) as address:
        yield address


def _resolves_privately(name: str) -> bool:
    try:
        infos = socket.getaddrinfo(name, None)
    except OSError:
        return False
    return bool(infos) and all(not ipaddress.ip_address(i[4][0]).is_global for i in infos)


# ---------------------------------------------------------------- the pure parts


def test_references_parse_as_the_engine_parses_them() -> None:
    cases = {
        "busybox": "docker.io/library/busybox:latest",
        "0:latest": "docker.io/library/0:latest",  # with a tag, a name (never an id prefix)
        "orchard/busybox:v1": "docker.io/orchard/busybox:v1",
        "index.docker.io/x/y": "docker.io/x/y:latest",
        "ghcr.io/a/b:c": "ghcr.io/a/b:c",
        "127.0.0.1:5000/p:x": "127.0.0.1:5000/p:x",
        "localhost/p": "localhost/p:latest",
    }
    assert {k: parse_reference(k).canonical for k in cases} == cases
    digest = "sha256:" + "a" * 64
    assert parse_reference(f"busybox@{digest}").digest == digest
    for image_id in (digest, "a" * 64, "0", "3f2a", "deadbeef"):  # ids, or id prefixes
        with pytest.raises(ImageRefused):
            parse_reference(image_id)
    for bad in ("Busybox/UP", "a b", "x:", "x@sha256:zz"):
        with pytest.raises(InvalidRequest):
            parse_reference(bad)


def test_the_default_policy_refuses_registries_on_the_host_or_a_private_network() -> None:
    policy = ImagePolicy()
    for image in (
        "127.0.0.1:18903/probe:x",
        "localhost:5000/x",
        "registry.localhost/x",
        "10.0.0.7/x",
        "192.168.1.2:5000/x",
        "169.254.169.254/x",
        "100.100.100.200/x",
        "[::1]:5000/x",
        "[fd00::1]/x",
    ):
        with pytest.raises(ImageRefused):
            policy.check(image)
    # IPv6 forms that carry an IPv4 address on the host or a private network (issue 31).
    for host in (
        "::127.0.0.1",  # IPv4-compatible
        "::ffff:127.0.0.1",  # IPv4-mapped
        "::ffff:0:7f00:1",  # IPv4-translated (SIIT)
        "64:ff9b::7f00:1",  # NAT64
        "64:ff9b::a00:7",  # NAT64 of 10.0.0.7
        "64:ff9b:1::a9fe:a9fe",  # local-use NAT64
        "2002:7f00:1::",  # 6to4 of 127.0.0.1
        "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254
        "2002:c0a8:102::",  # 6to4 of 192.168.1.2
        "2001:0:4136:e378:8000:63bf:f5ff:fffe",  # Teredo (client 10.0.0.1)
        "fec0::1",  # site-local
        "ff02::1",  # multicast
        "::",
    ):
        with pytest.raises(ImageRefused):
            policy.check(f"[{host}]:5000/x")
    for image in ("busybox", "ghcr.io/a/b", "8.8.8.8/x", "quay.io/x/y:1", "docker:24-dind"):
        policy.check(image)
    for image in ("[2001:4860:4860::8888]/x", "[2002:808:808::1]/x"):  # global, 6to4 of 8.8.8.8
        policy.check(image)
    with pytest.raises(ImageRefused):
        policy.check("oci:/etc")  # host files: only under folders the operator lists
    listed = ImagePolicy.from_lists(["registry.internal:5000", "*.corp.example"])
    listed.check("registry.internal:5000/x")  # trusted as listed, private or not
    listed.check("r.corp.example/x")
    with pytest.raises(ImageRefused):
        listed.check("busybox")  # no `*`: docker.io is not listed either


def test_only_named_images_match() -> None:
    ref = parse_reference("orchard/busybox:v1")
    assert names_image(ref, {"RepoTags": ["orchard/busybox:v1"]})
    assert names_image(ref, {"RepoTags": ["docker.io/orchard/busybox:v1"]})  # Podman's form
    assert not names_image(ref, {"RepoTags": []})  # dangling
    assert not names_image(ref, {"RepoTags": ["<none>:<none>"]})
    assert not names_image(ref, {"RepoTags": ["orchard/busybox:v2"]})


# Orchard's own images (a snapshot's) and local transports: never a name (issue 31).
_DIGEST = "sha256:" + "0" * 64
NO_NAMES = (
    "orchard-snapshot:snap-0123456789ab",
    "docker.io/library/orchard-snapshot:snap-0123456789ab",
    "index.docker.io/library/orchard-snapshot",
    f"orchard-snapshot@{_DIGEST}",
    f"orchard-snapshot:snap-0123456789ab@{_DIGEST}",
    "orchard-snapshot/x:1",
    "docker-daemon:orchard-snapshot:snap-0123456789ab",
    "docker-daemon:busybox:latest",
    "docker-daemon:5000/x",
    "containers-storage:busybox",
    "dir:/var/lib/x",
    "oci-archive:/tmp/x.tar",
    "docker://busybox",
    "ostree:x@/ostree/repo",
    "sif:/tmp/x.sif",
    "tarball:/tmp/x.tar",
)


def test_orchards_own_images_and_local_transports_are_never_names() -> None:
    for policy in (ImagePolicy(), ImagePolicy.from_lists(["docker.io", "*"])):
        for image in NO_NAMES:
            with pytest.raises(ImageRefused):
                policy.check(image)


async def test_they_are_refused_before_the_engine_is_asked(
    backend: AnyBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(*args: object, **kw: object) -> None:
        raise AssertionError(f"the engine was asked about {args}")

    engine_calls = ("_inspect", "_pull") if isinstance(backend, DockerBackend) else (
        "_docker_image_id", "_from_source")  # fmt: skip
    for name in engine_calls:
        monkeypatch.setattr(backend.images, name, never)
    for image in NO_NAMES:
        with pytest.raises(ImageRefused):
            await backend.create(make_spec(image))
    assert await backend.list() == []


def test_file_sources_only_under_listed_folders(tmp_path: Path) -> None:
    (tmp_path / "ok").mkdir()
    (tmp_path / "ok" / "img.tar").write_bytes(b"")
    (tmp_path / "ok" / "escape").symlink_to("/etc")
    policy = ImagePolicy.from_lists(None, [str(tmp_path / "ok")])
    assert policy.check_file(f"docker-archive:{tmp_path}/ok/img.tar").endswith("img.tar")
    for image in (
        "docker-archive:/etc/passwd",
        f"docker-archive:{tmp_path}/ok/../x.tar",
        f"oci:{tmp_path}/ok/escape:v1",
        "oci:/etc",
    ):
        with pytest.raises(ImageRefused):
            policy.check_file(image)


# ---------------------------------------------------------------- both backends, for real


async def test_a_registry_on_the_host_is_never_contacted(
    backend: AnyBackend, listener: Listener
) -> None:
    port = listener.port
    images = [f"127.0.0.1:{port}/probe:x", f"localhost:{port}/probe:x", f"[::1]:{port}/p:x"]
    if _resolves_privately(socket.gethostname()):  # a name that resolves to this host
        images.append(f"{socket.gethostname()}:{port}/probe:x")
    for image in images:
        with pytest.raises(ImageRefused) as refused:
            await backend.create(make_spec(image))
        assert refused.value.status == 422 and refused.value.code == "image_refused"
    assert listener.connections == 0
    assert await backend.list() == []


async def test_a_registrys_answer_never_reaches_the_caller(
    harness: Harness, chatty_registry: str, caplog: pytest.LogCaptureFixture
) -> None:
    closed = "127.0.0.1:1"  # nothing listens on port 1
    policy = ImagePolicy.from_lists(["docker.io", chatty_registry, closed])
    async with owned(harness.make(image_policy=policy)) as backend:
        for registry in (chatty_registry, closed):
            image = f"{registry}/probe:x"
            with caplog.at_level(logging.WARNING), pytest.raises(OrchardError) as failed:
                await backend.create(make_spec(image))
            err = failed.value
            assert isinstance(err, RegistryUnavailable | ImageNotFound), err
            assert image in err.message  # what the caller asked for, and nothing else:
            for leak in (BANNER, "refused", "dial tcp", "/v2/", "tls", "http"):
                assert leak not in err.message, err.message
        # The operator sees it all in the log (skopeo fails at TLS, before any banner).
        assert "refused" in caplog.text
        assert BANNER in caplog.text or harness.name == "local"


def _engine_id(image: str) -> str:
    out = subprocess.check_output(["docker", "image", "inspect", "--format", "{{.Id}}", image])
    return out.decode().strip().partition(":")[2]


async def _image_id(backend: AnyBackend, name: str) -> str:
    """The engine id of the image `backend` resolves `name` to."""
    if isinstance(backend, DockerBackend):
        return (await backend.images.get(name)).id.partition(":")[2]
    return (await backend.images.resolve(name)).key.removeprefix("docker-")


@pytest.fixture
def dangling_image(busybox_image: str) -> Iterator[str]:
    """The id of an untagged image (a `docker commit` without a name)."""
    image_id = commit_image(busybox_image, [f"LABEL orchard.test.dangling={BANNER}"])
    data = json.loads(subprocess.check_output(["docker", "image", "inspect", image_id]))[0]
    assert data["RepoTags"] == []
    try:
        yield image_id
    finally:
        subprocess.run(["docker", "rmi", "-f", image_id], capture_output=True, check=False)


async def test_image_ids_and_untagged_images_never_run(
    backend: AnyBackend, dangling_image: str, busybox_image: str
) -> None:
    refs = (f"sha256:{dangling_image}", dangling_image, dangling_image[:12], dangling_image[:1])
    for ref in refs:
        with pytest.raises(ImageRefused):
            await backend.create(make_spec(ref))
    # With a tag it is a name (docker.io/library/<prefix>:latest): looked up as that, never
    # the image an id search would find. Here the name is busybox's (nothing is pulled).
    named = f"{dangling_image[:12]}:latest"
    subprocess.run(["docker", "tag", busybox_image, named], check=True)
    try:
        found = await _image_id(backend, named)
    finally:
        subprocess.run(["docker", "rmi", named], capture_output=True, check=False)
    assert found == _engine_id(busybox_image) != dangling_image
    assert await backend.list() == []
    rec = await backend.create(make_spec(busybox_image))  # names still work
    assert rec.state == "running"


# ---------------------------------------------------------------- through the API


def test_rest_refuses_images_from_the_host(
    shared_service: Service, listener: Listener, dangling_image: str
) -> None:
    with shared_service.client() as c:
        images = (f"127.0.0.1:{listener.port}/probe:x", f"sha256:{dangling_image}", "0")
        for image in images:
            r = c.post("/v1/sandboxes", json={"image": image})
            assert_error(r, 422, "image_refused")
    assert listener.connections == 0
    assert "pulling " not in shared_service.logs()  # every refusal came before the engine
