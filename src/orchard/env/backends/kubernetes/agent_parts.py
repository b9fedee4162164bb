"""The agent delivered to pods in ConfigMaps, so a sandbox pod needs no init container.

An init container (the injector image) used to copy the agent into each pod: one more
container to create, start, wait out and delete per sandbox, which on the trial node cost
as much as the sandbox's own container (docs/kubernetes.md, "Against the kubelet"). Now
the service stores the agent once per namespace, in ConfigMaps of at most `PART_BYTES`
each (the API server refuses one over 1 MiB), beside one more holding the loader
(agent/boot/boot.c: static C, small enough for one ConfigMap). The pod projects them all
read-only into `/.orchard/bin` and runs the loader, which joins the parts into a sealed
memfd and execs the agent: the agent is never on a path the sandbox can write.

The names carry a digest of both binaries, so a rollout's pods keep the agent they started
with, and two replicas of one version write the same objects (an existing one is taken as
it is: its content is fixed by its name).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import hashlib
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from lightkube import KubeConfig, codecs

from orchard.env.backends.binaries import locate_agent_binary, locate_binary
from orchard.env.backends.kubernetes.host import ClusterHost
from orchard.env.backends.kubernetes.objects import L_INSTANCE, KubernetesOptions
from orchard.env.backends.kubernetes.policies import never_reached
from orchard.env.errors import Conflict

PART_BYTES = 1_000_000
BOOT_NAME = "orchard-boot"
VOLUME = "orchard-agent-bin"
L_AGENT = "orchard.dev/agent"  # the digest, on each ConfigMap


@dataclass(frozen=True)
class AgentParts:
    """The agent cut into ConfigMap-sized parts, and the loader that joins them."""

    digest: str
    size: int
    parts: tuple[bytes, ...]
    boot: bytes

    @classmethod
    def from_bytes(cls, agent: bytes, boot: bytes) -> AgentParts:
        if not agent or not boot:
            raise ValueError("the agent and its loader must not be empty")
        if len(boot) > PART_BYTES:
            raise ValueError(f"the agent's loader is {len(boot)} bytes, over {PART_BYTES}")
        h = hashlib.sha256(agent)
        h.update(boot)
        parts = tuple(agent[i : i + PART_BYTES] for i in range(0, len(agent), PART_BYTES))
        return cls(h.hexdigest()[:12], len(agent), parts, boot)

    def name(self, part: int | None) -> str:
        """ConfigMap names: `orchard-agent-<digest>-<i>`, and `-boot` for the loader."""
        return f"orchard-agent-{self.digest}-{'boot' if part is None else part}"

    def configmaps(self, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        """One ConfigMap per part and one for the loader, each under the key `part`, then the
        marker (`orchard-agent-<digest>`, no data), made last: it exists once all the rest
        do. All immutable, so the kubelet reads each once instead of watching it."""
        blobs: list[tuple[int | None, bytes]] = [(None, self.boot), *enumerate(self.parts)]
        meta = {"namespace": namespace, "labels": {**labels, L_AGENT: self.digest}}
        maps: list[dict[str, Any]] = [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": self.name(i), **meta},
                "immutable": True,
                "binaryData": {"part": base64.b64encode(blob).decode()},
            }
            for i, blob in blobs
        ]
        marker = {"name": f"orchard-agent-{self.digest}", **meta}
        return [
            *maps,
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": marker, "immutable": True},
        ]

    def volume(self) -> dict[str, Any]:
        """The pod's volume: every part and the loader, in one read-only folder."""
        sources: list[dict[str, Any]] = [
            {
                "configMap": {
                    "name": self.name(None),
                    "items": [{"key": "part", "path": BOOT_NAME, "mode": 0o555}],
                }
            }
        ]
        sources += [
            {"configMap": {"name": self.name(i), "items": [{"key": "part", "path": f"agent.{i}"}]}}
            for i in range(len(self.parts))
        ]
        return {"name": VOLUME, "projected": {"defaultMode": 0o444, "sources": sources}}

    def command(self, bin_dir: str, own_dir: str) -> list[str]:
        """The main container's command: the loader, ending in the agent's argv[0] (the
        container's args are the agent's)."""
        return [f"{bin_dir}/{BOOT_NAME}", str(self.size), f"{bin_dir}/agent.", own_dir, "--",
                "orchard-agent"]  # fmt: skip


@functools.cache
def _load(agent: Path, boot: Path) -> AgentParts:
    return AgentParts.from_bytes(agent.read_bytes(), boot.read_bytes())


def load() -> AgentParts:
    """The agent and loader this service would run (`make agent` builds both), read once."""
    return _load(locate_agent_binary(), locate_binary(BOOT_NAME, "ORCHARD_BOOT_BINARY"))


class AgentConfigMaps:
    """A backend's agent ConfigMaps: made once per namespace and replica. A dry-run create
    of the marker, which is made last, tells whether they are all there (one small request,
    not 8 MB of parts sent to be refused); one that exists already is the same (its name is
    its content's digest)."""

    def __init__(self, host: ClusterHost, parts: AgentParts) -> None:
        self.host = host
        self.parts = parts
        self._ready: set[str] = set()
        self._locks: dict[str, asyncio.Lock] = {}

    @classmethod
    def of(cls, host: ClusterHost, options: KubernetesOptions) -> AgentConfigMaps | None:
        """None where the agent comes by init container (`agent_delivery=init`)."""
        if options.agent_delivery != "configmap":
            return None
        try:
            return cls(host, load())
        except FileNotFoundError as e:
            raise FileNotFoundError(
                f"{e}; or deliver the agent by init container (ORCHARD_K8S_AGENT_DELIVERY=init)"
            ) from None

    def forget(self, ns: str) -> None:
        """Made again on the next create there (the namespace was deleted)."""
        self._ready.discard(ns)

    async def ensure(self, ns: str) -> None:
        if ns in self._ready:
            return
        async with self._locks.setdefault(ns, asyncio.Lock()):
            if ns in self._ready:
                return
            opts = self.host.opts
            *maps, marker = self.parts.configmaps(
                ns, {**opts.extra_labels, L_INSTANCE: opts.instance}
            )
            if await self._create_absent(marker, dry_run=True):
                await asyncio.gather(*(self._create_absent(b) for b in maps))
                await self._create_absent(marker)
            self._ready.add(ns)

    async def _create_absent(self, body: dict[str, Any], dry_run: bool = False) -> bool:
        """Create `body`; False if it exists already."""
        obj, name = codecs.from_dict(body), body["metadata"]["name"]
        ns, client = body["metadata"]["namespace"], self.host.client
        with contextlib.suppress(Conflict):
            await self.host._call(
                f"create {name} in {ns}", lambda: client.create(obj, dry_run=dry_run)
            )
            return True
        return False


def api_server(options: KubernetesOptions) -> str | None:
    """The API server's URL as this service reaches it (in-cluster or a kubeconfig)."""
    if options.egress_canary != "auto":
        return None
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if host and not options.kubeconfig:
        return f"https://{'[' + host + ']' if ':' in host else host}:{port}"
    try:
        path = options.kubeconfig
        config = KubeConfig.from_file(path) if path else KubeConfig.from_env()
        single = config.get()
        return str(single.cluster.server) if single is not None else None
    except Exception:  # no config here: the client says so on its first call
        return None


def egress_canary(opts: KubernetesOptions, api_server: str | None) -> str:
    """`auto` resolved: the API server's `host:port` (from `https://host:port`), if its
    address is one no sandbox may reach; else `off`."""
    if opts.egress_canary != "auto":
        return opts.egress_canary
    url = urlsplit(api_server or "")
    try:
        ip = ipaddress.ip_address(url.hostname or "")
    except ValueError:
        return "off"  # a name: what it resolves to is not known here
    if not any(ip in net for net in never_reached(opts)):
        return "off"
    host = f"[{ip}]" if ip.version == 6 else str(ip)
    return f"{host}:{url.port or 443}"
