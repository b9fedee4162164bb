"""Local backend: an OCI runtime directly, no daemon in between, for density and create speed.

One sandbox = one OCI bundle in `<state_dir>/sandboxes/<id>/`:
- `rootfs/`: an overlayfs of the image's unpacked rootfs from the shared cache
  (`oci_images.ImageStore`) below, the sandbox's own `upper/` above (on a tmpfs of the
  sandbox's disk limit when it has one), mounted only in a private mount namespace that
  runc starts in (`mount_ns`), so the host's mount table does not grow per sandbox;
- `config.json` (`oci_spec.runtime_spec`): the agent bind-mounted read-only as the process,
  its socket folder `run/` mounted at /.orchard/run as with Docker, the image's env,
  workdir and user, cgroup limits, its own namespaces;
- `meta.json`: what Docker keeps in labels (owner, image, expiry, policy, limits, user
  labels), plus the init's pid and start time and, once known, its exit code.

`crun run --detach` or `runc run --detach` (Debian's, `--root <state_dir>/<runtime>`;
which one: `oci_runtime`) starts it; the runtime then exits,
so this process makes itself a child subreaper to inherit each sandbox's init and learn
its exit status (a pidfd per sandbox, no polling). After a crash of the service its
sandboxes keep running; the next backend over the same state folder finds them all from
the folders, re-adopts the living and removes the dead, leaving no cgroup, veth, rule or
folder behind (their mounts died with their namespaces). Exit statuses of sandboxes that
end while no service runs go to the host's init (which must reap orphans, as systemd does).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import logging
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchard.env.backends.base import AGENT_PIDS_RESERVE, BackendState, SandboxRecord, SandboxSpec
from orchard.env.backends.failures import hidden
from orchard.env.backends.host_folders import RUN_DIR, SOCKET_NAME, HostFolders
from orchard.env.backends.local import oci_runtime, spawn
from orchard.env.backends.local.criu import CONSOLE_LOG
from orchard.env.backends.local.mount_ns import (
    MOUNT_FAILED,
    RUNC_MOUNT_FAILED,
    RootfsMounts,
    umount,
)
from orchard.env.backends.local.net import LOCAL_BRIDGE, LocalNetwork
from orchard.env.backends.local.oci_images import ImageStore, LocalImage
from orchard.env.backends.local.oci_runtime import OciRuntime
from orchard.env.backends.local.oci_spec import SpecInput, merge_env, runtime_spec
from orchard.env.backends.local.runc_state import release_stopped, remove_cgroups
from orchard.env.backends.local.spawner import Spawner
from orchard.env.backends.local.state import SCRATCH_MOUNT, LocalState
from orchard.env.backends.network import LOCAL_SUBNET, ResolvedAllow, host_dns_servers, sandbox_tag
from orchard.env.backends.pool_claim import PoolClaims
from orchard.env.backends.runtimes import LEGACY_RUNTIME, checkpointing
from orchard.env.backends.volume_base import LayerView, decode_mounts, encode_mounts
from orchard.env.backends.volume_host import VolumeFolders
from orchard.env.errors import Conflict, InvalidRequest, NotFound, SandboxExited, Unavailable
from orchard.env.image_policy import ImagePolicy
from orchard.env.models import NetworkPolicy

log = logging.getLogger("orchard.local")

AGENT_PATH = "/.orchard/agent"
DEFAULT_PIDS_LIMIT = 4096
CGROUP_PARENT = "orchard"
RUNC_TIMEOUT_S = 60.0  # a runc call that takes longer is stuck (e.g. on a wedged mount)
# Folders without a started container younger than this may be a create in flight.
_PR_SET_CHILD_SUBREAPER = 36
_libc = ctypes.CDLL(None, use_errno=True)


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks (field 22 of /proc/<pid>/stat), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None  # a zombie is as dead as a sandbox gets
    return int(fields[19])


def _exit_code(info: Any) -> int | None:
    if info is None:
        return None
    if info.si_code == os.CLD_EXITED:
        return int(info.si_status)
    return 128 + int(info.si_status)  # killed by a signal, as a shell reports it


@dataclass
class _Watch:
    """The pidfd of one sandbox's init; `done` is set once it has exited."""

    pid: int
    fd: int
    done: asyncio.Event
    exit_code: int | None = None


class LocalBackend(LocalState, PoolClaims, HostFolders, VolumeFolders):
    """The Backend protocol on crun or runc; see the module docstring."""

    name = "local"

    def __init__(
        self,
        state_dir: Path,
        agent_binary: Path,
        *,
        runtime: str = "auto",
        subnet: str = LOCAL_SUBNET,
        bridge: str = LOCAL_BRIDGE,
        default_pids_limit: int = DEFAULT_PIDS_LIMIT,
        upper_size_bytes: int | None = None,
        use_docker_images: bool = True,
        pull_timeout_s: float = 300.0,
        extra_labels: Mapping[str, str] | None = None,
        image_policy: ImagePolicy | None = None,
        protect: Iterable[str] = (),
        default_disk_bytes: int | None = None,
    ) -> None:
        self.state_dir = Path(state_dir).resolve()
        if any(c in str(self.state_dir) for c in ",:"):
            raise ValueError(f"state dir {self.state_dir} must not contain ',' or ':' (overlay)")
        self.agent_binary = Path(agent_binary).resolve()
        if not self.agent_binary.is_file():
            raise ValueError(f"agent binary {self.agent_binary} does not exist (run `make agent`)")
        # Every installed runtime: a sandbox keeps the one it started under (its meta).
        self.runtimes = oci_runtime.installed(self.state_dir)
        self.runtime = oci_runtime.choose(runtime, self.runtimes)
        self.default_pids_limit = default_pids_limit
        # The disk limit of sandboxes that ask for none (`upper_size_bytes`: its old name).
        self.default_disk_bytes = default_disk_bytes or upper_size_bytes
        self.extra_labels = dict(extra_labels or {})
        self.images = ImageStore(
            self.state_dir / "images",
            use_docker=use_docker_images,
            pull_timeout_s=pull_timeout_s,
            policy=image_policy or ImagePolicy(),
        )
        self.network = LocalNetwork(subnet, bridge, protect)
        self._sysctl = (
            {"net.ipv6.conf.all.disable_ipv6": "1", "net.ipv6.conf.default.disable_ipv6": "1"}
            if Path("/proc/sys/net/ipv6").exists()
            else {}
        )
        self._watches: dict[str, _Watch] = {}
        # Forks the runtime's children that mount a rootfs first (spawner.py); started
        # on first use.
        self._spawner = Spawner()
        self._restore_ms: dict[str, float] = {}
        self._creating: set[str] = set()
        self._deleting: set[str] = set()  # their exit codes need no record: the folder goes
        self._recovered = False
        self._recover_lock = asyncio.Lock()
        (self.state_dir / "sandboxes").mkdir(parents=True, exist_ok=True)
        for rt in self.runtimes.values():
            rt.root.mkdir(parents=True, exist_ok=True)
        # The runtime exits right after starting a sandbox; its init is then ours to reap.
        _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)

    # ------------------------------------------------------------ paths and meta

    # ------------------------------------------------------------ the OCI runtime

    async def _oci(
        self,
        runtime: OciRuntime,
        *args: str,
        log_path: Path | None = None,
        preexec: Callable[[], None] | None = None,
    ) -> tuple[int, str]:
        """The runtime from its sealed copy (runc_exe), vforked (spawn) unless `preexec`:
        `run --detach` hands its stdio to the sandbox, so that goes to a file, never our
        pipes."""
        return await spawn.run(
            runtime.argv(*args),
            what=f"{runtime.name} {args[0]}",
            timeout_s=RUNC_TIMEOUT_S,
            log_path=log_path,
            preexec=preexec,
            spawner=self._spawner,
        )

    async def _runc(
        self,
        *args: str,
        log_path: Path | None = None,
        preexec: Callable[[], None] | None = None,
    ) -> tuple[int, str]:
        """The runtime that checkpoints (runc): memory snapshots (CRIU) are `runc
        checkpoint|restore`."""
        name = checkpointing().name
        runc = self.runtimes.get(name)
        if runc is None:
            raise Unavailable(f"memory snapshots need {name} on PATH (apt-get install {name})")
        return await self._oci(runc, *args, log_path=log_path, preexec=preexec)

    def _runtime_of(self, sandbox_id: str, meta: Mapping[str, Any] | None = None) -> OciRuntime:
        """The runtime a sandbox started under (sandboxes older than the field: runc)."""
        if meta is None:
            meta = self._read_meta(sandbox_id) or {}
        name = str(meta.get("runtime") or LEGACY_RUNTIME)
        runtime = self.runtimes.get(name)
        if runtime is None:
            raise Unavailable(f"sandbox {sandbox_id} runs under {name}, which is not on PATH")
        return runtime

    # ------------------------------------------------------------ init watching

    def _watch(self, sandbox_id: str, pid: int) -> _Watch | None:
        """Follow one sandbox's init through a pidfd; None if it is already gone."""
        old = self._watches.get(sandbox_id)
        if old is not None and old.pid == pid:
            return old
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return None
        watch = _Watch(pid, fd, asyncio.Event())
        self._watches[sandbox_id] = watch
        loop = asyncio.get_running_loop()
        loop.add_reader(fd, self._on_exit, sandbox_id, watch)
        return watch

    def _on_exit(self, sandbox_id: str, watch: _Watch) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(watch.fd)
        try:
            watch.exit_code = _exit_code(os.waitid(os.P_PIDFD, watch.fd, os.WEXITED | os.WNOHANG))
        except ChildProcessError:
            watch.exit_code = None  # not our child (adopted after a restart): code unknown
        os.close(watch.fd)
        watch.done.set()
        if sandbox_id in self._deleting:
            return
        if watch.exit_code is not None and self._box(sandbox_id).is_dir():
            with contextlib.suppress(OSError):
                self._update_meta(sandbox_id, exit_code=watch.exit_code)

    def _alive(self, sandbox_id: str, meta: Mapping[str, Any]) -> bool:
        watch = self._watches.get(sandbox_id)
        if watch is not None and watch.pid == meta.get("pid"):
            return not watch.done.is_set()
        pid, started = meta.get("pid"), meta.get("pid_start")
        return pid is not None and started is not None and _start_time(int(pid)) == started

    # ------------------------------------------------------------ recovery

    async def _recover(self) -> None:
        """Once per backend: adopt living sandboxes, remove those that died unobserved."""
        if self._recovered:
            return
        async with self._recover_lock:
            if self._recovered:
                return
            dead: list[str] = []
            for box in (self.state_dir / "sandboxes").iterdir():
                meta = self._read_meta(box.name)
                if meta is None or "pid" not in meta:
                    continue  # half-made: remove_orphans decides after the grace period
                if self._alive(box.name, meta):
                    self._watch(box.name, int(meta["pid"]))
                    if meta.get("ip"):
                        self.network.reserve([str(meta["ip"])])
                elif "exit_code" not in meta:
                    dead.append(box.name)
            self._recovered = True
        if dead:
            log.info("removing %d sandboxes that died while no service ran", len(dead))
            await asyncio.gather(*(self.delete(i) for i in dead), return_exceptions=True)

    # ------------------------------------------------------------ create

    def _child(self, spec: SandboxSpec, image: LocalImage) -> list[str]:
        if spec.cmd == []:
            return [*image.entrypoint, *image.cmd]
        return list(spec.cmd or [])

    def _etc_files(self, box: Path, hostname: str, ip: str | None) -> list[tuple[str, str, bool]]:
        etc = box / "etc"
        etc.mkdir()
        (etc / "hostname").write_text(hostname + "\n")
        self._write_hosts(box, hostname, ip)
        servers = host_dns_servers()
        (etc / "resolv.conf").write_text("".join(f"nameserver {s}\n" for s in servers))
        # Read-only: host files the sandbox could grow past its disk limit (host_folders.py).
        return [(str(etc / n), f"/etc/{n}", True) for n in ("hostname", "hosts", "resolv.conf")]

    @staticmethod
    def _write_hosts(box: Path, hostname: str, ip: str | None) -> None:
        """In place (the sandbox has this inode mounted), as its address changes."""
        hosts = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
        (box / "etc" / "hosts").write_text(hosts + (f"{ip}\t{hostname}\n" if ip else ""))

    def _rootfs_mounts(
        self, box: Path, image: LocalImage, disk: int | None, layers: list[str]
    ) -> RootfsMounts:
        """The mount points on disk; the mounts themselves are made in runc's namespace."""
        (box / "scratch").mkdir()
        (box / "rootfs").mkdir()
        layer_dirs = self._layer_dirs(layers)
        return RootfsMounts(image.rootfs, box / "scratch", box / "rootfs", disk, layer_dirs)

    async def create(self, spec: SandboxSpec) -> SandboxRecord:
        await self._recover()
        self._check_spec(spec)
        egress = spec.network.egress
        allow = await self._allow(spec.network)
        image, layers = await self._image_for(spec)
        if egress != "none":
            await self.network.ensure()
        box = self._box(spec.id)
        if box.exists() or spec.id in self._creating:
            raise Conflict(f"sandbox {spec.id} already exists")
        self._creating.add(spec.id)
        try:
            self._make_box(spec.id)  # and its socket folder on the tmpfs (host_folders.py)
            ip = self.network.allocate() if egress != "none" else None
            meta = self._meta(spec, image, ip)
            meta.update(layers=layers, lower=str(image.rootfs))
            self._write_meta(spec.id, meta)
            binds = [
                (str(self.agent_binary), AGENT_PATH, True),
                (str(self._run_dir(spec.id)), RUN_DIR, False),
                *self._etc_files(box, spec.id, ip),
                # volume_host.py: after the meta names them, where they lead in the rootfs
                *await self.volume_binds(
                    spec, LayerView([*self._layer_dirs(layers), image.rootfs])
                ),
            ]
            if meta["disk"]:  # the upper on its tmpfs, for snapshots and diffs (state.py)
                binds.append((str(box / "scratch"), SCRATCH_MOUNT, True))
            mounts = self._rootfs_mounts(box, image, meta["disk"], layers)
            inp = self._spec_input(spec, image, meta, box, binds)
            runtime = self._runtime_of(spec.id, meta)
            # runc mounts the overlay itself (no preexec fork) unless a disk tmpfs or the
            # restore of a memory snapshot (its mount namespace as CRIU dumped it) needs it
            # first; crun never does (oci_runtime.py).
            in_runc = mounts.in_runc and runtime.mounts_rootfs and self._memory_image(spec) is None
            if in_runc:
                inp = dataclasses.replace(inp, rootfs_mount=mounts.oci_mount())
            config = runtime_spec(inp)
            pid_file = box / "init.pid"
            hide = oci_runtime.UNIFIED if runtime.hides_unified else None
            preexec = None if in_runc else mounts.preexec(hide)
            # `run`, or the restore of a memory snapshot's processes (memory.py).
            rc = await self._start(spec, box, config, runtime, preexec)
            spawn.reap_strays(runtime.names)  # crun's intermediate process (spawn.py)
            if rc != 0:
                tail = (box / "console.log").read_text(errors="replace")[-2000:]
                mount_failed = rc == MOUNT_FAILED or RUNC_MOUNT_FAILED in tail.replace("\\", "")
                what = "mount the rootfs of" if mount_failed else "start"
                failure = f"{runtime.name} could not {what} sandbox {spec.id}"
                raise hidden(Unavailable, failure, tail, log)
            pid = int(pid_file.read_text())
            meta.update(pid=pid, pid_start=_start_time(pid))
            self._write_meta(spec.id, meta)
            self._watch(spec.id, pid)
            await self._pin_socket(spec.id)
            await self._adopt_restored(spec, pid)
            if ip is not None:
                await self.network.attach(spec.id, pid, ip)
                await self.network.firewall.apply(spec.id, ip, egress, allow)
        except BaseException:
            with contextlib.suppress(Exception):
                await self.delete(spec.id)
            raise
        finally:
            self._creating.discard(spec.id)
        return self._record(meta)

    def _meta(self, spec: SandboxSpec, image: LocalImage, ip: str | None) -> dict[str, Any]:
        return {
            "id": spec.id,
            "owner": spec.owner,
            "image": spec.image,
            "image_key": image.key,
            "created_at": time.time(),
            "expires_at": float(spec.expires_at),
            "idle_timeout_s": spec.idle_timeout_s,
            "network": spec.network.model_dump(),
            "cpu": spec.cpu,
            "memory": spec.memory_bytes,
            "pids": spec.pids_limit or self.default_pids_limit,
            "disk": spec.disk_bytes or self.default_disk_bytes,
            "default_user": spec.user or image.user,
            "labels": dict(spec.labels),
            "extra_labels": self.extra_labels,
            "ip": ip,
            "volumes": encode_mounts(spec.volumes),
            # A memory snapshot's processes are restored by runc (backends/runtimes.py).
            "runtime": checkpointing().name if self._memory_image(spec) else self.runtime.name,
        }

    def _spec_input(
        self,
        spec: SandboxSpec,
        image: LocalImage,
        meta: Mapping[str, Any],
        box: Path,
        binds: list[tuple[str, str, bool]],
    ) -> SpecInput:
        args = [AGENT_PATH, "--socket", f"{RUN_DIR}/{SOCKET_NAME}", "--log", CONSOLE_LOG]
        if meta["cpu"]:  # the Go runtime's threads for Go code (GOMAXPROCS), rounded up
            args += ["--cpus", str(meta["cpu"])]
        if meta["default_user"]:
            # The agent stays root (to switch users per request); the image's USER is the default.
            args += ["--user", str(meta["default_user"])]
        child = self._child(spec, image)
        if child:
            args += ["--", *child]
        env = merge_env(image.env, {**spec.env, "ORCHARD_AGENT_TOKEN": spec.agent_token})
        return SpecInput(
            rootfs=str(box / "rootfs"),
            args=args,
            env=env,
            cwd=spec.workdir or image.workdir or "/",
            hostname=spec.id,
            cgroups_path=f"/{CGROUP_PARENT}/{spec.id}",
            binds=binds,
            cpu=spec.cpu,
            memory_bytes=spec.memory_bytes,
            pids_limit=int(meta["pids"]) + AGENT_PIDS_RESERVE,  # as Docker: the agent's threads
            sysctl=self._sysctl,
        )

    async def _allow(self, policy: NetworkPolicy) -> ResolvedAllow:
        if policy.egress != "allow":
            return ResolvedAllow((), False)
        return await self.network.firewall.resolve(policy.allow)

    # ------------------------------------------------------------ records

    def _record(self, meta: Mapping[str, Any]) -> SandboxRecord:
        sid = str(meta["id"])
        state: BackendState
        exit_code: int | None = None
        if "pid" not in meta:
            state = "pending"
        elif self._alive(sid, meta):
            state = "paused" if meta.get("paused") else "running"
            self._repin(sid)  # a create cut short before pinning (adoption)
        else:
            state = "exited"
            watch = self._watches.get(sid)
            exit_code = meta.get("exit_code", watch.exit_code if watch else None)
        return SandboxRecord(
            id=sid,
            owner=str(meta.get("owner", "")),
            image=str(meta.get("image", "")),
            state=state,
            created_at=float(meta.get("created_at") or 0),
            expires_at=float(meta.get("expires_at") or 0),
            endpoint=self._endpoint(sid),
            idle_timeout_s=meta.get("idle_timeout_s"),
            network=NetworkPolicy.model_validate(meta.get("network") or {}),
            labels=dict(meta.get("labels") or {}),
            cpu=meta.get("cpu"),
            memory_bytes=meta.get("memory"),
            pids_limit=meta.get("pids"),
            disk_bytes=meta.get("disk"),
            exit_code=exit_code,
            error=None,
            default_user=meta.get("default_user") or None,
            volumes=decode_mounts(meta.get("volumes")),
        )

    def _visible(self, sandbox_id: str, meta: Mapping[str, Any] | None) -> bool:
        """A folder is a sandbox once runc started it (or while our own create runs)."""
        return meta is not None and ("pid" in meta or sandbox_id in self._creating)

    async def get(self, sandbox_id: str) -> SandboxRecord | None:
        await self._recover()
        meta = self._read_meta(sandbox_id)
        if not self._visible(sandbox_id, meta) or meta is None:
            return None
        return self._record(meta)

    async def list(self) -> list[SandboxRecord]:
        await self._recover()
        records = []
        for box in (self.state_dir / "sandboxes").iterdir():
            meta = self._read_meta(box.name)
            if self._visible(box.name, meta) and meta is not None:
                records.append(self._record(meta))
        return records

    # ------------------------------------------------------------ updates

    async def _require(self, sandbox_id: str) -> tuple[dict[str, Any], SandboxRecord]:
        meta = self._read_meta(sandbox_id) if self._box(sandbox_id).is_dir() else None
        if meta is None or not self._visible(sandbox_id, meta):
            raise NotFound(f"sandbox {sandbox_id} not found")
        return meta, self._record(meta)

    async def set_expiry(self, sandbox_id: str, expires_at: float) -> SandboxRecord:
        await self._recover()
        _, rec = await self._require(sandbox_id)
        self._update_meta(sandbox_id, expires_at=float(expires_at))
        rec.expires_at = float(expires_at)
        return rec

    async def set_network(self, sandbox_id: str, policy: NetworkPolicy) -> SandboxRecord:
        await self._recover()
        meta, rec = await self._require(sandbox_id)
        if rec.state != "running":
            raise SandboxExited(
                f"sandbox {sandbox_id} is not running", details={"state": rec.state}
            )
        allow = await self._allow(policy)
        previous, ip = rec.network, meta.get("ip")
        # Recorded first, so a crash half-way still leaves delete() knowing there is a veth.
        self._update_meta(sandbox_id, network=policy.model_dump())
        try:
            if policy.egress == "none":
                await self.network.firewall.remove(sandbox_id)
                await self.network.detach(sandbox_id)
                self.network.release(ip)
                self._update_meta(sandbox_id, ip=None)
                self._write_hosts(self._box(sandbox_id), sandbox_id, None)
            else:
                if not ip:
                    await self.network.ensure()
                    ip = self.network.allocate()
                    self._update_meta(sandbox_id, ip=ip)
                    # Until apply() below, ORCHARD-EGRESS drops everything from it.
                    await self.network.attach(sandbox_id, int(meta["pid"]), ip)
                    self._write_hosts(self._box(sandbox_id), sandbox_id, ip)
                await self.network.firewall.apply(sandbox_id, ip, policy.egress, allow)
        except BaseException:
            self._update_meta(sandbox_id, network=previous.model_dump())
            raise
        rec.network = policy
        return rec

    # ------------------------------------------------------------ delete

    async def _kill(self, sandbox_id: str, meta: Mapping[str, Any]) -> bool:
        """SIGKILL the init (the kernel then ends its whole PID namespace) and wait for it.

        True when its end was seen here (our pidfd), so nothing of the sandbox runs."""
        pid = meta.get("pid")
        known = self._watches.get(sandbox_id)
        if known is not None and known.pid == pid and known.done.is_set():
            return True
        if not pid or not self._alive(sandbox_id, meta):
            return False
        watch = self._watch(sandbox_id, int(pid))
        if watch is None:
            return False
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(watch.fd, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):
                await watch.done.wait()
        return watch.done.is_set()

    async def delete(self, sandbox_id: str) -> None:
        try:
            sandbox_tag(sandbox_id)
        except InvalidRequest:
            return  # no sandbox can have such an id
        box = self._box(sandbox_id)
        meta = self._read_meta(sandbox_id)
        dead = False
        if meta is not None:
            await self._thaw_for_delete(sandbox_id, meta)
            self._deleting.add(sandbox_id)
            try:
                dead = await self._kill(sandbox_id, meta)
            finally:
                self._deleting.discard(sandbox_id)
        runtime = self._runtime_of(sandbox_id, meta)
        spawn.reap_strays(runtime.names)  # one that ended after the last create's sweep
        if (runtime.root / sandbox_id).exists() and not (
            dead and release_stopped(runtime.root, CGROUP_PARENT, sandbox_id)
        ):
            rc, out = await self._oci(runtime, "delete", "--force", sandbox_id)
            if rc != 0 and "does not exist" not in out:
                log.warning("%s delete %s: %s", runtime.name, sandbox_id, out)
        self._watches.pop(sandbox_id, None)
        networked = (
            meta is None
            or meta.get("ip")
            or (meta.get("network") or {}).get("egress", "none") != "none"
        )
        if networked:
            if shutil.which("iptables"):
                await self.network.firewall.remove(sandbox_id)
            await self.network.detach(sandbox_id)
            self.network.release(meta.get("ip") if meta else None)
        self._remove_cgroups(sandbox_id)
        umount(box / "rootfs")  # only sandboxes made before mount_ns have host mounts
        umount(box / "scratch")
        await asyncio.to_thread(self._remove_box, sandbox_id)
        if meta and meta.get("layers"):
            await asyncio.to_thread(self.sweep_snapshots)

    @staticmethod
    def _remove_cgroups(sandbox_id: str) -> None:
        """What runc did not remove (a create that died half-way); empty cgroups only."""
        remove_cgroups(CGROUP_PARENT, sandbox_id)

    async def _runtime_gone(self, sandbox_id: str) -> bool:
        return not self._visible(sandbox_id, self._read_meta(sandbox_id))

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        for watch in self._watches.values():
            if not watch.done.is_set():
                loop.remove_reader(watch.fd)
                os.close(watch.fd)
        self._watches.clear()
        self._spawner.detach()
        await asyncio.to_thread(self._spawner.reap)
        self._release_sockets()  # its tmpfs, once no sandbox is left on it
