"""Docker backend: one container per sandbox on the local engine (DOCKER_HOST honoured).

The agent binary is bind-mounted read-only and made the entrypoint; it runs as root (so
it can run execs as any user) and listens on a Unix socket in a per-sandbox host folder,
`<state_dir>/sockets/<id>/run/` (on a small tmpfs: host_folders.py), mounted at
/.orchard/run. The image's own entrypoint+cmd (or the spec's cmd) runs under it as a
supervised child. Its /etc files and volumes: mounts.py.

Containers carry everything needed to rebuild a record as labels, so a restarted service
rebuilds its view from `list()`. Labels are immutable, so what can change later (expiry,
network policy) is also kept in `<state_dir>/sandboxes/<id>/meta.json`, which is never
mounted into the sandbox and wins over the labels. Only plain Engine API calls are used,
so Podman's Docker-compatible API works too.

Container names are `orchard-<HMAC(key, id)>` under a key kept in the state folder: the
engine's DNS answers other containers on the network with a name (reverse lookups give
`<name>.orchard-egress`), so the name must not reveal the sandbox's id. Containers made
before were named `orchard-<id>`; they are still found by that name. Images are resolved
under `image_policy.ImagePolicy` (named images from allowed registries only), and no
engine, runtime or registry text reaches the caller (`failures.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import aiodocker
from aiodocker.exceptions import DockerError

from orchard.env.backends.base import AGENT_PIDS_RESERVE, BackendState, SandboxRecord, SandboxSpec
from orchard.env.backends.docker.images import DockerImages, ImageInfo, engine
from orchard.env.backends.docker.mounts import (
    docker_mounts,
    etc_binds,
    image_rootfs,
    log_config,
    write_etc,
)
from orchard.env.backends.docker.state import DockerState
from orchard.env.backends.host_folders import RUN_DIR, SOCKET_NAME, HostFolders
from orchard.env.backends.network import (
    DEFAULT_NETWORK,
    DEFAULT_SUBNET,
    EgressFirewall,
    ResolvedAllow,
    sandbox_tag,
)
from orchard.env.backends.pool_claim import PoolClaims, claimed
from orchard.env.backends.volume_base import decode_mounts, encode_mounts
from orchard.env.backends.volume_host import VolumeFolders
from orchard.env.config import load_secret
from orchard.env.errors import (
    Conflict,
    ImageNotFound,
    InvalidRequest,
    NotFound,
    SandboxExited,
    Unavailable,
)
from orchard.env.image_policy import ImagePolicy
from orchard.env.models import NetworkPolicy

log = logging.getLogger("orchard.docker")
_T = TypeVar("_T")

AGENT_PATH = "/.orchard/agent"
LABEL = "orchard."
USER_LABEL = "orchard.label."
DEFAULT_PIDS_LIMIT = 4096
# The key of container names (see the module docstring), in the state folder.
NAME_KEY_FILE = "docker-names.key"
# The engine refuses smaller memory limits (with a 400 that names its own minimum).
MIN_MEMORY_BYTES = 6 << 20
# How long a delete waits for a removal another call already began (docker answers 409).
REMOVAL_WAIT_S = 5.0
# From Docker's default set: NET_RAW (raw sockets could forge source addresses and slip past
# per-IP egress rules; ICMP echo still works through unprivileged ping sockets), MKNOD (device
# nodes), AUDIT_WRITE (host audit log), SETFCAP (granting file capabilities). SETUID/SETGID,
# CHOWN, DAC_OVERRIDE, FOWNER and KILL stay: the agent needs them to act as other users.
CAP_DROP = ("NET_RAW", "MKNOD", "AUDIT_WRITE", "SETFCAP")
_EXIT_RE = re.compile(r"Exited \((-?\d+)\)")


def _name(key: bytes, sandbox_id: str) -> str:
    return "orchard-" + hmac.new(key, sandbox_id.encode(), hashlib.sha256).hexdigest()[:24]


def container_name(state_dir: Path, sandbox_id: str) -> str:
    """The container name of a sandbox of the Docker backend over `state_dir`."""
    return _name(load_secret(Path(state_dir).resolve(), NAME_KEY_FILE), sandbox_id)


def _float(value: str | None) -> float | None:
    return float(value) if value else None


def _int(value: str | None) -> int | None:
    return int(value) if value else None


def _disk_support(info: Mapping[str, Any]) -> str:
    """ "" when the engine's storage driver takes `StorageOpt size`, else why it does not."""
    driver = str(info.get("Driver") or "")
    status = {str(k): str(v) for k, v in info.get("DriverStatus") or []}
    backing = status.get("Backing Filesystem", "")
    if driver in ("btrfs", "zfs", "devicemapper", "windowsfilter"):
        return ""
    if driver in ("overlay2", "overlay") and backing == "xfs":
        return ""  # needs the pquota mount option too; a create without it is refused
    return f"storage driver {driver or '?'} on {backing or '?'} has no per-container quota"


def _user_labels(labels: Mapping[str, str]) -> dict[str, str]:
    found = {k[len(USER_LABEL) :]: v for k, v in labels.items() if k.startswith(USER_LABEL)}
    if "orchard.label_keys" in labels:
        keys = set(json.loads(labels["orchard.label_keys"]))
        found = {k: v for k, v in found.items() if k in keys}
    return found


def _state(status: str) -> BackendState:
    if status == "created":
        return "pending"
    if status == "paused":
        return "paused"
    if status in ("running", "restarting"):
        return "running"
    if status == "dead":
        return "failed"
    return "exited"


class DockerBackend(DockerState, PoolClaims, HostFolders, VolumeFolders):
    """The Backend protocol on a Docker (or Podman) engine; see the module docstring."""

    name = "docker"

    def __init__(
        self,
        state_dir: Path,
        agent_binary: Path,
        *,
        docker_url: str | None = None,
        network_name: str = DEFAULT_NETWORK,
        subnet: str = DEFAULT_SUBNET,
        default_pids_limit: int = DEFAULT_PIDS_LIMIT,
        pull_timeout_s: float = 300.0,
        extra_labels: Mapping[str, str] | None = None,
        image_policy: ImagePolicy | None = None,
        protect: Iterable[str] = (),
        default_disk_bytes: int | None = None,
    ) -> None:
        self.state_dir = Path(state_dir).resolve()
        self.agent_binary = Path(agent_binary).resolve()
        if not self.agent_binary.is_file():
            raise ValueError(f"agent binary {self.agent_binary} does not exist (run `make agent`)")
        self.network_name = network_name
        self.default_pids_limit = default_pids_limit
        self.pull_timeout_s = pull_timeout_s
        self.extra_labels = dict(extra_labels or {})
        policy = image_policy or ImagePolicy()
        self.images = DockerImages(lambda: self.docker, policy, pull_timeout_s)
        self.default_disk_bytes = default_disk_bytes
        self.firewall = EgressFirewall(subnet, protect=protect)
        self._name_key = load_secret(self.state_dir, NAME_KEY_FILE)
        self._disk_support: str | None = None  # "" once known to work, else why not
        self._engine_info: dict[str, Any] | None = None
        self._docker_url = docker_url or os.environ.get("DOCKER_HOST") or None
        self._docker: aiodocker.Docker | None = None
        self._net_ready = False
        self._net_lock = asyncio.Lock()
        self._creating: set[str] = set()
        # Sandboxes get no IPv6 at all, so link-local addresses cannot reach host services.
        self._sysctls = (
            {"net.ipv6.conf.all.disable_ipv6": "1", "net.ipv6.conf.default.disable_ipv6": "1"}
            if Path("/proc/sys/net/ipv6").exists()
            else {}
        )
        (self.state_dir / "sandboxes").mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------ helpers

    @property
    def docker(self) -> aiodocker.Docker:
        # Created lazily: aiohttp wants a running event loop.
        if self._docker is None:
            self._docker = aiodocker.Docker(url=self._docker_url)
        return self._docker

    def _container_name(self, sandbox_id: str) -> str:
        return _name(self._name_key, sandbox_id)

    def _names(self, sandbox_id: str) -> tuple[str, str]:
        """Where a sandbox's container may be: its name, then the name of older versions."""
        return self._container_name(sandbox_id), f"orchard-{sandbox_id}"

    # ------------------------------------------------------------ network

    async def _ensure_network(self) -> None:
        """Create Orchard's bridge network (ICC off) and the host rules, once per process."""
        if self._net_ready:
            return
        async with self._net_lock:
            if self._net_ready:
                return
            async with engine(f"network {self.network_name}"):
                try:
                    info = await (await self.docker.networks.get(self.network_name)).show()
                except DockerError as e:
                    if e.status != 404:
                        raise
                    info = await self._create_network()
            configs = (info.get("IPAM") or {}).get("Config") or []
            subnet = next((c["Subnet"] for c in configs if ":" not in c.get("Subnet", ":")), None)
            if subnet is None:
                raise Unavailable(f"network {self.network_name} has no IPv4 subnet")
            if subnet != self.firewall.subnet:
                # The network already exists with another subnet: rules must match reality.
                log.warning("network %s uses subnet %s", self.network_name, subnet)
                self.firewall = EgressFirewall(subnet, protect=self.firewall.extra_protected)
            await self.firewall.ensure()
            self._net_ready = True

    async def _create_network(self) -> dict[str, Any]:
        config = {
            "Name": self.network_name,
            "Driver": "bridge",
            "CheckDuplicate": True,
            "EnableIPv6": False,
            "IPAM": {"Driver": "default", "Config": [{"Subnet": self.firewall.subnet}]},
            "Options": {"com.docker.network.bridge.enable_icc": "false"},
            "Labels": {"orchard.managed": "1"},
        }
        try:
            net = await self.docker.networks.create(config)
        except DockerError as e:
            if e.status != 409:
                raise
            net = await self.docker.networks.get(self.network_name)  # created concurrently
        return await net.show()

    async def _network_retry(self, call: Callable[[], Awaitable[_T]]) -> _T:
        """Run an engine call; if our network vanished (e.g. a `docker network prune`),
        make it again and retry once."""
        try:
            return await call()
        except DockerError as e:
            if not (e.status == 404 and self.network_name in str(e.message)):
                raise
            self._net_ready = False
            await self._ensure_network()
            return await call()

    def _ip(self, container: dict[str, Any]) -> str:
        nets = (container.get("NetworkSettings") or {}).get("Networks") or {}
        ip = str((nets.get(self.network_name) or {}).get("IPAddress") or "")
        if not ip:
            raise Unavailable(f"container {container.get('Name')} got no address")
        return ip

    async def _allow(self, policy: NetworkPolicy) -> ResolvedAllow:
        if policy.egress != "allow":
            return ResolvedAllow((), False)
        return await self.firewall.resolve(policy.allow)

    # ------------------------------------------------------------ create

    def _labels(
        self, spec: SandboxSpec, image: ImageInfo, created_at: float, pids: int
    ) -> dict[str, str]:
        labels = dict(self.extra_labels)
        labels.update(
            {
                "orchard.managed": "1",
                "orchard.sandbox": spec.id,
                "orchard.owner": spec.owner,
                "orchard.image": spec.image,
                "orchard.state_dir": str(self.state_dir),
                "orchard.created_at": repr(created_at),
                "orchard.expires_at": repr(float(spec.expires_at)),
                "orchard.idle_timeout_s": repr(spec.idle_timeout_s) if spec.idle_timeout_s else "",
                "orchard.network": spec.network.model_dump_json(),
                "orchard.cpu": repr(spec.cpu) if spec.cpu else "",
                "orchard.memory": str(spec.memory_bytes or ""),
                "orchard.pids": str(pids),
                "orchard.disk": str(self._disk_bytes(spec) or ""),
                "orchard.default_user": spec.user or image.user,
                # Always set: a snapshot's image carries its source's as an image label.
                "orchard.volumes": json.dumps(encode_mounts(spec.volumes)),
            }
        )
        labels.update({USER_LABEL + k: v for k, v in spec.labels.items()})
        # Which user labels are this sandbox's: one made from a snapshot inherits the
        # source's as image labels, and the engine cannot drop those.
        labels["orchard.label_keys"] = json.dumps(sorted(spec.labels))
        return labels

    def _config(self, spec: SandboxSpec, image: ImageInfo, labels: dict[str, str]) -> Any:
        child = image.entrypoint + image.cmd if spec.cmd == [] else list(spec.cmd or [])
        args = ["--socket", f"{RUN_DIR}/{SOCKET_NAME}"]
        if spec.cpu:  # the Go runtime's threads for Go code (GOMAXPROCS), rounded up
            args += ["--cpus", str(spec.cpu)]
        if labels["orchard.default_user"]:
            # The agent stays root (to switch users per request); the image's USER is the default.
            args += ["--user", labels["orchard.default_user"]]
        if child:
            args += ["--", *child]
        pids = int(labels["orchard.pids"])
        host: dict[str, Any] = {
            "Binds": [
                f"{self.agent_binary}:{AGENT_PATH}:ro",
                f"{self._run_dir(spec.id)}:{RUN_DIR}",
            ],
            "NetworkMode": "none" if spec.network.egress == "none" else self.network_name,
            "Init": False,  # the agent is PID 1 and reaps orphans itself
            "CapDrop": list(CAP_DROP),
            # Still lets the root agent drop to a lower uid for `user` execs (no gain on exec).
            "SecurityOpt": ["no-new-privileges"],
            "PidsLimit": pids + AGENT_PIDS_RESERVE,
            "Sysctls": self._sysctls,
        }
        if spec.cpu:
            host["NanoCpus"] = int(spec.cpu * 1e9)
        if spec.memory_bytes:
            host["Memory"] = spec.memory_bytes
            host["MemorySwap"] = spec.memory_bytes  # no swap beyond the limit
        if labels["orchard.disk"]:
            host["StorageOpt"] = {"size": labels["orchard.disk"]}
        logs = log_config(str((self._engine_info or {}).get("LoggingDriver") or ""))
        if logs is not None:  # the engine's log file is on the host: capped (mounts.py)
            host["LogConfig"] = logs
        env = [f"{k}={v}" for k, v in spec.env.items()]
        env.append(f"ORCHARD_AGENT_TOKEN={spec.agent_token}")
        return {
            "Image": image.id,  # the id we inspected, so entrypoint/cmd/user match it
            "Entrypoint": [AGENT_PATH],
            "Cmd": args,
            "Env": env,  # the engine merges it over the image's env
            "WorkingDir": spec.workdir or "",  # empty: the image's own
            "User": "0",
            "Labels": labels,
            "HostConfig": host,
        }

    # ------------------------------------------------------------ disk

    def _disk_bytes(self, spec: SandboxSpec) -> int | None:
        """The disk limit this sandbox gets: asked for, else the default where enforceable."""
        if spec.disk_bytes:
            return spec.disk_bytes
        return self.default_disk_bytes if self._disk_support == "" else None

    async def _check_disk(self, spec: SandboxSpec) -> None:
        """Learn once whether the storage driver takes a size; refuse a limit it cannot keep."""
        if not (spec.disk_bytes or self.default_disk_bytes):
            return
        if self._disk_support is None:
            self._disk_support = _disk_support(await self._info())
            if self._disk_support:
                log.warning("disk limits are not enforced on docker: %s", self._disk_support)
        if spec.disk_bytes and self._disk_support:
            raise InvalidRequest(
                "this docker engine cannot limit a sandbox's disk (its storage driver has no "
                "per-container quota; see docs/backends.md)"
            )

    async def _info(self) -> dict[str, Any]:
        """The engine's `docker info`, asked once (its storage and logging drivers)."""
        if self._engine_info is None:
            async with engine("docker info"):
                self._engine_info = dict(await self.docker.system.info())
        return self._engine_info

    # ------------------------------------------------------------ create

    async def _mounts(self, spec: SandboxSpec, image: ImageInfo) -> list[dict[str, Any]]:
        """`HostConfig.Mounts`: the read-only /etc files, then the volumes where their
        targets lead in the image (volume_host.py, after the meta names them)."""
        binds = etc_binds(self._box(spec.id) / "etc")
        if spec.volumes:
            async with image_rootfs(self.docker, image.id, self.extra_labels) as rootfs:
                binds += await self.volume_binds(spec, rootfs)
        return docker_mounts(binds)

    async def create(self, spec: SandboxSpec) -> SandboxRecord:
        self._check_spec(spec)
        if spec.memory_bytes and spec.memory_bytes < MIN_MEMORY_BYTES:
            raise InvalidRequest("memory must be at least 6 MiB on the docker backend")
        await self._check_disk(spec)
        await self._info()
        egress = spec.network.egress
        allow = await self._allow(spec.network)
        image = await self._image_for(spec)
        if egress != "none":
            await self._ensure_network()
        box = self._box(spec.id)
        if box.exists() or spec.id in self._creating:
            raise Conflict(f"sandbox {spec.id} already exists")
        self._creating.add(spec.id)
        try:
            self._make_box(spec.id)  # and its socket folder on the tmpfs (host_folders.py)
            created_at = time.time()
            pids = spec.pids_limit or self.default_pids_limit
            labels = self._labels(spec, image, created_at, pids)
            self._write_meta(
                spec.id,
                {
                    "id": spec.id,
                    "owner": spec.owner,
                    "created_at": created_at,
                    "expires_at": spec.expires_at,
                    "network": spec.network.model_dump(),
                    "volumes": encode_mounts(spec.volumes),  # before mounting: volume_host.py
                },
            )
            config = self._config(spec, image, labels)
            config["HostConfig"]["Mounts"] = await self._mounts(spec, image)
            name = self._container_name(spec.id)
            async with engine(f"create sandbox {spec.id}"):
                try:
                    container = await self._network_retry(
                        lambda: self.docker.containers.create(config, name=name)
                    )
                except DockerError as e:
                    if e.status == 404 and "image" in str(e.message).lower():
                        self.images.forget(spec.image)  # it went away since we inspected it
                        raise ImageNotFound(f"image {spec.image!r} is gone") from e
                    raise
                # The engine's own hostname for it (Config.Hostname is left to the engine).
                write_etc(box / "etc", container.id[:12], None)
                await self._network_retry(container.start)
                if egress != "none":
                    ip = self._ip(await container.show())
                    write_etc(box / "etc", None, ip)
                    await self.firewall.apply(spec.id, ip, egress, allow)
            await self._pin_socket(spec.id)
        except BaseException:
            with contextlib.suppress(Exception):
                await self.delete(spec.id)
            raise
        finally:
            self._creating.discard(spec.id)
        return self._record(labels, "running", None, None, None)

    # ------------------------------------------------------------ records

    def _record(
        self,
        labels: Mapping[str, str],
        state: BackendState,
        exit_code: int | None,
        error: str | None,
        meta: dict[str, Any] | None,
    ) -> SandboxRecord:
        sid = labels["orchard.sandbox"]
        if state == "running":
            self._repin(sid)  # a create cut short before pinning (adoption)
        network = NetworkPolicy.model_validate_json(labels.get("orchard.network") or "{}")
        expires_at = float(labels.get("orchard.expires_at") or 0)
        if meta:
            expires_at = float(meta.get("expires_at", expires_at))
            if "network" in meta:
                network = NetworkPolicy.model_validate(meta["network"])
        rec = SandboxRecord(
            id=sid,
            owner=labels.get("orchard.owner", ""),
            image=labels.get("orchard.image", ""),
            state=state,
            created_at=float(labels.get("orchard.created_at") or 0),
            expires_at=expires_at,
            endpoint=self._endpoint(sid),
            idle_timeout_s=_float(labels.get("orchard.idle_timeout_s")),
            network=network,
            labels=_user_labels(labels),
            cpu=_float(labels.get("orchard.cpu")),
            memory_bytes=_int(labels.get("orchard.memory")),
            pids_limit=_int(labels.get("orchard.pids")),
            disk_bytes=_int(labels.get("orchard.disk")),
            exit_code=exit_code,
            error=error,
            default_user=labels.get("orchard.default_user") or None,
            volumes=decode_mounts(labels.get("orchard.volumes")),
        )
        return claimed(rec, meta)  # a warm-pool sandbox's claim (pool_claim.py)

    def _ours(self, labels: Mapping[str, str] | None) -> bool:
        return bool(
            labels
            and labels.get("orchard.managed") == "1"
            and labels.get("orchard.state_dir") == str(self.state_dir)
            and "orchard.sandbox" in labels
        )

    def _from_inspect(self, data: dict[str, Any]) -> SandboxRecord | None:
        labels = (data.get("Config") or {}).get("Labels") or {}
        if not self._ours(labels):
            return None
        st = data.get("State") or {}
        state = _state(str(st.get("Status", "")))
        exit_code = int(st["ExitCode"]) if state == "exited" and "ExitCode" in st else None
        error = str(st.get("Error") or "") or ("out of memory" if st.get("OOMKilled") else None)
        return self._record(
            labels, state, exit_code, error, self._read_meta(labels["orchard.sandbox"])
        )

    async def _inspect(self, sandbox_id: str) -> dict[str, Any] | None:
        for name in self._names(sandbox_id):
            try:
                async with engine(f"inspect sandbox {sandbox_id}"):
                    container = await self.docker.containers.get(name)
            except NotFound:
                continue
            return dict(container._container)
        return None

    async def get(self, sandbox_id: str) -> SandboxRecord | None:
        data = await self._inspect(sandbox_id)
        return self._from_inspect(data) if data else None

    async def list(self) -> list[SandboxRecord]:
        filters = {"label": ["orchard.managed=1", f"orchard.state_dir={self.state_dir}"]}
        async with engine("list sandboxes"):
            containers = await self.docker.containers.list(all="1", filters=json.dumps(filters))
        records = []
        for c in containers:
            raw: dict[str, Any] = c._container
            labels = raw.get("Labels") or {}
            if not self._ours(labels):
                continue
            state = _state(str(raw.get("State", "")))
            exit_code = None
            if state == "exited" and (m := _EXIT_RE.search(str(raw.get("Status", "")))):
                exit_code = int(m.group(1))
            meta = self._read_meta(labels["orchard.sandbox"])
            records.append(self._record(labels, state, exit_code, None, meta))
        return records

    # ------------------------------------------------------------ updates

    async def _require(self, sandbox_id: str) -> tuple[dict[str, Any], SandboxRecord]:
        data = await self._inspect(sandbox_id)
        rec = self._from_inspect(data) if data else None
        if data is None or rec is None:
            raise NotFound(f"sandbox {sandbox_id} not found")
        return data, rec

    async def set_expiry(self, sandbox_id: str, expires_at: float) -> SandboxRecord:
        _, rec = await self._require(sandbox_id)
        self._update_meta(sandbox_id, expires_at=float(expires_at))
        rec.expires_at = float(expires_at)
        return rec

    async def set_network(self, sandbox_id: str, policy: NetworkPolicy) -> SandboxRecord:
        data, rec = await self._require(sandbox_id)
        if rec.state != "running":
            raise SandboxExited(
                f"sandbox {sandbox_id} is not running", details={"state": rec.state}
            )
        allow = await self._allow(policy)
        previous = rec.network
        attached = ((data.get("NetworkSettings") or {}).get("Networks") or {}).keys()
        cid = str(data["Id"])
        # Recorded first, so a crash half-way still leaves delete() knowing there are rules.
        self._update_meta(sandbox_id, network=policy.model_dump())
        try:
            async with engine(f"network of sandbox {sandbox_id}"):
                if policy.egress == "none":
                    await self.firewall.remove(sandbox_id)
                    if self.network_name in attached:
                        net = await self.docker.networks.get(self.network_name)
                        await net.disconnect({"Container": cid, "Force": True})
                    write_etc(self._box(sandbox_id) / "etc", None, None)
                else:
                    await self._ensure_network()
                    if self.network_name not in attached:
                        if "none" in attached:
                            none = await self.docker.networks.get("none")
                            await none.disconnect({"Container": cid, "Force": True})
                        net = await self.docker.networks.get(self.network_name)
                        # Until apply() below, ORCHARD-EGRESS drops everything from it.
                        await net.connect({"Container": cid})
                        data = (await self.docker.containers.get(cid))._container
                    ip = self._ip(data)
                    write_etc(self._box(sandbox_id) / "etc", None, ip)
                    await self.firewall.apply(sandbox_id, ip, policy.egress, allow)
        except BaseException:
            self._update_meta(sandbox_id, network=previous.model_dump())
            raise
        rec.network = policy
        return rec

    # ------------------------------------------------------------ delete

    async def delete(self, sandbox_id: str) -> None:
        try:
            sandbox_tag(sandbox_id)
        except InvalidRequest:
            return  # no sandbox can have such an id
        for name in self._names(sandbox_id):
            try:
                async with engine(f"delete sandbox {sandbox_id}"):
                    await self.docker.containers.container(name).delete(force=True, v=True)
            except NotFound:
                continue  # gone already, or made by an older version under its old name
            except Conflict:  # its removal is already in progress (a cancelled create's undo)
                await self._wait_removed(name)
            break
        meta = self._read_meta(sandbox_id)
        had_rules = meta is None or (meta.get("network") or {}).get("egress", "none") != "none"
        if had_rules and shutil.which("iptables"):
            await self.firewall.remove(sandbox_id)
        self._remove_box(sandbox_id)

    async def _wait_removed(self, name: str) -> None:
        """Return once another call's removal of a container is over, so that a delete that
        returns means gone (a stopping service closes the engine connection next)."""
        deadline = time.monotonic() + REMOVAL_WAIT_S
        while time.monotonic() < deadline:
            try:
                async with engine(f"inspect {name}"):
                    await self.docker.containers.container(name).show()
            except NotFound:
                return
            await asyncio.sleep(0.05)
        log.warning("container %s still being removed after %g s", name, REMOVAL_WAIT_S)

    async def _runtime_gone(self, sandbox_id: str) -> bool:
        return await self._inspect(sandbox_id) is None

    async def close(self) -> None:
        if self._docker is not None:
            await self._docker.close()
            self._docker = None
        self._release_sockets()  # its tmpfs, once no sandbox is left on it
