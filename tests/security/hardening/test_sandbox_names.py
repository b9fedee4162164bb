"""Hole 10 (part) of issue 17: names on the sandbox network must not reveal sandbox ids.

The engine's DNS answered a reverse lookup of another sandbox's address with
`orchard-<id>.orchard-egress`. Containers are now named by an HMAC of the id under a key
in the state folder, so neither reverse nor forward lookups tell a sandbox anything about
its neighbours' ids; the local backend runs no DNS on its bridge at all.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from orchard.env.models import NetworkPolicy
from tests.backends.backend_harness import AnyBackend, Harness
from tests.docker_util import container_of
from tests.security.hardening.conftest import MakeBox

pytestmark = pytest.mark.anyio


async def test_neighbours_names_reveal_no_ids(
    backend: AnyBackend, harness: Harness, boxes: MakeBox
) -> None:
    everywhere = NetworkPolicy(egress="all")
    a, b = await boxes(network=everywhere), await boxes(network=everywhere)
    b_ip = await b.ip()
    _, reverse = await a.sh(f"nslookup {b_ip} 2>&1; true")
    _, forward = await a.sh(f"nslookup orchard-{b.rec.id} 2>&1; true")
    _, hosts = await a.sh("cat /etc/hosts /etc/hostname")
    for seen in (reverse, hosts):
        assert b.rec.id not in seen, seen
    assert b_ip not in forward  # the old name no longer resolves
    if harness.name == "docker":  # the engine answers with the keyed name
        data = json.loads(subprocess.check_output(["docker", "inspect", container_of(b.rec.id)]))
        name = data[0]["Name"].lstrip("/")
        assert b.rec.id not in name and name.startswith("orchard-") and len(name) == 32
        assert f"name = {name}." in reverse
