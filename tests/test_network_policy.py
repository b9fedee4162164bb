"""Egress enforcement: the rule builder, name resolution, and real traffic from sandboxes.

Targets are this test's own containers (on a test bridge network) and a TCP server on the
host; nothing else is contacted.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import socket
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from orchard.env.backends.base import SandboxSpec
from orchard.env.backends.docker.backend import DockerBackend
from orchard.env.backends.network import (
    METADATA_CIDRS,
    ResolvedAllow,
    chain_name,
    resolve_allow,
    sandbox_rules,
)
from orchard.env.errors import InvalidRequest, Unavailable
from orchard.env.models import NetworkPolicy
from tests.agent_routes import TypedAgent
from tests.backends.backend_harness import TEST_LABELS, owned
from tests.docker_util import container_of

TARGET_NET = "orchard-test-targets"
PORT = 8080

# ---------------------------------------------------------------- pure parts


def test_sandbox_rules_drop_metadata_first_and_default_deny() -> None:
    allow = ResolvedAllow(("10.1.0.0/16", "192.0.2.7/32"), names=False)
    rules = sandbox_rules("sb1", "allow", allow, ["192.0.2.53"])
    n = len(METADATA_CIDRS)
    assert [r.split()[1] for r in rules[:n]] == list(METADATA_CIDRS)
    assert all(r.endswith("-j DROP") for r in rules[:n])
    assert rules[n:-1] == [
        "-d 10.1.0.0/16 -m comment --comment orchard:sb1 -j ACCEPT",
        "-d 192.0.2.7/32 -m comment --comment orchard:sb1 -j ACCEPT",
    ]  # no DNS without names: it would only be an exfiltration channel
    assert rules[-1] == "-m comment --comment orchard:sb1 -j DROP"

    with_names = sandbox_rules("sb1", "allow", ResolvedAllow((), names=True), ["192.0.2.53"])
    assert "-d 192.0.2.53/32 -p udp --dport 53 -m comment --comment orchard:sb1 -j ACCEPT" in (
        with_names
    )
    # `all` only drops metadata, then falls back to Docker's own rules.
    assert sandbox_rules("sb1", "all", ResolvedAllow((), False), []) == rules[:n]
    with pytest.raises(InvalidRequest):
        sandbox_rules("bad id", "all", ResolvedAllow((), False), [])


def test_chain_names_fit_iptables() -> None:
    names = {chain_name(f"sandbox-{i}") for i in range(1000)}
    assert len(names) == 1000
    assert all(len(n) <= 28 for n in names)
    assert chain_name("x") == chain_name("x")


@pytest.mark.anyio
async def test_resolve_allow() -> None:
    got = await resolve_allow(["10.1.2.3", "10.0.0.0/8", "192.0.2.9/24", "localhost", "::1"])
    assert got.names
    assert got.cidrs[:3] == ("10.1.2.3/32", "10.0.0.0/8", "192.0.2.0/24")
    assert "127.0.0.1/32" in got.cidrs
    assert not any(":" in c for c in got.cidrs)  # sandboxes have no IPv6
    with pytest.raises(InvalidRequest):
        await resolve_allow(["not a host"])
    with pytest.raises((InvalidRequest, Unavailable)):  # NXDOMAIN, or no resolver at all
        await resolve_allow(["no-such-host.invalid"])


# ---------------------------------------------------------------- real traffic


@dataclass
class Targets:
    a: str  # IP of target A (answers "target-a")
    b: str


def _docker(*args: str) -> str:
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.fixture(scope="module")
def targets(busybox_image: str) -> Iterator[Targets]:
    """Two web servers in containers on their own bridge network."""
    subprocess.run(["docker", "network", "rm", TARGET_NET], capture_output=True, check=False)
    _docker("network", "create", "--label", "orchard.test=1", TARGET_NET)
    names = [f"orchard-test-target-{t}-{secrets.token_hex(3)}" for t in "ab"]
    try:
        for name, text in zip(names, ("target-a", "target-b"), strict=True):
            script = (
                f"mkdir -p /www && echo {text} > /www/index.html && exec httpd -f -p {PORT} -h /www"
            )
            _docker(
                "run", "-d", "--name", name, "--label", "orchard.test=1",
                "--network", TARGET_NET, busybox_image, "sh", "-c", script,
            )  # fmt: skip
        ips = [
            json.loads(_docker("inspect", n))[0]["NetworkSettings"]["Networks"][TARGET_NET][
                "IPAddress"
            ]
            for n in names
        ]
        yield Targets(*ips)
    finally:
        subprocess.run(["docker", "rm", "-f", *names], capture_output=True, check=False)
        subprocess.run(["docker", "network", "rm", TARGET_NET], capture_output=True, check=False)


@pytest.fixture
async def backend(
    docker_ready: None, tmp_state_dir: Path, agent_binary: Path
) -> AsyncIterator[DockerBackend]:
    async with owned(DockerBackend(tmp_state_dir, agent_binary, extra_labels=TEST_LABELS)) as b:
        yield b


@dataclass
class Box:
    id: str
    agent: TypedAgent

    async def fetch(self, host: str, port: int = PORT) -> str | None:
        """The page at host:port, or None if the sandbox cannot reach it within 2 s."""
        res = await self.agent.exec(f"wget -q -O - http://{host}:{port}/", timeout_s=2)
        return res.stdout.strip() if res.exit_code == 0 else None


@pytest.fixture
async def boxes(backend: DockerBackend, busybox_image: str) -> AsyncIterator[Any]:
    made: list[Box] = []

    async def make(policy: NetworkPolicy, cmd: list[str] | None = None) -> Box:
        spec = SandboxSpec(
            id="n" + secrets.token_hex(6),
            owner="net",
            image=busybox_image,
            agent_token=secrets.token_urlsafe(16),
            expires_at=time.time() + 600,
            network=policy,
            cmd=cmd,
        )
        rec = await backend.create(spec)
        assert rec.endpoint.socket_path
        agent = TypedAgent(socket_path=rec.endpoint.socket_path, token=spec.agent_token)
        await agent.wait_ready(15)
        made.append(Box(spec.id, agent))
        return made[-1]

    try:
        yield make
    finally:
        for box in made:
            await box.agent.aclose()


pytestmark = pytest.mark.anyio


async def test_none_has_only_loopback(boxes: Any, targets: Targets) -> None:
    box = await boxes(NetworkPolicy(egress="none"))
    assert await box.fetch(targets.a) is None
    links = (await box.agent.exec("ls /sys/class/net")).stdout.split()
    assert links == ["lo"]


async def test_allow_list(backend: DockerBackend, boxes: Any, targets: Targets) -> None:
    box = await boxes(NetworkPolicy(egress="allow", allow=[targets.a]))
    a, b = await asyncio.gather(box.fetch(targets.a), box.fetch(targets.b))
    assert (a, b) == ("target-a", None)
    rules = await backend.firewall.chain_rules(box.id)
    assert f"orchard:{box.id}" in rules[1]
    assert "169.254.0.0/16" in rules[1] and rules[1].endswith("-j DROP")  # metadata first
    assert rules[-1].endswith("-j DROP")


async def _both(box: Any, targets: Targets) -> list[str | None]:
    """What the box fetches from target a and from target b, side by side."""
    return list(await asyncio.gather(box.fetch(targets.a), box.fetch(targets.b)))


async def test_switch_policy_at_run_time(
    backend: DockerBackend, boxes: Any, targets: Targets
) -> None:
    box = await boxes(NetworkPolicy())
    assert await box.fetch(targets.a) is None

    await backend.set_network(box.id, NetworkPolicy(egress="allow", allow=[targets.a]))
    assert await _both(box, targets) == ["target-a", None]

    await backend.set_network(box.id, NetworkPolicy(egress="allow", allow=[f"{targets.b}/32"]))
    assert await _both(box, targets) == [None, "target-b"]

    await backend.set_network(box.id, NetworkPolicy(egress="none"))
    assert await box.fetch(targets.b) is None
    assert await backend.firewall.chain_rules(box.id) == []
    rec = await backend.get(box.id)
    assert rec is not None and rec.network.egress == "none"


def _host_addresses() -> list[str]:
    out = _docker("network", "inspect", "orchard-egress")
    gateway = json.loads(out)[0]["IPAM"]["Config"][0].get("Gateway", "")
    addrs = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    found = [line.split()[3].split("/")[0] for line in addrs.splitlines()]
    return sorted({a for a in [*found, gateway] if a and not a.startswith("127.")})


@pytest.fixture
def host_server() -> Iterator[int]:
    """A TCP server on the host, on all interfaces, answering a tiny HTTP response."""
    srv = socket.create_server(("0.0.0.0", 0))
    srv.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            with conn:
                conn.recv(4096)
                conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 7\r\n\r\nhost-ok")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield srv.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        srv.close()


def _host_fetch(host: str, port: int) -> bytes:
    with socket.create_connection((host, port), timeout=2) as s:
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        return s.recv(4096)


async def test_all_cannot_reach_metadata_host_or_other_sandboxes(
    backend: DockerBackend, boxes: Any, host_server: int
) -> None:
    web = await boxes(NetworkPolicy(egress="all"), cmd=["httpd", "-f", "-p", str(PORT), "-h", "/"])
    box = await boxes(NetworkPolicy(egress="all"))
    rules = await backend.firewall.chain_rules(box.id)
    assert rules[1].startswith("-A ORCHARD-SB-") and "-d 169.254.0.0/16" in rules[1]
    assert rules[1].endswith("-j DROP")

    hosts = _host_addresses()
    assert hosts, "the host has no address the sandbox could try"
    for host in hosts:  # the server is there, and reachable from the host itself
        assert _host_fetch(host, host_server).endswith(b"host-ok")
    web_ip = (await web.agent.exec("ip -4 -o addr show eth0")).stdout.split()[3].split("/")[0]
    assert "httpd" in (await web.agent.exec("ps")).stdout

    checks = [box.fetch(h, host_server) for h in hosts]
    checks.append(box.fetch("169.254.169.254", 80))
    checks.append(box.fetch(web_ip, PORT))  # ICC is off: sandboxes cannot reach each other
    assert await asyncio.gather(*checks) == [None] * len(checks)


async def test_own_network_is_made_and_remade(
    docker_ready: None, tmp_state_dir: Path, agent_binary: Path, busybox_image: str
) -> None:
    name = f"orchard-test-egress-{secrets.token_hex(3)}"
    subnet = f"10.214.{secrets.randbelow(256)}.0/24"
    b = DockerBackend(
        tmp_state_dir, agent_binary, network_name=name, subnet=subnet, extra_labels=TEST_LABELS
    )

    def spec() -> SandboxSpec:
        return SandboxSpec(
            id="o" + secrets.token_hex(6),
            owner="net",
            image=busybox_image,
            agent_token="t",
            expires_at=time.time() + 600,
            network=NetworkPolicy(egress="all"),
        )

    def hooks() -> list[str]:
        out = subprocess.run(["iptables", "-S"], capture_output=True, text=True, check=True).stdout
        return [ln for ln in out.splitlines() if f"orchard-base:{subnet}" in ln]

    try:
        first = await b.create(spec())
        net = json.loads(_docker("network", "inspect", name))[0]
        assert net["IPAM"]["Config"][0]["Subnet"] == subnet
        assert net["Options"]["com.docker.network.bridge.enable_icc"] == "false"
        assert len(hooks()) == 3  # replies accepted, egress chain, INPUT chain
        await b.delete(first.id)
        _docker("network", "rm", name)  # e.g. a `docker network prune`
        second = await b.create(spec())  # the network is made again
        ip = json.loads(_docker("inspect", container_of(second.id)))[0]["NetworkSettings"]
        assert ip["Networks"][name]["IPAddress"].startswith(subnet.rsplit(".", 1)[0] + ".")
    finally:
        for rec in await b.list():
            await b.delete(rec.id)
        await b.firewall.remove_hooks()
        await b.close()
        subprocess.run(["docker", "network", "rm", name], capture_output=True, check=False)
    assert hooks() == []
