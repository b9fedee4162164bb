"""Networking of the local backend: a host bridge of ours, one veth pair per networked sandbox.

runc always gives a sandbox a new network namespace with only loopback (egress `none`).
For `all`/`allow` it gets a veth pair whose host end joins the bridge `orchard0`
(subnet 10.215.0.0/16, distinct from the Docker backend's). Bridge ports are isolated,
so sandboxes cannot reach each other; NAT (masquerade) takes their traffic out; the egress
rules themselves are the Docker backend's (`orchard.env.backends.network.EgressFirewall`, which
also accepts the forwarded traffic that passed a sandbox's chain, as no engine does it
for this bridge). Each step is one `ip -batch` call, so a networked create costs two
`ip` processes and one `iptables-restore`. The namespace is reached through its init's pid
(the second `ip` joins it with setns(2) before exec), never named: a name is a bind mount
in /run/netns, one more host mount per sandbox that runc would copy into every create.
"""

from __future__ import annotations

import asyncio
import ctypes
import hashlib
import ipaddress
import os
import random
import shutil
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path

from orchard.env.backends.network import LOCAL_SUBNET, EgressFirewall
from orchard.env.errors import Unavailable

LOCAL_BRIDGE = "orchard0"
NETNS_DIR = Path("/run/netns")  # where earlier versions named sandboxes' namespaces
_NAT_TAG = "orchard-nat"
_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def netns_name(sandbox_id: str) -> str:
    """The name earlier versions gave a sandbox's namespace (removed on delete)."""
    return f"orchard-{sandbox_id}"


def _enter_netns(pid: int) -> Callable[[], None]:
    """For preexec_fn: move the child into the network namespace of process `pid`."""
    path = f"/proc/{pid}/ns/net"

    def enter() -> None:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        if _libc.setns(fd, _CLONE_NEWNET):
            err = ctypes.get_errno()
            raise OSError(err, f"setns {path}: {os.strerror(err)}")
        os.close(fd)

    return enter


def veth_names(sandbox_id: str) -> tuple[str, str]:
    """(host end, sandbox end before its rename to eth0): 15 bytes, the kernel's limit."""
    h = hashlib.sha256(sandbox_id.encode()).hexdigest()[:12]
    return f"orc{h}", f"orp{h}"


async def _run(
    args: list[str], stdin: str | None = None, preexec: Callable[[], None] | None = None
) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        preexec_fn=preexec,
    )
    out, _ = await proc.communicate(stdin.encode() if stdin is not None else None)
    return proc.returncode or 0, out.decode(errors="replace").strip()


def _ip() -> str:
    path = shutil.which("ip")
    if path is None:
        raise Unavailable("networked local sandboxes need `ip` (iproute2) on PATH")
    return path


class LocalNetwork:
    """The bridge, NAT, addresses and veth pairs of one local backend."""

    def __init__(
        self, subnet: str = LOCAL_SUBNET, bridge: str = LOCAL_BRIDGE, protect: Iterable[str] = ()
    ) -> None:
        self.net = ipaddress.IPv4Network(subnet)
        self.bridge = bridge
        self.gateway = str(next(self.net.hosts()))
        self.firewall = EgressFirewall(str(self.net), accept_forward=True, protect=protect)
        self._ready = False
        self._lock = asyncio.Lock()
        self._used: set[str] = {self.gateway}

    def reserve(self, addresses: Iterable[str]) -> None:
        """Mark addresses of existing sandboxes as taken (after a restart)."""
        self._used.update(addresses)

    def allocate(self) -> str:
        hosts = self.net.num_addresses - 2
        for _ in range(64):
            ip = str(self.net.network_address + random.randint(2, hosts))
            if ip not in self._used:
                self._used.add(ip)
                return ip
        for addr in self.net.hosts():  # nearly full: walk it
            if str(addr) not in self._used:
                self._used.add(str(addr))
                return str(addr)
        raise Unavailable(f"no free address left in {self.net}")

    def release(self, ip: str | None) -> None:
        if ip and ip != self.gateway:
            self._used.discard(ip)

    async def ensure(self) -> None:
        """Create the bridge, NAT and the shared firewall hooks once per process."""
        if self._ready:
            return
        async with self._lock:
            if self._ready:
                return
            ip = _ip()
            if not Path(f"/sys/class/net/{self.bridge}").exists():
                rc, out = await _run(
                    [ip, "-batch", "-"],
                    f"link add {self.bridge} type bridge\n"
                    f"addr add {self.gateway}/{self.net.prefixlen} dev {self.bridge}\n"
                    f"link set {self.bridge} up\n",
                )
                if rc != 0 and not Path(f"/sys/class/net/{self.bridge}").exists():
                    raise Unavailable(f"cannot create bridge {self.bridge}: {out}")
            Path("/proc/sys/net/ipv4/ip_forward").write_text("1")
            await self._ensure_nat()
            await self.firewall.ensure()
            self._ready = True

    async def _ensure_nat(self) -> None:
        iptables = shutil.which("iptables")
        if iptables is None:
            raise Unavailable("egress for local sandboxes needs `iptables` on PATH")
        rule = [
            "POSTROUTING",
            "-s",
            str(self.net),
            "!",
            "-o",
            self.bridge,
            "-m",
            "comment",
            "--comment",
            _NAT_TAG,
            "-j",
            "MASQUERADE",
        ]
        rc, _ = await _run([iptables, "-w", "-t", "nat", "-C", *rule])
        if rc != 0:
            rc, out = await _run([iptables, "-w", "-t", "nat", "-A", *rule])
            if rc != 0:
                raise Unavailable(f"cannot install NAT for {self.net}: {out}")

    async def attach(self, sandbox_id: str, pid: int, ip: str) -> None:
        """Plug the namespace of the sandbox's init `pid` into the bridge at `ip`."""
        await self.ensure()
        host, peer = veth_names(sandbox_id)
        rc, out = await _run(
            [_ip(), "-batch", "-"],
            f"link add {host} type veth peer name {peer}\n"
            f"link set {peer} netns {pid}\n"
            f"link set {host} master {self.bridge}\n"
            f"link set dev {host} type bridge_slave isolated on\n"
            f"link set {host} up\n",
        )
        if rc != 0:
            raise Unavailable(f"cannot plug sandbox {sandbox_id} into {self.bridge}: {out}")
        try:
            rc, out = await _run(
                [_ip(), "-batch", "-"],
                f"link set {peer} name eth0\n"
                f"addr add {ip}/{self.net.prefixlen} dev eth0\n"
                "link set eth0 up\n"
                f"route add default via {self.gateway}\n",
                preexec=_enter_netns(pid),
            )
        except subprocess.SubprocessError as exc:  # setns failed: the sandbox died meanwhile
            raise Unavailable(f"cannot enter the network of sandbox {sandbox_id}: {exc}") from exc
        if rc != 0:
            raise Unavailable(f"cannot configure the network of sandbox {sandbox_id}: {out}")

    async def detach(self, sandbox_id: str) -> None:
        """Remove the veth pair (and an earlier version's name); nothing there is fine."""
        ns = netns_name(sandbox_id)
        host, _ = veth_names(sandbox_id)
        lines = []
        if Path(f"/sys/class/net/{host}").exists():
            lines.append(f"link del {host}")  # takes the sandbox's end with it
        if (NETNS_DIR / ns).exists():
            lines.append(f"netns del {ns}")
        if lines:
            # -force: carry on past a line that fails (e.g. the pair vanished meanwhile).
            await _run([_ip(), "-force", "-batch", "-"], "\n".join(lines) + "\n")
