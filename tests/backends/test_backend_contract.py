"""The Backend protocol, the same tests for every backend (docker and local/runc), for real.

Only the protocol is used, plus the harness's host-side look-ups (conftest.py); a backend
that passes this behaves the same to the service, the SDK and everything above them.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any

import pytest

from orchard.env.backends.base import SandboxRecord, SandboxSpec
from orchard.env.config import ServiceConfig
from orchard.env.errors import Conflict, InvalidRequest, NotFound
from orchard.env.models import NetworkPolicy
from orchard.env.sdk import Orchard
from orchard.env.server import EmbeddedService
from tests.agent_routes import TypedAgent
from tests.backends.backend_harness import AnyBackend, Harness

pytestmark = pytest.mark.anyio

CAP_NET_RAW = 13


def make_spec(image: str, **kw: Any) -> SandboxSpec:
    kw.setdefault("id", "c" + secrets.token_hex(6))
    kw.setdefault("owner", "alice")
    kw.setdefault("agent_token", secrets.token_urlsafe(16))
    kw.setdefault("expires_at", time.time() + 600)
    return SandboxSpec(image=image, **kw)


async def ready(rec: SandboxRecord, spec: SandboxSpec) -> TypedAgent:
    assert rec.endpoint.socket_path
    agent = TypedAgent(socket_path=rec.endpoint.socket_path, token=spec.agent_token)
    await agent.wait_ready(15)
    return agent


async def test_lifecycle(backend: AnyBackend, harness: Harness, busybox_image: str) -> None:
    spec = make_spec(busybox_image, labels={"team": "a"})
    rec = await backend.create(spec)
    assert (rec.id, rec.owner, rec.image, rec.state) == (spec.id, "alice", busybox_image, "running")
    assert rec.labels == {"team": "a"} and rec.network == NetworkPolicy()
    assert rec.endpoint.socket_path == str(
        harness.state_dir / "sandboxes" / spec.id / "agent.sock"  # pinned: agent_socket.py
    )
    async with await ready(rec, spec) as agent:
        assert (await agent.health())["pid"] == 1  # the agent is PID 1 in its own namespace
        res = await agent.exec("echo hi; ls /sys/class/net")
        assert (res.exit_code, res.stdout) == (0, "hi\nlo\n")  # egress none: loopback only
    assert await backend.get(spec.id) == rec
    assert [r for r in await backend.list() if r.id == spec.id] == [rec]

    await backend.delete(spec.id)
    assert await backend.get(spec.id) is None
    assert harness.leftovers(spec.id) == []
    await backend.delete(spec.id)  # deleting what is gone is fine
    await backend.delete("../not-an-id")


async def test_planted_socket_symlink_is_never_followed(
    backend: AnyBackend, harness: Harness, busybox_image: str, tmp_path: Any
) -> None:
    """Root in the sandbox swaps its agent socket for a symlink to a host socket (here a
    decoy server of the test's own): the service keeps talking to the real agent only."""
    decoy_path = tmp_path / "decoy.sock"
    hits: list[bytes] = []

    async def on_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hits.append(await reader.read(100))
        writer.close()

    decoy = await asyncio.start_unix_server(on_conn, path=str(decoy_path))
    spec = make_spec(busybox_image)
    try:
        rec = await backend.create(spec)
        async with await ready(rec, spec) as agent:
            res = await agent.exec(
                f"rm /.orchard/run/agent.sock && ln -s {decoy_path} /.orchard/run/agent.sock"
            )
            assert res.exit_code == 0, res.stderr
        rebuilt = await backend.get(spec.id)
        assert rebuilt is not None and rebuilt.endpoint == rec.endpoint
        async with await ready(rebuilt, spec) as agent:
            assert (await agent.exec("echo still-the-agent")).stdout == "still-the-agent\n"
        assert hits == []
    finally:
        decoy.close()
        await backend.delete(spec.id)


async def test_restart_rebuilds_records_and_limits_hold(
    backend: AnyBackend, harness: Harness, busybox_image: str
) -> None:
    spec = make_spec(
        busybox_image,
        cpu=0.5,
        memory_bytes=32 << 20,
        pids_limit=32,
        idle_timeout_s=30.0,
        user="1000",
        labels={"task": "x-1", "run": "7"},
    )
    rec = await backend.create(spec)
    assert (rec.cpu, rec.memory_bytes, rec.pids_limit) == (0.5, 32 << 20, 32)
    assert (rec.default_user, rec.idle_timeout_s) == ("1000", 30.0)

    restarted = harness.make()  # a service restart
    try:
        assert await restarted.get(spec.id) == rec
        assert [r for r in await restarted.list() if r.id == spec.id] == [rec]
    finally:
        await restarted.close()

    async with await ready(rec, spec) as agent:
        # no-new-privileges still lets the root agent drop to another uid; 1000 is the default.
        assert (await agent.exec("id -u")).stdout.strip() == "1000"
        assert (await agent.exec("id -u", user="0")).stdout.strip() == "0"
        status = (await agent.exec("cat /proc/1/status")).stdout
        cap_bnd = next(
            int(ln.split()[1], 16) for ln in status.splitlines() if ln.startswith("CapBnd")
        )
        assert not cap_bnd & (1 << CAP_NET_RAW)
        res = await agent.exec("cat /proc/sys/net/ipv6/conf/all/disable_ipv6")
        assert res.stdout.strip() in ("1", "")  # "" when the kernel has no IPv6 at all
        # Memory: a 48 MiB buffer in a 32 MiB sandbox is killed by the OOM killer.
        oom = await agent.exec("dd if=/dev/zero of=/dev/null bs=48M count=1", timeout_s=20)
        assert oom.exit_code == 137, oom
        # Pids: 100 sleepers cannot all start under a limit of 32 (+ the agent's reserve).
        forks = await agent.exec("for i in $(seq 100); do sleep 30 & done", timeout_s=20)
        assert "fork" in forks.stderr.lower(), forks


async def test_image_config_and_cmd(backend: AnyBackend, derived_image: str) -> None:
    own = make_spec(derived_image, cmd=[])  # the image's own CMD, under the agent
    bare = make_spec(derived_image, env={"GREETING": "override"}, workdir="/tmp")  # no child
    custom = make_spec(derived_image, cmd=["sh", "-c", "echo custom > /tmp/cmd-ran; sleep 600"])
    recs = [await backend.create(s) for s in (own, bare, custom)]
    assert recs[0].default_user == "1000:1000"  # the image's USER, for the service's execs

    async with await ready(recs[0], own) as agent:
        res = await agent.exec(
            "for i in $(seq 100); do [ -s /tmp/cmd-ran ] && break; sleep 0.05; done; "
            "cat /tmp/cmd-ran; pwd; echo $GREETING"
        )
        assert res.stdout.split() == ["hello-from-image", "/srv/app", "hello-from-image"]
        environ = await agent.exec("cat /proc/$(pidof sleep)/environ | tr '\\0' '\\n'")
        assert "GREETING=hello-from-image" in environ.stdout
        assert "ORCHARD_AGENT" not in environ.stdout  # the token reaches the agent only
        users = await agent.exec("id -u; stat -c %u /proc/$(pidof sleep) /proc/1")
        assert users.stdout.split() == ["1000", "1000", "0"]

    async with await ready(recs[1], bare) as agent:
        res = await agent.exec("pwd; echo $GREETING; ls /tmp/cmd-ran; pidof sleep")
        assert res.stdout.split() == ["/tmp", "override"] and res.exit_code != 0

    async with await ready(recs[2], custom) as agent:
        res = await agent.exec(
            "for i in $(seq 100); do [ -s /tmp/cmd-ran ] && break; sleep 0.05; done; "
            "cat /tmp/cmd-ran"
        )
        assert res.stdout == "custom\n"


async def test_expiry_and_network_persist(
    backend: AnyBackend, harness: Harness, busybox_image: str, web_target: str
) -> None:
    spec = make_spec(busybox_image)
    rec = await backend.create(spec)
    new_expiry = rec.expires_at + 3600
    assert (await backend.set_expiry(spec.id, new_expiry)).expires_at == new_expiry
    fetch = f"wget -q -O - http://{web_target}:8080/"

    async with await ready(rec, spec) as agent:
        assert (await agent.exec(fetch, timeout_s=3)).exit_code != 0
        updated = await backend.set_network(spec.id, NetworkPolicy(egress="all"))
        assert updated.network.egress == "all"
        # `all` reaches out through NAT (nothing outside answers here); other Docker networks
        # stay closed to Docker sandboxes, so the target is reached with an allow-list below.
        routes = await agent.exec("ls /sys/class/net; ip route")
        assert "eth0" in routes.stdout.split() and "default via" in routes.stdout

        restarted = harness.make()
        try:
            seen = await restarted.get(spec.id)
            assert seen is not None and (seen.expires_at, seen.network.egress) == (
                new_expiry,
                "all",
            )
            policy = NetworkPolicy(egress="allow", allow=["192.0.2.1/32"])
            await restarted.set_network(spec.id, policy)
            assert (await agent.exec(fetch, timeout_s=3)).exit_code != 0
            rules = await harness.firewall(restarted).chain_rules(spec.id)
            assert "169.254.0.0/16" in rules[1] and rules[1].endswith("-j DROP")  # first
            await restarted.set_network(spec.id, NetworkPolicy(egress="allow", allow=[web_target]))
            assert (await agent.exec(fetch, timeout_s=5)).stdout == "target\n"
            back = await restarted.set_network(spec.id, NetworkPolicy())
            assert back.network.egress == "none"
            assert await harness.firewall(restarted).chain_rules(spec.id) == []
        finally:
            await restarted.close()
        assert (await agent.exec("ls /sys/class/net")).stdout.split() == ["lo"]
    seen = await backend.get(spec.id)
    assert seen is not None and seen.network.egress == "none"
    with pytest.raises(NotFound):
        await backend.set_expiry("c-no-such-sandbox", new_expiry)


async def test_bad_requests_and_conflicts(
    backend: AnyBackend, harness: Harness, busybox_image: str
) -> None:
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
    assert [p.name for p in (harness.state_dir / "sandboxes").iterdir()] == [spec.id]


async def test_exited_sandbox_is_listed_with_its_code(
    backend: AnyBackend, harness: Harness, busybox_image: str
) -> None:
    spec = make_spec(busybox_image)
    await backend.create(spec)
    harness.kill(spec.id)
    for _ in range(100):  # the local backend learns it through a pidfd, asynchronously
        got = await backend.get(spec.id)
        if got is not None and got.state == "exited":
            break
        await asyncio.sleep(0.05)
    assert got is not None and (got.state, got.exit_code) == ("exited", 137)
    listed = {r.id: r for r in await backend.list()}
    assert (listed[spec.id].state, listed[spec.id].exit_code) == ("exited", 137)
    await backend.delete(spec.id)
    assert harness.leftovers(spec.id) == []


def test_sdk_through_the_service(harness: Harness, busybox_image: str) -> None:
    """The whole stack (service, REST, SDK) on this backend: create, exec, files, delete."""
    config = ServiceConfig(
        state_dir=harness.state_dir,
        backend=harness.name,
        agent_binary=str(harness.agent_binary),
        extra_labels={"orchard.test": "1"},
        local_runtime=harness.runtime,
    )
    with (
        EmbeddedService(config, delete_on_close=True) as svc,
        Orchard(f"unix://{svc.socket_path}") as client,
    ):
        assert client.health().backend == harness.name
        with client.sandboxes.create(busybox_image, labels={"k": "v"}) as sb:
            assert sb.exec("echo $((6 * 7))").stdout == "42\n"
            sb.files.write("/tmp/x.txt", b"contract")
            assert sb.files.read("/tmp/x.txt") == b"contract"
            assert [s.id for s in client.sandboxes.list(labels={"k": "v"})] == [sb.id]
            sid = sb.id
        assert harness.leftovers(sid) == []
