"""The kubernetes backend's data path, for real: the control plane is FakeKubeAPIServer (a
fake), but each pod it is asked for is started on the Docker engine by DockerKubelet, from
the pod spec the backend wrote. The agent arrives either way the backend delivers it:
from the namespace's ConfigMaps (projected read-only into the container, where the real
loader joins the parts into a memfd and execs the agent), from the injector image mounted
read-only (an image volume: here the image's files unpacked into a folder bound read-only,
where the agent runs in place), or by the init container, which
copies it with the real injector program out of a `FROM scratch` injector image into a
shared folder (the emptyDir). The main container runs the user's image with the pod's
command, args, env, user and capabilities. The container's bridge IP is reported as the pod
IP, so the service reaches the agent over TCP with the token, exactly as it reaches a pod IP."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchard.env.backends.base import AgentEndpoint
from orchard.env.config import ServiceConfig
from orchard.env.models import SandboxCreate
from orchard.env.server.service import SandboxService
from tests.agent_routes import typed
from tests.conftest import TEST_LABELS
from tests.kubernetes.fake_apiserver import FakeKubeAPIServer, Obj
from tests.kubernetes.kube_helpers import NS, fake_cluster

pytestmark = pytest.mark.anyio
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def injector_image(agent_binary: Path, docker_ready: None, tmp_path_factory: Any) -> str:
    """The injector image, built offline: FROM scratch + the agent + orchard-inject."""
    work = tmp_path_factory.mktemp("injector")
    inject = work / "orchard-inject"
    subprocess.run(
        ["go", "build", "-o", str(inject), "."],
        cwd=REPO / "deploy/kubernetes/images/injector",
        env={**os.environ, "CGO_ENABLED": "0"},
        check=True,
    )
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for src, name in ((agent_binary, "orchard-agent"), (inject, "orchard-inject")):
            info = tar.gettarinfo(str(src), arcname=name)
            info.mode, info.uid, info.gid = 0o755, 0, 0
            with src.open("rb") as f:
                tar.addfile(info, f)
    tag = "orchard-test/agent-injector:latest"
    subprocess.run(
        ["docker", "import", "-", tag], input=buf.getvalue(), check=True, capture_output=True
    )
    return tag


class DockerKubelet:
    """Plays kubelet for the fake API server: runs each pod as Docker containers."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="orch-k8s-"))
        self.containers: dict[str, str] = {}
        self.started: list[Obj] = []

    @staticmethod
    async def _docker(*args: str) -> str:
        proc = await asyncio.create_subprocess_exec(
            "docker", *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        out, err = await proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"docker {args[0]} failed: {err.decode()}")
        return out.decode().strip()

    @staticmethod
    def _labels() -> list[str]:
        return [a for k, v in TEST_LABELS.items() for a in ("--label", f"{k}={v}")]

    async def start(self, api: FakeKubeAPIServer, pod: Obj) -> None:
        name, spec = pod["metadata"]["name"], pod["spec"]
        self.started.append(pod)
        empty_dir = self.root / name / spec["volumes"][0]["name"]
        empty_dir.mkdir(parents=True)
        empty_dir.chmod(0o777)  # as a kubelet makes an emptyDir
        for vol in spec["volumes"][1:]:  # projected ConfigMaps (the agent's parts), or
            folder = self.root / name / vol["name"]  # an image volume: the image's files
            folder.mkdir()
            if "image" in vol:
                await self._unpack(vol["image"]["reference"], folder)
                continue
            maps = api.items("configmaps", NS)
            for src in vol["projected"]["sources"]:
                data = maps[src["configMap"]["name"]]["binaryData"]
                for item in src["configMap"]["items"]:
                    (folder / item["path"]).write_bytes(base64.b64decode(data[item["key"]]))
                    (folder / item["path"]).chmod(item.get("mode", vol["projected"]["defaultMode"]))
        inits = spec.get("initContainers", [])
        for c in [*inits, *spec["containers"]]:
            args = ["--name", f"orchard-k8s-{name}-{c['name']}", *self._labels()]
            args += ["--user", str(c["securityContext"]["runAsUser"])]
            args += [f"--cap-drop={cap}" for cap in c["securityContext"]["capabilities"]["drop"]]
            if c["securityContext"].get("readOnlyRootFilesystem"):
                args.append("--read-only")
            for m in c["volumeMounts"]:
                ro = ":ro" if m.get("readOnly") else ""
                args += ["-v", f"{self.root / name / m['name']}:{m['mountPath']}{ro}"]
            for e in c.get("env", []):
                args += ["-e", f"{e['name']}={e['value']}"]
            limits = c["resources"]["limits"]
            args += ["--memory", limits["memory"].replace("Mi", "m")]
            if c.get("workingDir"):
                args += ["-w", c["workingDir"]]
            args += ["--entrypoint", c["command"][0], c["image"], *c["command"][1:]]
            args += c.get("args", [])
            if c in inits:
                await self._docker("run", "--rm", "--network", "none", *args)
                continue
            cid = await self._docker("run", "-d", *args)
            self.containers[name] = cid
            info = json.loads(await self._docker("inspect", cid))[0]
            ip = info["NetworkSettings"]["IPAddress"]
            await api.run_pod(NS, name, ip)

    async def _unpack(self, image: str, folder: Path) -> None:
        """The image's files in `folder`, mounted read-only as a runtime mounts an image volume."""
        cid = await self._docker("create", *self._labels(), image, "none")
        try:
            proc = await asyncio.create_subprocess_shell(
                f"docker export {cid} | tar -x -C {folder}", stderr=subprocess.PIPE
            )
            _, err = await proc.communicate()
            if proc.returncode != 0:
                raise RuntimeError(f"docker export failed: {err.decode()}")
        finally:
            await self._docker("rm", "-f", cid)

    async def stop(self, api: FakeKubeAPIServer, pod: Obj) -> None:
        cid = self.containers.pop(pod["metadata"]["name"], None)
        if cid:
            await self._docker("rm", "-f", cid)

    def close(self) -> None:
        for cid in self.containers.values():
            subprocess.run(["docker", "rm", "-f", cid], capture_output=True, check=False)
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.mark.parametrize("delivery", ["configmap", "image", "init"])
async def test_exec_and_files_reach_the_pod_ip_with_the_token(
    tmp_path: Path, injector_image: str, busybox_image: str, delivery: str
) -> None:
    kubelet = DockerKubelet()
    try:
        async with fake_cluster(tmp_path, kubelet=kubelet.start, on_delete=kubelet.stop) as (
            api,
            make,
        ):
            backend = make(
                injector_image=injector_image, image_pull_policy="Never", agent_delivery=delivery
            )
            config = ServiceConfig(state_dir=tmp_path / "svc", secret=b"s", backend="kubernetes")
            svc = SandboxService(config, backend)
            started = time.monotonic()
            sb = await svc.create(
                "alice",
                SandboxCreate(
                    image=busybox_image,
                    cmd=["sh", "-c", "echo started > /tmp/child; exec sleep 3600"],
                    env={"GREETING": "hello"},
                    workdir="/tmp",
                    memory="256m",
                ),
            )
            assert sb.status == "ready", sb
            ready_s = time.monotonic() - started
            rec = await backend.get(sb.id)
            assert rec is not None and rec.endpoint.base_url is not None
            url = rec.endpoint.base_url
            ip = api.pods(NS)[f"orchard-{sb.id}"]["status"]["podIP"]
            assert url == f"http://{ip}:9090"

            agent = typed(await svc.agent("alice", sb.id))
            res = await agent.exec("echo $GREETING from $(pwd); cat /tmp/child; id -u")
            assert res.exit_code == 0
            assert res.stdout.split("\n")[:3] == ["hello from /tmp", "started", "0"]
            # The agent dropped the token from the environment of what it runs.
            env = await agent.exec(["env"])
            assert "ORCHARD_AGENT_TOKEN" not in env.stdout and "GREETING=hello" in env.stdout
            await agent.write_file("/work/data.bin", bytes(range(256)) * 64)
            assert await agent.read_file("/work/data.bin") == bytes(range(256)) * 64
            # Straight over TCP: /health is open, everything else needs this sandbox's token.
            async with httpx.AsyncClient(base_url=url, timeout=5) as raw:
                assert (await raw.get("/health")).status_code == 200
                assert (await raw.post("/exec", json={"cmd": "id"})).status_code == 401
                other = {"Authorization": f"Bearer {config.agent_token('sb-other')}"}
                assert (
                    await raw.post("/exec", json={"cmd": "id"}, headers=other)
                ).status_code == 401
                mine = {"Authorization": f"Bearer {config.agent_token(sb.id)}"}
                ok = await raw.post("/exec", json={"cmd": ["true"]}, headers=mine)
                assert ok.status_code == 200

            # Another replica that saw the pod before it had an IP (its watch lagging under
            # load) reads it again rather than failing the call (it answered 500 once).
            replica = SandboxService(
                config, make(image_pull_policy="Never", agent_delivery=delivery)
            )
            replica._records[sb.id] = dataclasses.replace(
                rec, state="pending", endpoint=AgentEndpoint()
            )
            again = typed(await replica.agent("alice", sb.id))
            assert (await again.exec("echo $GREETING")).stdout == "hello\n"
            await replica.stop()

            # The agent runs from a sealed memfd (no path the sandbox can write), or from the
            # emptyDir the init container filled; either way the folder is root's, 0755.
            where = await agent.exec("readlink /proc/1/exe; stat -c %a:%u /.orchard")
            exe, mode, *_ = [*where.stdout.splitlines(), "", ""]
            if delivery == "configmap":
                assert exe.startswith("/memfd:orchard-agent"), where.stdout
                assert "initContainers" not in kubelet.started[0]["spec"]
            elif delivery == "image":  # in place, from the read-only image
                assert exe == "/.orchard/bin/orchard-agent", where.stdout
                assert "initContainers" not in kubelet.started[0]["spec"]
                denied = await agent.exec("touch /.orchard/bin/x 2>&1 || echo denied")
                assert "denied" in denied.stdout, denied
            else:
                assert exe == "/.orchard/orchard-agent", where.stdout
            assert mode == "755:0", where.stdout
            # The pod spec's agent port and the emptyDir path are what actually ran.
            assert kubelet.started[0]["spec"]["containers"][0]["args"][:2] == ["--listen", ":9090"]
            # Nothing went through the API server's exec/attach path.
            assert not [p for _, p, _ in api.requests if "/exec" in p or "/attach" in p]

            await svc.delete("alice", sb.id)
            assert sb.id in backend.retired.mine  # removed only after a quiet second
            # Retired (backends/kubernetes/retire.py): nothing runs or answers any more but
            # /health, and the pod goes once no create or delete came for a second.
            async with httpx.AsyncClient(base_url=url, timeout=5) as raw:
                with contextlib.suppress(httpx.TransportError):  # or gone already
                    late = await raw.post("/exec", json={"cmd": ["true"]}, headers=mine)
                    assert late.status_code == 410, late.text
            deadline = time.monotonic() + 30
            while api.pods(NS):
                assert time.monotonic() < deadline, "the retired pod was never removed"
                await asyncio.sleep(0.1)
            with pytest.raises(httpx.TransportError):
                async with httpx.AsyncClient(base_url=url, timeout=1) as raw:
                    await raw.get("/health")
            await svc.stop()
            assert ready_s < 30
    finally:
        kubelet.close()
