"""Hole 1 of issue 17: an allow-list must never reach another tenant's sandbox.

The per-sandbox chain used to ACCEPT the allowed CIDRs before anything kept sandboxes
apart, so `allow: ["0.0.0.0/0"]` (or the sandbox subnet, or another sandbox's /32) was
looser than `all` and reached every other sandbox. Now every sandbox network of either
backend (and the operator's `protect` ranges) is dropped before any allow rule: a broad
entry is trimmed, and an entry that lies wholly inside a protected range, the host's own
addresses or loopback is refused with 422 `egress_denied`. On docker and local alike.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from pathlib import Path

import pytest

from orchard.env.backends.docker.backend import DockerBackend
from orchard.env.backends.local.backend import LocalBackend
from orchard.env.backends.network import (
    DEFAULT_SUBNET,
    LOCAL_SUBNET,
    METADATA_CIDRS,
    ResolvedAllow,
    host_addresses,
    sandbox_rules,
)
from orchard.env.errors import EgressDenied
from orchard.env.models import NetworkPolicy
from tests.agent_routes import TypedAgent
from tests.backends.backend_harness import TEST_LABELS, AnyBackend, Harness, owned
from tests.backends.test_backend_contract import make_spec
from tests.security.conftest import KEY_BOB, Service, assert_error, create
from tests.security.hardening.conftest import PORT, Box, MakeBox, web_cmd

pytestmark = pytest.mark.anyio


def host_fetch(ip: str, port: int = PORT, within_s: float = 15) -> str:
    """The page at ip:port fetched from the host itself (proves the server is up)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            with urllib.request.urlopen(f"http://{ip}:{port}/", timeout=1) as r:
                return str(r.read().decode().strip())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


# ---------------------------------------------------------------- the rules


def test_protected_ranges_are_dropped_before_any_allow_rule() -> None:
    allow = ResolvedAllow(("0.0.0.0/0",), names=True)
    protected = (DEFAULT_SUBNET, LOCAL_SUBNET, "10.96.0.0/12")
    rules = sandbox_rules("sb1", "allow", allow, ["192.0.2.53"], protected)
    n = len(METADATA_CIDRS)
    assert all("-j DROP" in r for r in rules[:n])  # metadata first, as before
    drops = [i for i, r in enumerate(rules) if any(f"-d {p} " in r for p in protected)]
    accept = next(i for i, r in enumerate(rules) if "-d 0.0.0.0/0" in r)
    assert len(drops) == 3 and max(drops) < accept
    assert all(rules[i].endswith("-j DROP") for i in drops)
    # DNS to the host's resolvers stays open (port 53 only), and `all` gets the drops too.
    assert all("--dport 53" in r for r in rules[n : min(drops)])
    everything = sandbox_rules("sb1", "all", ResolvedAllow((), False), [], protected)
    assert everything[n:] == [rules[i] for i in drops]


# ---------------------------------------------------------------- real traffic


async def test_allow_everything_reaches_no_other_sandbox(boxes: MakeBox, web_target: str) -> None:
    b = await boxes(network=NetworkPolicy(egress="all"), cmd=web_cmd("tenant-b"))
    b_ip = await b.ip()
    assert await asyncio.to_thread(host_fetch, b_ip) == "tenant-b"  # B serves

    wide = await boxes(network=NetworkPolicy(egress="allow", allow=["0.0.0.0/0"]))
    tens = await boxes(network=NetworkPolicy(egress="allow", allow=["10.0.0.0/8"]))
    got = await asyncio.gather(wide.fetch(b_ip), tens.fetch(b_ip))
    assert list(got) == [None, None]
    # Trimmed, not refused: the world (here a plain container) is still reachable.
    assert await wide.fetch(web_target, within_s=10) == "target"


async def test_allow_entries_inside_protected_ranges_are_refused(
    backend: AnyBackend, harness: Harness, boxes: MakeBox, busybox_image: str
) -> None:
    b = await boxes(network=NetworkPolicy(egress="all"))
    b_ip = await b.ip()
    a = await boxes(network=NetworkPolicy(egress="allow", allow=["192.0.2.1/32"]))
    host = next(h for h in host_addresses() if not h.startswith("127."))
    refused = [
        DEFAULT_SUBNET,
        "10.215.7.0/24",
        f"{b_ip}/32",
        b_ip,
        "127.0.0.1",
        "localhost",  # a name: every address it resolves to is checked
        "169.254.169.254",
        host,
    ]
    for entry in refused:
        policy = NetworkPolicy(egress="allow", allow=["198.51.100.0/24", entry])
        with pytest.raises(EgressDenied) as denied:
            await backend.create(make_spec(busybox_image, network=policy))
        assert denied.value.status == 422 and denied.value.code == "egress_denied"
        with pytest.raises(EgressDenied):
            await backend.set_network(a.rec.id, policy)  # PUT /network
    rec = await backend.get(a.rec.id)
    assert rec is not None and rec.network.allow == ["192.0.2.1/32"]  # unchanged
    rules = await harness.firewall(backend).chain_rules(a.rec.id)
    assert not any(b_ip in r for r in rules)
    assert len(await backend.list()) == 2  # the refused creates left nothing


async def test_no_sandbox_reaches_the_other_backends_sandboxes(
    tmp_state_dir: Path, agent_binary: Path, busybox_image: str, docker_ready: None
) -> None:
    """Both backends on one host: neither's allow-everything reaches the other's sandboxes."""
    wide = NetworkPolicy(egress="allow", allow=["0.0.0.0/0"])
    docker = DockerBackend(tmp_state_dir / "d", agent_binary, extra_labels=TEST_LABELS)
    local = LocalBackend(tmp_state_dir / "l", agent_binary, extra_labels=TEST_LABELS)
    async with owned(docker), owned(local):
        found: list[Box] = []
        for b in (docker, local):
            for policy, cmd in ((NetworkPolicy(egress="all"), web_cmd(b.name)), (wide, None)):
                spec = make_spec(busybox_image, network=policy, cmd=cmd)
                rec = await b.create(spec)
                assert rec.endpoint.socket_path
                agent = TypedAgent(socket_path=rec.endpoint.socket_path, token=spec.agent_token)
                await agent.wait_ready(15)
                found.append(Box(rec, spec, agent))
        d_web, d_wide, l_web, l_wide = found
        try:
            d_ip, l_ip = await d_web.ip(), await l_web.ip()
            assert await asyncio.to_thread(host_fetch, d_ip) == "docker"
            assert await asyncio.to_thread(host_fetch, l_ip) == "local"
            got = await asyncio.gather(
                d_wide.fetch(l_ip), l_wide.fetch(d_ip), d_wide.fetch(d_ip), l_wide.fetch(l_ip)
            )
            assert list(got) == [None] * 4
        finally:
            for box in found:
                await box.agent.aclose()


# ---------------------------------------------------------------- through the API


def test_rest_refuses_allow_lists_into_sandbox_networks(
    shared_service: Service, busybox_image: str
) -> None:
    with shared_service.client() as alice, shared_service.client(KEY_BOB) as bob:
        theirs = create(bob, busybox_image, network={"egress": "all"})["id"]
        ip = bob.post(f"/v1/sandboxes/{theirs}/exec", json={"cmd": "hostname -i"}).json()
        their_ip = ip["stdout"].split()[0]
        for allow in (["10.213.0.0/16"], [f"{their_ip}/32"]):
            body = {"image": busybox_image, "network": {"egress": "allow", "allow": allow}}
            assert_error(alice.post("/v1/sandboxes", json=body), 422, "egress_denied")
        mine = create(alice, busybox_image)["id"]
        put = {"egress": "allow", "allow": [f"{their_ip}/32"]}
        r = alice.put(f"/v1/sandboxes/{mine}/network", json=put)
        assert_error(r, 422, "egress_denied")
        assert alice.get(f"/v1/sandboxes/{mine}").json()["network"]["egress"] == "none"
        wide = {"egress": "allow", "allow": ["0.0.0.0/0"]}
        assert alice.put(f"/v1/sandboxes/{mine}/network", json=wide).status_code == 200
