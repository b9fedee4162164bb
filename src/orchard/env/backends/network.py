"""Host-side egress enforcement for sandboxes on Orchard's Docker bridge network.

Sandboxes with egress `all` or `allow` join one bridge network (`orchard-egress`, ICC off,
so sandboxes cannot reach each other). Everything is enforced with iptables on the host,
never by anything inside the sandbox:

- `DOCKER-USER` (Docker's hook for forwarded traffic) sends every packet *from* the
  subnet to `ORCHARD-EGRESS`, and accepts replies *to* the subnet (so an allowed flow to
  another Docker network is not cut by Docker's inter-network isolation on the way back).
- `ORCHARD-EGRESS` holds one `-s <ip> -g ORCHARD-SB-<hash>` jump per sandbox, then DROP:
  a container on the network whose rules are not installed yet has no egress at all, which
  closes the window between container start and rule installation.
- the per-sandbox chain drops cloud metadata first, then (for `allow` with names) accepts
  DNS to the host's resolvers, then drops every sandbox network of either backend and the
  operator's extra ranges (`protected`: a cluster's pod and service ranges, say), and only
  then either RETURNs (`all`: Docker's own rules decide, i.e. NAT out and isolation from
  other Docker networks) or ACCEPTs the allowed CIDRs and drops the rest (`allow`). So no
  allow-list, not even `0.0.0.0/0`, reaches another tenant's sandbox: a broad entry is
  trimmed by the drops before it, and an entry that lies wholly inside a protected range,
  the host's own addresses or loopback is refused (`EgressDenied`, 422) when it is set.
- `INPUT` sends every packet from the subnet to `ORCHARD-INPUT`, which only accepts replies
  to connections the host opened: sandboxes cannot reach the host's own ports (the service,
  the Docker API, ...).

Rule changes go through one `iptables-restore --noflush` transaction per operation, under a
lock, because iptables is not safe to drive concurrently and create is on the hot path.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import re
import shlex
import shutil
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from orchard.env.errors import EgressDenied, InvalidRequest, Unavailable

DEFAULT_NETWORK = "orchard-egress"
# A /16 in 10/8 that few LANs, VPNs or Docker's own default pools use; configurable.
DEFAULT_SUBNET = "10.213.0.0/16"
# The local backend's bridge (local/net.py): distinct, so both backends can share a host.
LOCAL_SUBNET = "10.215.0.0/16"
# Every sandbox network of either backend: dropped for every sandbox, before any allow rule.
SANDBOX_SUBNETS: tuple[str, ...] = (DEFAULT_SUBNET, LOCAL_SUBNET)
LOOPBACK = "127.0.0.0/8"
_FIB_TRIE = Path("/proc/net/fib_trie")

EGRESS_CHAIN = "ORCHARD-EGRESS"
INPUT_CHAIN = "ORCHARD-INPUT"
SANDBOX_CHAIN_PREFIX = "ORCHARD-SB-"
USER_CHAIN = "DOCKER-USER"

# Dropped for every sandbox, before anything is allowed: link-local (AWS/GCP/Azure/OCI
# metadata at 169.254.169.254, ECS task metadata at 169.254.170.2) and Alibaba's metadata.
# IPv6 (e.g. fd00:ec2::254) needs no rule: sandboxes get no IPv6 at all (see docker/backend.py).
METADATA_CIDRS: tuple[str, ...] = ("169.254.0.0/16", "100.100.100.200/32")

_BASE_TAG = "orchard-base"
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

Egress = Literal["none", "all", "allow"]


def _join(tokens: list[str]) -> str:
    """Join `iptables -S` tokens back into iptables-restore syntax (double quotes only)."""
    return " ".join(f'"{t}"' if not t or " " in t else t for t in tokens)


def chain_name(sandbox_id: str) -> str:
    """A valid, fixed-length chain name (iptables allows 28 chars) for any sandbox id."""
    return SANDBOX_CHAIN_PREFIX + hashlib.sha256(sandbox_id.encode()).hexdigest()[:12].upper()


def sandbox_tag(sandbox_id: str) -> str:
    """The comment carried by every rule of one sandbox, so it can be found and removed."""
    if not _ID_RE.match(sandbox_id):
        raise InvalidRequest(f"invalid sandbox id {sandbox_id!r}")
    return f"orchard:{sandbox_id}"


def host_dns_servers(resolv_conf: Path = Path("/etc/resolv.conf")) -> list[str]:
    """The host's IPv4 upstream resolvers: Docker's embedded DNS forwards to them from the
    sandbox's own network namespace, so `allow` sandboxes that use names must reach them."""
    servers: list[str] = []
    try:
        text = resolv_conf.read_text()
    except OSError:
        return servers
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "nameserver":
            try:
                addr = ipaddress.ip_address(parts[1])
            except ValueError:
                continue
            if addr.version == 4 and not addr.is_loopback:
                servers.append(str(addr))
    return servers


def host_addresses(fib_trie: Path = _FIB_TRIE) -> list[str]:
    """Every IPv4 address of this host (all interfaces), from the kernel's local table.

    Packets to them are the INPUT chain's (dropped); listed so an allow entry naming the
    host is refused up front instead of silently never working."""
    found: set[str] = set()
    last = ""
    try:
        lines = fib_trie.read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        part = line.strip()
        if part.startswith("|--"):
            last = part[3:].strip()
        elif part == "/32 host LOCAL" and last:
            found.add(last)
    return sorted(found)


def protected_ranges(own_subnet: str, extra: Iterable[str] = ()) -> tuple[str, ...]:
    """The ranges every sandbox chain drops before its allow rules (see the module doc)."""
    nets = [*SANDBOX_SUBNETS, own_subnet, *extra]
    return tuple(dict.fromkeys(str(ipaddress.IPv4Network(n, strict=False)) for n in nets))


@dataclass(frozen=True)
class ResolvedAllow:
    """An allow-list turned into IPv4 networks; `names` says whether DNS must stay open."""

    cidrs: tuple[str, ...]
    names: bool


def _denied(
    net: ipaddress.IPv4Network, refused: Sequence[ipaddress.IPv4Network]
) -> ipaddress.IPv4Network | None:
    return next((r for r in refused if net.subnet_of(r)), None)


async def resolve_allow(
    entries: Sequence[str],
    *,
    timeout_s: float = 5.0,
    refused: Sequence[ipaddress.IPv4Network] = (),
) -> ResolvedAllow:
    """CIDRs and addresses as given, host names resolved now with the host's resolver.

    IPv6 entries are accepted but have no effect: sandboxes have no IPv6 route. An entry
    inside one of `refused` (a CIDR, or any address a name resolves to) raises EgressDenied.
    """
    cidrs: list[str] = []
    names: list[str] = []
    for entry in entries:
        try:
            net = ipaddress.ip_network(entry.strip(), strict=False)
        except ValueError:
            if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?", entry.strip()):
                raise InvalidRequest(
                    f"allow entry {entry!r} is neither a CIDR nor a host name"
                ) from None
            names.append(entry.strip())
            continue
        if net.version == 4:
            if (hit := _denied(ipaddress.IPv4Network(str(net)), refused)) is not None:
                raise EgressDenied(_refusal(entry.strip(), hit))
            cidrs.append(str(net))
    loop = asyncio.get_running_loop()

    async def one(name: str) -> list[str]:
        try:
            async with asyncio.timeout(timeout_s):
                infos = await loop.getaddrinfo(name, None, family=socket.AF_INET)
        except TimeoutError as e:
            raise Unavailable(f"resolving {name!r} timed out") from e
        except socket.gaierror as e:
            if e.errno in (socket.EAI_AGAIN, getattr(socket, "EAI_SYSTEM", -11)):
                raise Unavailable(f"cannot resolve {name!r} now: {e.strerror}") from e
            raise InvalidRequest(f"cannot resolve allow entry {name!r}: {e.strerror}") from e
        addrs = [f"{info[4][0]}/32" for info in infos]
        for addr in addrs:
            if (hit := _denied(ipaddress.IPv4Network(addr), refused)) is not None:
                raise EgressDenied(_refusal(name, hit))
        return addrs

    for addrs in await asyncio.gather(*(one(n) for n in names)):
        cidrs.extend(addrs)
    return ResolvedAllow(tuple(dict.fromkeys(cidrs)), bool(names))


def _refusal(entry: str, hit: ipaddress.IPv4Network) -> str:
    return (
        f"allow entry {entry!r} lies in {hit}, which no sandbox may reach "
        "(sandbox networks, the host, loopback, or a range the operator protects)"
    )


def sandbox_rules(
    sandbox_id: str,
    egress: Egress,
    allow: ResolvedAllow,
    dns_servers: Iterable[str],
    protected: Iterable[str] = (),
) -> list[str]:
    """The body of one sandbox's chain (iptables-restore syntax without `-A CHAIN`)."""
    tag = sandbox_tag(sandbox_id)
    rules = [f"-d {cidr} -m comment --comment {tag} -j DROP" for cidr in METADATA_CIDRS]
    if egress not in ("all", "allow"):
        raise InvalidRequest(f"egress {egress!r} needs no rules")
    if egress == "allow" and allow.names:
        for server in dns_servers:
            for proto in ("udp", "tcp"):
                rules.append(
                    f"-d {server}/32 -p {proto} --dport 53 -m comment --comment {tag} -j ACCEPT"
                )
    rules += [f"-d {cidr} -m comment --comment {tag} -j DROP" for cidr in protected]
    if egress == "all":
        return rules  # falls off the end: RETURN to DOCKER-USER, Docker's own rules decide
    rules += [f"-d {cidr} -m comment --comment {tag} -j ACCEPT" for cidr in allow.cidrs]
    rules.append(f"-m comment --comment {tag} -j DROP")
    return rules


class EgressFirewall:
    """Installs and removes the iptables rules; keeps a cache of what it installed.

    The cache (our chains and the jumps to them) is loaded from one `iptables -S` in
    `ensure()`, so create and delete cost a single iptables-restore call (and none at all
    for sandboxes without network). If a transaction fails because someone else changed
    the rules, the cache is reloaded and the transaction retried once.
    """

    def __init__(
        self,
        subnet: str = DEFAULT_SUBNET,
        *,
        accept_forward: bool = False,
        protect: Iterable[str] = (),
    ) -> None:
        self.subnet = str(ipaddress.ip_network(subnet))
        # True for a bridge no engine manages (the local backend's): after the sandbox's own
        # chain lets a packet through, nothing else would accept it, so we do.
        self.accept_forward = accept_forward
        self.extra_protected = tuple(protect)
        self.protected = protected_ranges(self.subnet, self.extra_protected)
        self._lock = asyncio.Lock()
        self._ready = False
        self._chains: set[str] = set()
        self._jumps: dict[str, list[str]] = {}  # sandbox chain -> rule specs in ORCHARD-EGRESS

    # ------------------------------------------------------------ plumbing

    @staticmethod
    def _binary(name: str) -> str:
        path = shutil.which(name)
        if path is None:
            raise Unavailable(f"egress enforcement needs `{name}` on PATH")
        return path

    async def _run(self, args: Sequence[str], stdin: str | None = None) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            *args,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate(stdin.encode() if stdin is not None else None)
        return proc.returncode or 0, out.decode(), err.decode()

    async def _restore(self, lines: Sequence[str]) -> None:
        text = "\n".join(["*filter", *lines, "COMMIT", ""])
        rc, _, err = await self._run(
            [self._binary("iptables-restore"), "--noflush", "--wait"], stdin=text
        )
        if rc != 0:
            raise Unavailable(f"iptables-restore failed: {err.strip()}")

    async def _dump(self) -> list[list[str]]:
        rc, out, err = await self._run([self._binary("iptables"), "-w", "-S"])
        if rc != 0:
            raise Unavailable(f"iptables -S failed (is this root?): {err.strip()}")
        return [shlex.split(line) for line in out.splitlines() if line.strip()]

    async def _load(self) -> list[list[str]]:
        rules = await self._dump()
        self._chains = {r[1] for r in rules if r[:1] == ["-N"]}
        self._jumps = {}
        for r in rules:
            if r[:2] == ["-A", EGRESS_CHAIN] and "-g" in r:
                target = r[r.index("-g") + 1]
                self._jumps.setdefault(target, []).append(_join(r[2:]))
        return rules

    # ------------------------------------------------------------ base rules

    async def ensure(self) -> None:
        """Install the shared chains and hooks if missing (idempotent; cheap after the first)."""
        async with self._lock:
            if self._ready:
                return
            rules = await self._load()
            await self._restore(self._base_fix(rules))
            self._chains |= {EGRESS_CHAIN, INPUT_CHAIN, USER_CHAIN}
            self._ready = True

    def _base_fix(self, rules: list[list[str]]) -> list[str]:
        """Restore lines that (re)create the shared chains and hooks, replacing stale ones."""
        sub = self.subnet
        lines: list[str] = []
        if USER_CHAIN not in self._chains:
            # No Docker-managed hook (e.g. Docker's iptables support is off): make our own.
            lines += [f":{USER_CHAIN} - [0:0]", f"-A {USER_CHAIN} -j RETURN"]
            lines.append(f"-I FORWARD 1 -j {USER_CHAIN}")
        if EGRESS_CHAIN not in self._chains:
            lines += [
                f":{EGRESS_CHAIN} - [0:0]",
                f"-A {EGRESS_CHAIN} -m comment --comment {_BASE_TAG} -j DROP",
            ]
        lines += [
            f":{INPUT_CHAIN} - [0:0]",  # ours alone: always rewritten
            f"-A {INPUT_CHAIN} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
            f"-A {INPUT_CHAIN} -m comment --comment {_BASE_TAG} -j DROP",
        ]
        tag = self._hook_tag()
        wanted = {
            USER_CHAIN: [
                f"-s {sub} -m comment --comment {tag} -j {EGRESS_CHAIN}",
                f"-d {sub} -m conntrack --ctstate RELATED,ESTABLISHED "
                f"-m comment --comment {tag} -j ACCEPT",
            ],
            "INPUT": [f"-s {sub} ! -i lo -m comment --comment {tag} -j {INPUT_CHAIN}"],
        }
        if self.accept_forward:  # inserted first, so it ends up after the jump to EGRESS
            wanted[USER_CHAIN].insert(0, f"-s {sub} -m comment --comment {tag} -j ACCEPT")
        for chain, specs in wanted.items():
            ours = self._hooks(rules, chain)
            if len(ours) == len(specs):
                continue
            lines += [f"-D {chain} {spec}" for spec in ours]
            lines += [f"-I {chain} 1 {spec}" for spec in specs]  # last one ends up first
        return lines

    def _hook_tag(self) -> str:
        # Per subnet, so backends with different networks on one host keep their own hooks.
        return f"{_BASE_TAG}:{self.subnet}"

    def _hooks(self, rules: list[list[str]], chain: str) -> list[str]:
        tag = self._hook_tag()
        return [_join(r[2:]) for r in rules if r[:2] == ["-A", chain] and tag in r]

    async def remove_hooks(self) -> None:
        """Remove this subnet's hooks in DOCKER-USER and INPUT (the shared chains stay)."""
        async with self._lock:
            rules = await self._load()
            lines = [
                f"-D {c} {spec}" for c in (USER_CHAIN, "INPUT") for spec in self._hooks(rules, c)
            ]
            if lines:
                await self._restore(lines)
            self._ready = False

    def refused(self) -> list[ipaddress.IPv4Network]:
        """What an allow entry may not lie in: the protected ranges, loopback, the host."""
        nets = [*METADATA_CIDRS, *self.protected, LOOPBACK]
        nets += [f"{a}/32" for a in host_addresses()]
        return [ipaddress.IPv4Network(n) for n in nets]

    async def resolve(self, entries: Sequence[str]) -> ResolvedAllow:
        """`resolve_allow` under this firewall's refusals (EgressDenied, 422)."""
        return await resolve_allow(entries, refused=self.refused())

    # ------------------------------------------------------------ per sandbox

    async def apply(
        self, sandbox_id: str, ip: str, egress: Egress, allow: ResolvedAllow
    ) -> list[str]:
        """Install (or replace) one sandbox's rules for its current IP; returns the body."""
        ipaddress.IPv4Address(ip)
        body = sandbox_rules(sandbox_id, egress, allow, host_dns_servers(), self.protected)
        chain = chain_name(sandbox_id)
        jump = f"-s {ip}/32 -m comment --comment {sandbox_tag(sandbox_id)} -g {chain}"
        await self.ensure()
        async with self._lock:

            def lines() -> list[str]:
                out = [f":{chain} - [0:0]"]  # creates it, or flushes it under --noflush
                out += [f"-D {EGRESS_CHAIN} {spec}" for spec in self._jumps.get(chain, [])]
                out += [f"-A {chain} {rule}" for rule in body]
                out.append(f"-I {EGRESS_CHAIN} 1 {jump}")
                return out

            await self._transaction(lines)
            self._chains.add(chain)
            self._jumps[chain] = [jump]
        return body

    async def remove(self, sandbox_id: str) -> None:
        """Remove one sandbox's chain and jumps; nothing to do is fine."""
        chain = chain_name(sandbox_id)
        async with self._lock:
            if not self._ready:
                await self._load()
            if chain not in self._chains and not self._jumps.get(chain):
                return

            def lines() -> list[str]:
                out = [f"-D {EGRESS_CHAIN} {spec}" for spec in self._jumps.get(chain, [])]
                if chain in self._chains:
                    out += [f"-F {chain}", f"-X {chain}"]
                return out

            await self._transaction(lines)
            self._chains.discard(chain)
            self._jumps.pop(chain, None)

    async def _transaction(self, build: Callable[[], list[str]]) -> None:
        try:
            await self._restore(build())
        except Unavailable:
            await self._load()  # someone else changed the rules: rebuild from the truth
            await self._restore(build())

    async def chain_rules(self, sandbox_id: str) -> list[str]:
        """The installed rules of one sandbox's chain, as `iptables -S` prints them."""
        chain = chain_name(sandbox_id)
        rc, out, _ = await self._run([self._binary("iptables"), "-w", "-S", chain])
        return out.splitlines() if rc == 0 else []
