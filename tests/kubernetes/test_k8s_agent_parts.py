"""The agent delivered in ConfigMaps (kubernetes/agent_parts.py) and its loader
(agent/boot/boot.c, built by `make agent`): the objects are valid and within the API
server's limits, the pod needs no init container, and the real loader joins the parts,
checks the size, closes the agent's folder and execs what it joined -- from a memfd, or
from that folder where the kernel refuses exec from a memfd."""

from __future__ import annotations

import asyncio
import base64
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from orchard.env.backends.base import SandboxSpec
from orchard.env.backends.kubernetes import agent_parts
from orchard.env.backends.kubernetes import objects as objs
from orchard.env.backends.kubernetes.agent_parts import PART_BYTES, AgentParts
from orchard.env.backends.kubernetes.objects import KubernetesOptions
from tests.kubernetes.kube_helpers import NS, fake_cluster, instant_kubelet
from tests.kubernetes.test_k8s_objects import spec, validate

LOADER = Path(__file__).resolve().parents[2] / "build" / "orchard-boot"


def test_the_real_agent_fits_configmaps_the_api_server_takes() -> None:
    parts = agent_parts.load()
    *maps, marker = parts.configmaps("orchard-sandboxes-x", {"orchard.dev/instance": "i"})
    assert len(maps) == len(parts.parts) + 1 >= 2
    joined = b"".join(base64.b64decode(m["binaryData"]["part"]) for m in maps[1:])
    assert len(joined) == parts.size and another_loader_is_another_digest(parts)
    for m in maps:
        validate(m)
        assert len(base64.b64decode(m["binaryData"]["part"])) <= PART_BYTES < 1 << 20
        assert m["immutable"] is True and m["metadata"]["labels"]["orchard.dev/agent"]
        assert m["metadata"]["name"].startswith(f"orchard-agent-{parts.digest}-")
    validate(marker)
    assert marker["metadata"]["name"] == f"orchard-agent-{parts.digest}"
    assert "binaryData" not in marker and marker["immutable"] is True


def another_loader_is_another_digest(parts: AgentParts) -> bool:
    """The digest names both binaries: another loader is another set of ConfigMaps."""
    agent = b"".join(parts.parts)
    return AgentParts.from_bytes(agent, parts.boot + b"x").digest != parts.digest


def test_the_pod_runs_the_loader_from_its_configmaps_without_an_init_container() -> None:
    parts = AgentParts.from_bytes(b"A" * (2 * PART_BYTES + 5), b"boot")
    assert [len(p) for p in parts.parts] == [PART_BYTES, PART_BYTES, 5]
    pod = objs.build_pod(spec(cmd=["sleep", "9"]), KubernetesOptions(), time.time(), parts)
    validate(pod)
    ps = pod["spec"]
    main = ps["containers"][0]
    assert "initContainers" not in ps
    assert main["command"] == [
        "/.orchard/bin/orchard-boot", str(parts.size), "/.orchard/bin/agent.", "/.orchard",
        "--", "orchard-agent",
    ]  # fmt: skip
    assert main["args"][:2] == ["--listen", ":9090"] and main["args"][-3:] == ["--", "sleep", "9"]
    mounts = {m["mountPath"]: m for m in main["volumeMounts"]}
    assert mounts["/.orchard/bin"]["readOnly"] is True and not mounts["/.orchard"].get("readOnly")
    vol = next(v for v in ps["volumes"] if "projected" in v)
    sources = vol["projected"]["sources"]
    files = [(s["configMap"]["name"], s["configMap"]["items"][0]) for s in sources]
    assert files[0] == (parts.name(None), {"key": "part", "path": "orchard-boot", "mode": 0o555})
    assert [f[1]["path"] for f in files[1:]] == ["agent.0", "agent.1", "agent.2"]
    assert vol["projected"]["defaultMode"] == 0o444
    # Without the parts, the init container brings the agent as before.
    plain = objs.build_pod(spec(), KubernetesOptions(agent_delivery="init"), time.time())
    assert plain["spec"]["initContainers"][0]["image"] == KubernetesOptions().injector_image


def test_a_bad_delivery_setting_is_refused() -> None:
    with pytest.raises(ValueError, match="configmap, image or init"):
        KubernetesOptions.from_env({"ORCHARD_K8S_AGENT_DELIVERY": "volume"})
    for delivery in ("init", "image"):
        opts = KubernetesOptions.from_env({"ORCHARD_K8S_AGENT_DELIVERY": delivery})
        assert opts.agent_delivery == delivery


def loader_setup(tmp_path: Path, payload: bytes, cut: int) -> tuple[Path, Path]:
    """PAYLOAD cut into parts of CUT bytes in tmp/bin, and a 0777 folder for the agent."""
    (tmp_path / "bin").mkdir()
    for i in range(0, len(payload), cut):
        (tmp_path / "bin" / f"agent.{i // cut}").write_bytes(payload[i : i + cut])
    own = tmp_path / "own"
    own.mkdir()
    own.chmod(0o777)
    return tmp_path / "bin" / "agent.", own


def run_loader(
    prefix: Path, own: Path, size: int, *args: str, sysctl: str | None = None
) -> subprocess.CompletedProcess[str]:
    cmd = [str(LOADER), str(size), str(prefix), str(own), "--", "echo", *args]
    if sysctl is not None:  # in a pid namespace of its own: the sysctl is per namespace
        inner = f'echo {sysctl} > /proc/sys/vm/memfd_noexec && exec "$@"'
        cmd = ["unshare", "--pid", "--fork", "sh", "-c", inner, "sh", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)


def test_the_loader_joins_the_parts_and_execs_them_from_a_memfd(tmp_path: Path) -> None:
    echo = Path(shutil.which("echo") or "/bin/echo").read_bytes()
    prefix, own = loader_setup(tmp_path, echo, 4096)
    assert len(list(prefix.parent.iterdir())) > 2
    out = run_loader(prefix, own, len(echo), "joined", "and", "run")
    assert (out.returncode, out.stdout, out.stderr) == (0, "joined and run\n", "")
    assert own.stat().st_mode & 0o777 == 0o755  # closed to the sandbox's users
    assert list(own.iterdir()) == []  # nothing on disk: it ran from the memfd


def test_the_loader_refuses_a_short_or_missing_agent(tmp_path: Path) -> None:
    echo = Path(shutil.which("echo") or "/bin/echo").read_bytes()
    prefix, own = loader_setup(tmp_path, echo, 4096)
    out = run_loader(prefix, own, len(echo) + 1, "x")
    assert out.returncode == 126 and f"hold {len(echo)} bytes, not {len(echo) + 1}" in out.stderr
    out = run_loader(tmp_path / "nowhere.", own, len(echo), "x")
    assert out.returncode == 126 and "open" in out.stderr and "No such file" in out.stderr
    bad = subprocess.run([str(LOADER), "12"], capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "usage" in bad.stderr


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)")
@pytest.mark.parametrize("noexec", ["1", "2"])
def test_where_a_memfd_may_not_run_the_loader_runs_the_agent_from_its_folder(
    tmp_path: Path, noexec: str
) -> None:
    """vm.memfd_noexec 1: memfds are made sealed against exec; 2: one that could run is
    refused at creation. Either way the agent is written to the folder (root's, 0555)."""
    if not Path("/proc/sys/vm/memfd_noexec").exists():
        pytest.skip("this kernel has no vm.memfd_noexec")
    echo = Path(shutil.which("echo") or "/bin/echo").read_bytes()
    prefix, own = loader_setup(tmp_path, echo, 4096)
    out = run_loader(prefix, own, len(echo), "from", "disk", sysctl=noexec)
    assert (out.returncode, out.stdout) == (0, "from disk\n"), out.stderr
    agent = own / "orchard-agent"
    assert agent.read_bytes() == echo and agent.stat().st_mode & 0o777 == 0o555
    assert [p.name for p in own.iterdir()] == ["orchard-agent"]


@pytest.mark.anyio
async def test_the_configmaps_are_sent_once_per_namespace_whatever_the_burst(
    tmp_path: Path,
) -> None:
    """20 creates at once on one replica send the parts once; a second replica finds them
    with one dry-run create of the marker; a replica killed half-way leaves parts that the
    next one completes."""
    parts = agent_parts.load()
    async with fake_cluster(tmp_path, kubelet=instant_kubelet) as (api, make):
        first = make()
        await asyncio.gather(*(first.create(spec_of(f"sb-a{i}")) for i in range(20)))
        posts = [(p, q) for m, p, q in api.requests if m == "POST" and "/configmaps" in p]
        assert len(posts) == len(parts.parts) + 3  # the dry run, the parts, boot, the marker
        assert sum("dryRun=All" in q for _, q in posts) == 1
        assert set(api.items("configmaps", NS)) == {
            parts.name(None), f"orchard-agent-{parts.digest}",
            *(parts.name(i) for i in range(len(parts.parts))),
        }  # fmt: skip
        api.requests.clear()
        await make().create(spec_of("sb-b"))
        queries = [q for m, p, q in api.requests if m == "POST" and "/configmaps" in p]
        assert len(queries) == 1 and "dryRun=All" in queries[0]
        # Half-way: the marker and one part gone, as if their replica died before them.
        for name in (f"orchard-agent-{parts.digest}", parts.name(1)):
            del api.objects[("configmaps", NS, name)]
        api.requests.clear()
        await make().create(spec_of("sb-c"))
        made = [
            p for m, p, q in api.requests if m == "POST" and "/configmaps" in p and "dry" not in q
        ]
        assert len(made) == len(parts.parts) + 2  # every part tried: the missing one made
        assert ("configmaps", NS, parts.name(1)) in api.objects
        assert ("configmaps", NS, f"orchard-agent-{parts.digest}") in api.objects


def spec_of(sid: str) -> SandboxSpec:
    return SandboxSpec(
        id=sid, owner="alice", image="busybox", agent_token="t", expires_at=time.time() + 60
    )
