"""DockerBackend against the real engine: lifecycle, labels, limits, image config, errors."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchard.env.backend_contract.host import base_spec as make_spec
from orchard.env.backend_contract.scenarios import CAP_NET_RAW
from orchard.env.backends.base import AGENT_PIDS_RESERVE, SandboxRecord, SandboxSpec
from orchard.env.backends.docker.backend import AGENT_PATH, DEFAULT_PIDS_LIMIT, DockerBackend
from orchard.env.errors import (
    Conflict,
    ImageNotFound,
    InvalidRequest,
    NotFound,
    RegistryUnavailable,
)
from orchard.env.image_policy import ImagePolicy
from orchard.env.models import NetworkPolicy
from tests.agent_routes import TypedAgent
from tests.backends.backend_harness import TEST_LABELS, owned
from tests.docker_util import DERIVED_CHANGES, commit_image, container_of
from tests.servers import fake_registry

pytestmark = pytest.mark.anyio


def docker_inspect(name: str) -> dict[str, Any]:
    out = subprocess.run(["docker", "inspect", name], capture_output=True, check=True).stdout
    data: dict[str, Any] = json.loads(out)[0]
    return data


def agent_for(rec: SandboxRecord, spec: SandboxSpec) -> TypedAgent:
    assert rec.endpoint.socket_path
    return TypedAgent(socket_path=rec.endpoint.socket_path, token=spec.agent_token)


@pytest.fixture
async def backend(
    docker_ready: None, tmp_state_dir: Path, agent_binary: Path
) -> AsyncIterator[DockerBackend]:
    async with owned(DockerBackend(tmp_state_dir, agent_binary, extra_labels=TEST_LABELS)) as b:
        yield b


@pytest.fixture(scope="module")
def derived_image(busybox_image: str) -> str:
    """busybox plus the image config a real image has: ENV, WORKDIR, USER and a CMD."""
    tag = "orchard-test/derived:" + hashlib.sha256(busybox_image.encode()).hexdigest()[:12]
    if subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0:
        return tag
    return commit_image(busybox_image, DERIVED_CHANGES, tag)


async def test_lifecycle(backend: DockerBackend, busybox_image: str) -> None:
    spec = make_spec(busybox_image, labels={"team": "a"})
    rec = await backend.create(spec)
    assert (rec.id, rec.owner, rec.image, rec.state) == (spec.id, "alice", busybox_image, "running")
    assert rec.labels == {"team": "a"}
    assert rec.pids_limit == DEFAULT_PIDS_LIMIT
    assert rec.network == NetworkPolicy()
    assert rec.endpoint.socket_path == str(
        backend.state_dir / "sandboxes" / spec.id / "agent.sock"  # pinned: agent_socket.py
    )
    async with agent_for(rec, spec) as agent:
        health = await agent.wait_ready(15)
        assert health["pid"] == 1  # the agent is PID 1, no docker-init in between
        res = await agent.exec("echo hi")
        assert (res.exit_code, res.stdout) == (0, "hi\n")
    assert await backend.get(spec.id) == rec
    assert [r for r in await backend.list() if r.id == spec.id] == [rec]

    await backend.delete(spec.id)
    assert await backend.get(spec.id) is None
    assert not (backend.state_dir / "sandboxes" / spec.id).exists()
    assert container_of(spec.id) == ""
    await backend.delete(spec.id)  # deleting what is gone is fine


async def test_new_backend_rebuilds_records_and_limits_are_set(
    backend: DockerBackend, busybox_image: str, tmp_state_dir: Path, agent_binary: Path
) -> None:
    spec = make_spec(
        busybox_image,
        cpu=0.5,
        memory_bytes=64 << 20,
        pids_limit=64,
        idle_timeout_s=30.0,
        user="1000",
        labels={"task": "x-1", "run": "7"},
    )
    rec = await backend.create(spec)
    assert rec.default_user == "1000"

    restarted = DockerBackend(tmp_state_dir, agent_binary)  # a service restart
    try:
        assert await restarted.get(spec.id) == rec
        assert [r for r in await restarted.list() if r.id == spec.id] == [rec]
    finally:
        await restarted.close()

    data = docker_inspect(container_of(spec.id))
    host, cfg = data["HostConfig"], data["Config"]
    assert host["NanoCpus"] == 500_000_000
    assert host["Memory"] == host["MemorySwap"] == 64 << 20
    assert host["PidsLimit"] == 64 + AGENT_PIDS_RESERVE  # the agent's threads on top
    assert not host["Init"]
    assert "NET_RAW" in host["CapDrop"]
    assert any(o.startswith("no-new-privileges") for o in host["SecurityOpt"])
    assert host["NetworkMode"] == "none"
    assert (cfg["User"], cfg["Entrypoint"]) == ("0", [AGENT_PATH])
    labels = cfg["Labels"]
    assert labels["orchard.sandbox"] == spec.id
    assert labels["orchard.owner"] == "alice"
    assert labels["orchard.managed"] == "1"
    assert labels["orchard.default_user"] == "1000"
    assert labels["orchard.label.task"] == "x-1"
    assert float(labels["orchard.expires_at"]) == spec.expires_at
    assert json.loads(labels["orchard.network"]) == {"egress": "none", "allow": []}

    async with agent_for(rec, spec) as agent:
        await agent.wait_ready(15)
        # no-new-privileges still lets the root agent drop to another uid.
        res = await agent.exec("id -u", user="1000")
        assert res.stdout.strip() == "1000"
        status = (await agent.exec("cat /proc/1/status")).stdout
        cap_bnd = next(
            int(ln.split()[1], 16) for ln in status.splitlines() if ln.startswith("CapBnd")
        )
        assert not cap_bnd & (1 << CAP_NET_RAW)
        res = await agent.exec("cat /proc/sys/net/ipv6/conf/all/disable_ipv6")
        assert res.stdout.strip() in ("1", "")  # "" when the kernel has no IPv6 at all


async def test_image_config_and_cmd(backend: DockerBackend, derived_image: str) -> None:
    own = make_spec(derived_image, cmd=[])  # the image's own CMD, under the agent
    bare = make_spec(derived_image, env={"GREETING": "override"}, workdir="/tmp")  # no child
    custom = make_spec(derived_image, cmd=["sh", "-c", "echo custom > /tmp/cmd-ran; sleep 600"])
    recs = [await backend.create(s) for s in (own, bare, custom)]
    assert recs[0].default_user == "1000:1000"  # the image's USER, for the service's execs

    async with agent_for(recs[0], own) as agent:
        await agent.wait_ready(15)
        res = await agent.exec(
            "for i in $(seq 100); do [ -s /tmp/cmd-ran ] && break; sleep 0.05; done; "
            "cat /tmp/cmd-ran; pwd; echo $GREETING"
        )
        assert res.stdout.split() == ["hello-from-image", "/srv/app", "hello-from-image"]
        # The token reaches the agent only: the image's process never sees it.
        environ = await agent.exec("cat /proc/$(pidof sleep)/environ | tr '\\0' '\\n'")
        assert "GREETING=hello-from-image" in environ.stdout
        assert "ORCHARD_AGENT" not in environ.stdout
        # The image's USER runs its CMD and is the default for execs; the agent stays root.
        users = await agent.exec("id -u; stat -c %u /proc/$(pidof sleep) /proc/1")
        assert users.stdout.split() == ["1000", "1000", "0"]

    async with agent_for(recs[1], bare) as agent:
        await agent.wait_ready(15)
        res = await agent.exec("pwd; echo $GREETING; ls /tmp/cmd-ran; pidof sleep")
        assert res.stdout.split() == ["/tmp", "override"]
        assert res.exit_code != 0

    async with agent_for(recs[2], custom) as agent:
        await agent.wait_ready(15)
        res = await agent.exec(
            "for i in $(seq 100); do [ -s /tmp/cmd-ran ] && break; sleep 0.05; done; "
            "cat /tmp/cmd-ran"
        )
        assert res.stdout == "custom\n"


async def test_expiry_and_network_persist_in_meta(
    backend: DockerBackend, busybox_image: str, tmp_state_dir: Path, agent_binary: Path
) -> None:
    spec = make_spec(busybox_image)
    rec = await backend.create(spec)
    new_expiry = rec.expires_at + 3600
    updated = await backend.set_expiry(spec.id, new_expiry)
    assert updated.expires_at == new_expiry
    meta = json.loads((tmp_state_dir / "sandboxes" / spec.id / "meta.json").read_text())
    assert meta["expires_at"] == new_expiry
    # Labels are immutable: the label keeps the first value, meta.json wins.
    labels = docker_inspect(container_of(spec.id))["Config"]["Labels"]
    assert float(labels["orchard.expires_at"]) == spec.expires_at

    updated = await backend.set_network(spec.id, NetworkPolicy(egress="all"))
    assert updated.network.egress == "all"
    networks = docker_inspect(container_of(spec.id))["NetworkSettings"]["Networks"]
    assert list(networks) == [backend.network_name]

    restarted = DockerBackend(tmp_state_dir, agent_binary)
    try:
        seen = await restarted.get(spec.id)
        assert seen is not None
        assert (seen.expires_at, seen.network.egress) == (new_expiry, "all")
        back = await restarted.set_network(spec.id, NetworkPolicy())
        assert back.network.egress == "none"
        assert docker_inspect(container_of(spec.id))["NetworkSettings"]["Networks"] == {}
        assert await restarted.firewall.chain_rules(spec.id) == []
    finally:
        await restarted.close()
    seen = await backend.get(spec.id)
    assert seen is not None and seen.network.egress == "none"

    with pytest.raises(NotFound):
        await backend.set_expiry("t-no-such-sandbox", new_expiry)


@pytest.fixture
def empty_registry() -> Iterator[str]:
    with fake_registry() as address:
        yield address


async def test_missing_image_errors_fast(
    docker_ready: None, tmp_state_dir: Path, agent_binary: Path, empty_registry: str
) -> None:
    # Registries on the host are refused unless the operator lists them (image_policy.py).
    policy = ImagePolicy.from_lists(["docker.io", empty_registry, "127.0.0.1:1"])
    made = DockerBackend(tmp_state_dir, agent_binary, extra_labels=TEST_LABELS, image_policy=policy)
    async with owned(made) as backend:
        image = f"{empty_registry}/orchard/missing:v1"
        start = time.monotonic()
        with pytest.raises(ImageNotFound) as not_found:
            await backend.create(make_spec(image))
        assert image in not_found.value.message
        assert time.monotonic() - start < 15

        closed = "127.0.0.1:1/orchard/missing:v1"  # nothing listens on port 1
        start = time.monotonic()
        with pytest.raises(RegistryUnavailable) as unreachable:
            await backend.create(make_spec(closed))
        assert unreachable.value.status == 503
        # The registry's (or the dialer's) own words stay in the log: no port scanner.
        assert closed in unreachable.value.message and "refused" not in unreachable.value.message
        assert time.monotonic() - start < 15
        assert list((backend.state_dir / "sandboxes").iterdir()) == []


async def test_bad_requests(backend: DockerBackend, busybox_image: str) -> None:
    with pytest.raises(InvalidRequest):
        await backend.create(make_spec(busybox_image, id="../escape"))
    with pytest.raises(InvalidRequest):
        await backend.create(make_spec(busybox_image, env={"ORCHARD_AGENT_TOKEN": "mine"}))
    with pytest.raises(InvalidRequest):
        await backend.create(
            make_spec(busybox_image, network=NetworkPolicy(egress="allow", allow=["a b"]))
        )
    spec = make_spec(busybox_image)
    await backend.create(spec)
    with pytest.raises(Conflict):
        await backend.create(make_spec(busybox_image, id=spec.id))
    rec = await backend.get(spec.id)
    assert rec is not None and rec.state == "running"  # the failed duplicate left it alone
    assert [p.name for p in (backend.state_dir / "sandboxes").iterdir()] == [spec.id]


async def test_exited_and_orphaned(backend: DockerBackend, busybox_image: str) -> None:
    exited, orphan = make_spec(busybox_image), make_spec(busybox_image)
    await backend.create(exited)
    await backend.create(orphan)
    subprocess.run(["docker", "kill", container_of(exited.id)], capture_output=True, check=True)
    subprocess.run(["docker", "wait", container_of(exited.id)], capture_output=True, check=True)
    listed = {r.id: r for r in await backend.list()}
    assert (listed[exited.id].state, listed[exited.id].exit_code) == ("exited", 137)
    got = await backend.get(exited.id)
    assert got is not None and (got.state, got.exit_code) == ("exited", 137)

    # The container vanishes behind our back: its host folder is left for reconcile.
    subprocess.run(["docker", "rm", "-f", container_of(orphan.id)], capture_output=True, check=True)
    box = backend.state_dir / "sandboxes" / orphan.id
    assert await backend.get(orphan.id) is None and box.exists()
    known = {r.id for r in await backend.list()}
    assert known == {exited.id}
    assert await backend.remove_orphans(known) == []  # too young: may be a create in flight
    old = time.time() - 3600
    os.utime(box, (old, old))
    assert await backend.remove_orphans(known) == [orphan.id]
    assert not box.exists()
