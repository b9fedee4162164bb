"""The backend contract's scenarios: what every backend does the same, for real, through
the `Backend` protocol alone plus its host's facts (host.py). A backend that passes them
behaves the same to the service, the SDK and everything above them.

Each scenario is `async def (host) -> None` and raises ContractFailure (an AssertionError)
when the backend breaks a promise; one that needs a capability the host does not claim is
not run (`Scenario.skip_reason`).
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from orchard.env.backend_contract.host import (
    CAPABILITIES,
    Agent,
    ContractHost,
    connect,
    expect,
    owned,
    poll,
    raises,
)
from orchard.env.backends.base import SandboxSpec
from orchard.env.errors import Conflict, InvalidRequest, NotFound
from orchard.env.models import ExecResult, NetworkPolicy
from orchard.env.sdk import AsyncOrchard

CAP_NET_RAW = 13


async def lifecycle(host: ContractHost) -> None:
    """Create, reach the agent (PID 1, egress none), get and list the same record, delete."""
    async with owned(host) as backend:
        spec = host.spec(host.image, labels={"team": "a"})
        rec = await backend.create(spec)
        seen = (rec.id, rec.owner, rec.image, rec.state)
        expect(seen == (spec.id, "alice", host.image, "running"), seen)
        expect(rec.labels == {"team": "a"} and rec.network == NetworkPolicy(), rec)
        async with await connect(host, rec, spec) as agent:
            pid = (await agent.health())["pid"]
            expect(pid == 1, f"the agent is PID {pid}, not 1 in its own namespace")
            if host.facts.loopback_only:  # egress none: loopback only
                res = await agent.sh("echo hi; ls /sys/class/net")
                expect((res.exit_code, res.stdout) == (0, "hi\nlo\n"), res)
            else:
                res = await agent.sh("echo hi")
                expect((res.exit_code, res.stdout) == (0, "hi\n"), res)
        expect(await backend.get(spec.id) == rec, "get() differs from create()'s record")
        listed = [r for r in await backend.list() if r.id == spec.id]
        expect(listed == [rec], f"list() has {listed}")

        await backend.delete(spec.id)
        expect(await backend.get(spec.id) is None, "get() after delete")
        expect(await host.leftovers(spec.id) == [], await host.leftovers(spec.id))
        await backend.delete(spec.id)  # deleting what is gone is fine
        await backend.delete("../not-an-id")


async def planted_socket_symlink_is_never_followed(host: ContractHost) -> None:
    """Root in the sandbox swaps its agent socket for a symlink to a host socket (here a
    decoy server of our own): the backend keeps pointing at the real agent only."""
    hits: list[bytes] = []

    async def on_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hits.append(await reader.read(100))
        writer.close()

    with tempfile.TemporaryDirectory(prefix="orchard-decoy-") as tmp:
        decoy_path = Path(tmp) / "decoy.sock"
        decoy = await asyncio.start_unix_server(on_conn, path=str(decoy_path))
        try:
            async with owned(host) as backend:
                spec = host.spec(host.image)
                rec = await backend.create(spec)
                async with await connect(host, rec, spec) as agent:
                    swap = f"ln -s {decoy_path} /.orchard/run/agent.sock"
                    res = await agent.sh(f"rm /.orchard/run/agent.sock && {swap}")
                    expect(res.exit_code == 0, res.stderr)
                rebuilt = await backend.get(spec.id)
                expect(rebuilt is not None and rebuilt.endpoint == rec.endpoint, rebuilt)
                assert rebuilt is not None  # for mypy; checked above
                async with await connect(host, rebuilt, spec) as agent:
                    res = await agent.sh("echo still-the-agent")
                    expect(res.stdout == "still-the-agent\n", res)
                expect(hits == [], f"the decoy was reached: {hits}")
        finally:
            decoy.close()


def _limited(host: ContractHost) -> SandboxSpec:
    return host.spec(
        host.image,
        cpu=host.facts.cpu,
        memory_bytes=32 << 20,
        pids_limit=32,
        idle_timeout_s=30.0,
        user="1000",
        labels={"task": "x-1", "run": "7"},
    )


async def restart_rebuilds_records_and_limits_hold(host: ContractHost) -> None:
    """A second backend instance (a service restart) sees the same record; the user, the
    dropped capabilities and the memory limit hold."""
    async with owned(host) as backend:
        spec = _limited(host)
        rec = await backend.create(spec)
        limits = (rec.cpu, rec.memory_bytes, rec.pids_limit)
        expect(limits == (host.facts.cpu, 32 << 20, 32), limits)
        expect((rec.default_user, rec.idle_timeout_s) == ("1000", 30.0), rec)

        restarted = host.make()  # a service restart: everything comes back from the platform
        try:
            expect(await restarted.get(spec.id) == rec, "the restarted backend's record differs")
            listed = [r for r in await restarted.list() if r.id == spec.id]
            expect(listed == [rec], f"the restarted backend lists {listed}")
        finally:
            await restarted.close()

        async with await connect(host, rec, spec) as agent:
            # no-new-privileges still lets the root agent drop to another uid; 1000 is default.
            expect((await agent.sh("id -u")).stdout.strip() == "1000", "the default user")
            expect((await agent.sh("id -u", user="0")).stdout.strip() == "0", "user=0")
            status = (await agent.sh("cat /proc/1/status")).stdout
            cap_bnd = next(
                int(ln.split()[1], 16) for ln in status.splitlines() if ln.startswith("CapBnd")
            )
            expect(not cap_bnd & (1 << CAP_NET_RAW), f"CAP_NET_RAW is bounded in: {cap_bnd:x}")
            # Memory: a 48 MiB buffer in a 32 MiB sandbox is killed by the OOM killer.
            oom = await agent.sh("dd if=/dev/zero of=/dev/null bs=48M count=1", timeout_s=20)
            expect(oom.exit_code == 137, oom)


async def pids_limit_holds(host: ContractHost) -> None:
    """100 sleepers cannot all start under a limit of 32 (+ the agent's reserve)."""
    async with owned(host) as backend:
        spec = _limited(host)
        rec = await backend.create(spec)
        async with await connect(host, rec, spec) as agent:
            forks = await agent.sh("for i in $(seq 100); do sleep 30 & done", timeout_s=20)
            expect("fork" in forks.stderr.lower(), forks)


async def ipv6_is_off(host: ContractHost) -> None:
    """No IPv6 inside a sandbox, so its egress rules (IPv4) are the whole story."""
    async with owned(host) as backend:
        spec = _limited(host)
        rec = await backend.create(spec)
        async with await connect(host, rec, spec) as agent:
            res = await agent.sh("cat /proc/sys/net/ipv6/conf/all/disable_ipv6")
            expect(res.stdout.strip() in ("1", ""), res)  # "": the kernel has no IPv6 at all


async def image_config_and_cmd(host: ContractHost) -> None:
    """`cmd=[]` runs the image's own CMD under the agent with the image's ENV, WORKDIR and
    USER; no `cmd` runs no child; a given `cmd` runs instead; the token stays the agent's."""
    image = host.derived_image
    async with owned(host) as backend:
        own = host.spec(image, cmd=[])  # the image's own CMD, under the agent
        bare = host.spec(image, env={"GREETING": "override"}, workdir="/tmp")  # no child
        custom = host.spec(image, cmd=["sh", "-c", "echo custom > /tmp/cmd-ran; sleep 600"])
        recs = [await backend.create(s) for s in (own, bare, custom)]
        expect(recs[0].default_user == "1000:1000", recs[0])  # the image's USER, for execs

        async with await connect(host, recs[0], own) as agent:
            res = await agent.sh(
                "for i in $(seq 100); do [ -s /tmp/cmd-ran ] && break; sleep 0.05; done; "
                "cat /tmp/cmd-ran; pwd; echo $GREETING"
            )
            want = ["hello-from-image", "/srv/app", "hello-from-image"]
            expect(res.stdout.split() == want, res)
            environ = await agent.sh("cat /proc/$(pidof sleep)/environ | tr '\\0' '\\n'")
            expect("GREETING=hello-from-image" in environ.stdout, environ)
            expect("ORCHARD_AGENT" not in environ.stdout, "the token reaches the agent only")
            users = await agent.sh("id -u; stat -c %u /proc/$(pidof sleep) /proc/1")
            expect(users.stdout.split() == ["1000", "1000", "0"], users)

        async with await connect(host, recs[1], bare) as agent:
            res = await agent.sh("pwd; echo $GREETING; ls /tmp/cmd-ran; pidof sleep")
            expect(res.stdout.split() == ["/tmp", "override"] and res.exit_code != 0, res)

        async with await connect(host, recs[2], custom) as agent:
            res = await agent.sh(
                "for i in $(seq 100); do [ -s /tmp/cmd-ran ] && break; sleep 0.05; done; "
                "cat /tmp/cmd-ran"
            )
            expect(res.stdout == "custom\n", res)


async def _try(host: ContractHost, agent: Agent, reach: bool, settle: bool = True) -> ExecResult:
    """The egress probe, until it gets through (`reach`) or is refused, within the time a
    changed policy may take to hold on this platform (once, where it holds at once, or
    where no policy just changed: `settle=False`)."""
    probe = host.probe
    timeout = probe.timeout_s if reach else probe.blocked_timeout_s

    def through(res: ExecResult) -> bool:
        return res.exit_code == 0 and (probe.answer is None or res.stdout == probe.answer)

    res = await poll(
        lambda: agent.sh(probe.command, timeout_s=timeout),
        lambda r: through(r) if reach else r.exit_code != 0,
        host.facts.policy_settles_s if settle else 0.0,
    )
    expect(through(res) if reach else res.exit_code != 0, f"egress reach={reach}: {res}")
    return res


async def expiry_and_network_persist(host: ContractHost) -> None:
    """The expiry and the egress policy survive a restart; none, all, an allow-list without
    and with the probe's address, and none again each hold."""
    async with owned(host) as backend:
        spec = host.spec(host.image)
        rec = await backend.create(spec)
        new_expiry = rec.expires_at + 3600
        got = (await backend.set_expiry(spec.id, new_expiry)).expires_at
        expect(got == new_expiry, f"set_expiry gave {got}")

        async with await connect(host, rec, spec) as agent:
            await _try(host, agent, reach=False, settle=False)  # egress none from the start
            updated = await backend.set_network(spec.id, NetworkPolicy(egress="all"))
            expect(updated.network.egress == "all", updated.network)
            if host.facts.loopback_only:  # `all` brings an interface and a default route
                routes = await agent.sh("ls /sys/class/net; ip route")
                expect("eth0" in routes.stdout.split() and "default via" in routes.stdout, routes)

            restarted = host.make()
            try:
                seen = await restarted.get(spec.id)
                expect(seen is not None, "the restarted backend lost the sandbox")
                assert seen is not None  # for mypy; checked above
                got_back = (seen.expires_at, seen.network.egress)
                expect(got_back == (new_expiry, "all"), got_back)
                if host.facts.all_reaches_probe:
                    await _try(host, agent, reach=True)
                policy = NetworkPolicy(egress="allow", allow=["192.0.2.1/32"])
                await restarted.set_network(spec.id, policy)
                await _try(host, agent, reach=False)
                await host.check_egress(restarted, spec.id, policy)
                allowed = NetworkPolicy(egress="allow", allow=[host.probe.address])
                await restarted.set_network(spec.id, allowed)
                await _try(host, agent, reach=True)
                back = await restarted.set_network(spec.id, NetworkPolicy())
                expect(back.network.egress == "none", back.network)
                await host.check_egress(restarted, spec.id, NetworkPolicy())
            finally:
                await restarted.close()
            if host.facts.loopback_only:
                nets = (await agent.sh("ls /sys/class/net")).stdout.split()
                expect(nets == ["lo"], f"egress none, yet the sandbox has {nets}")
            else:
                await _try(host, agent, reach=False)
        seen = await backend.get(spec.id)
        expect(seen is not None and seen.network.egress == "none", seen)
        with raises(NotFound):
            await backend.set_expiry("c-no-such-sandbox", new_expiry)


async def bad_requests_and_conflicts(host: ContractHost) -> None:
    """A bad id, the reserved token variable, a bad allow-list and (where the image's own
    command cannot run) `cmd=[]` are refused; a duplicate id conflicts and harms nothing."""
    image = host.image
    async with owned(host) as backend:
        with raises(InvalidRequest):
            await backend.create(host.spec(image, id="../escape"))
        with raises(InvalidRequest):
            await backend.create(host.spec(image, env={"ORCHARD_AGENT_TOKEN": "mine"}))
        bad = NetworkPolicy(egress="allow", allow=["a b"])
        with raises(InvalidRequest):
            await backend.create(host.spec(image, network=bad))
        if not host.facts.image_config:
            with raises(InvalidRequest, match="cmd"):
                await backend.create(host.spec(image, cmd=[]))  # the image's own entrypoint
        spec = host.spec(image)
        await backend.create(spec)
        with raises(Conflict):
            await backend.create(host.spec(image, id=spec.id))
        rec = await backend.get(spec.id)
        expect(rec is not None and rec.state == "running", rec)  # the duplicate left it alone
        present = await host.present(backend)
        expect(present == [spec.id], f"the platform holds {present}")


async def exited_sandbox_is_listed_with_its_code(host: ContractHost) -> None:
    """A sandbox whose first process is killed behind the backend's back is reported exited
    with 137, by get and list, and deletes clean."""
    async with owned(host) as backend:
        spec = host.spec(host.image)
        await backend.create(spec)
        await host.kill(spec.id)
        got = await poll(  # the backend may learn it asynchronously (a pidfd, a watch)
            lambda: backend.get(spec.id),
            lambda r: r is not None and r.state == "exited",
            host.facts.exit_seen_within_s,
        )
        expect(got is not None and (got.state, got.exit_code) == ("exited", 137), got)
        listed = {r.id: r for r in await backend.list()}
        expect((listed[spec.id].state, listed[spec.id].exit_code) == ("exited", 137), listed)
        await backend.delete(spec.id)
        expect(await host.leftovers(spec.id) == [], await host.leftovers(spec.id))


async def sdk_through_the_service(host: ContractHost) -> None:
    """The whole stack (service, REST, SDK) on this backend: create, exec, files, delete."""
    with host.service() as url:
        async with AsyncOrchard(url) as client:
            backend = (await client.health()).backend
            expect(backend == host.name, f"the service runs {backend}")
            async with client.sandboxes.create(host.image, labels={"k": "v"}) as sb:
                expect((await sb.exec("echo $((6 * 7))")).stdout == "42\n", "exec")
                await sb.files.write("/tmp/x.txt", b"contract")
                expect(await sb.files.read("/tmp/x.txt") == b"contract", "files")
                ids = [s.id for s in await client.sandboxes.list(labels={"k": "v"})]
                expect(ids == [sb.id], f"listed by label: {ids}")
                sid = sb.id
    expect(await host.leftovers(sid) == [], await host.leftovers(sid))


@dataclass(frozen=True)
class Scenario:
    """One promise of the contract, and the capabilities (`Facts` flags) it needs."""

    run: Callable[[ContractHost], Awaitable[None]]
    needs: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.run.__name__

    def skip_reason(self, host: ContractHost) -> str | None:
        """Why this scenario does not apply to `host`, or None when it does."""
        missing = [n for n in self.needs if not getattr(host.facts, n)]
        if not missing:
            return None
        return f"{host.name} does not claim " + "; ".join(
            f"{n} ({CAPABILITIES[n]})" for n in missing
        )


SCENARIOS = (
    Scenario(lifecycle),
    Scenario(planted_socket_symlink_is_never_followed, needs=("host_socket",)),
    Scenario(restart_rebuilds_records_and_limits_hold),
    Scenario(pids_limit_holds, needs=("pids_limit",)),
    Scenario(ipv6_is_off, needs=("ipv6_off",)),
    Scenario(image_config_and_cmd, needs=("image_config",)),
    Scenario(expiry_and_network_persist),
    Scenario(bad_requests_and_conflicts),
    Scenario(exited_sandbox_is_listed_with_its_code),
    Scenario(sdk_through_the_service),
)
