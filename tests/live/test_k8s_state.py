"""Sandbox state on a real cluster (issue 26): pause/resume and diffs through the node
helper DaemonSet (node/, deploy/kubernetes/base/node.yaml), used from outside through
the in-cluster service, as the other live tests. The freezer and the upper dir are the
node's own: this machine is the node, so the tests also look at them from the host."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchard import Orchard
from orchard.env.backends.kubernetes.node import node_token
from orchard.env.errors import Conflict, EgressDenied, NotFound
from tests.live.conftest import Deployed, cordoned, kget, kubectl, leaving_nothing, nodes, tenant_ns

NS, HELPER_NS, PORT = tenant_ns("alice"), "orchard-node", 9091  # alice: `client`'s owner
RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
# cluster.sh's kubelet: cgroupfs driver, cgroup v1.
CGROUPS = Path("/sys/fs/cgroup")


@dataclass
class Helper:
    ip: str
    node: str
    key: str

    def url(self, path: str) -> str:
        return f"http://{self.ip}:{PORT}{path}"


@pytest.fixture(scope="module")
def helper(deployed: Deployed) -> Helper:
    """The DaemonSet's pod on node 1, once it is ready."""
    kubectl("-n", HELPER_NS, "rollout", "status", "daemonset/orchard-node", "--timeout=180s",
            timeout=200)  # fmt: skip
    pods = kget("pods", "-n", HELPER_NS, "-l", "app.kubernetes.io/name=orchard-node")["items"]
    first, _ = nodes()
    live = [
        p
        for p in pods
        if not p["metadata"].get("deletionTimestamp") and p["spec"]["nodeName"] == first
    ]
    assert len(live) == 1, [p["metadata"]["name"] for p in live]
    return Helper(live[0]["status"]["podIP"], live[0]["spec"]["nodeName"], deployed.node_key)


@pytest.fixture(scope="module", autouse=True)
def on_node_1() -> Iterator[None]:
    """This module's sandboxes on node 1 (node 2, if up, cordoned meanwhile): the tests read
    their cgroups at the host's root and dial the helper from the host, which the firewall
    admits to node 1's pods only. test_k8s_snapshots.py runs on both nodes."""
    with cordoned(nodes()[1]):
        yield


@pytest.fixture
def client(deployed: Deployed, helper: Helper) -> Iterator[Orchard]:
    with leaving_nothing(deployed) as c:
        yield c


def pod_of(sandbox_id: str) -> dict[str, Any]:
    pods = kget("pods", "-n", NS, "-l", f"orchard.dev/sandbox={sandbox_id}")["items"]
    assert len(pods) == 1, pods
    return dict(pods[0])


def container_cgroup(pod: dict[str, Any], controller: str) -> Path:
    """The sandbox container's cgroup on this node (the kubelet's cgroupfs layout)."""
    cid = next(
        c["containerID"].split("://")[1]
        for c in pod["status"]["containerStatuses"]
        if c["name"] == "sandbox"
    )
    found = list((CGROUPS / controller / "kubepods").glob(f"**/pod{pod['metadata']['uid']}/{cid}"))
    assert len(found) == 1, found
    return found[0]


def cpu_ns(cgroup: Path) -> int:
    return int((cgroup / "cpuacct.usage").read_text())


def counted(freezer: Path) -> int:
    """COUNTER's value read from the node, through a frozen process's own root: the
    sandbox cannot answer an exec while paused, and the host's view needs no CPU of it."""
    pid = (freezer / "cgroup.procs").read_text().split()[0]
    return int(Path(f"/proc/{pid}/root/tmp/n").read_text())


def report(name: str, values: dict[str, Any]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "k8s_state.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[name] = values
    path.write_text(json.dumps(data, indent=2) + "\n")
    print(f"\nkubernetes {name}: {json.dumps(values)}")


COUNTER = "i=0; while true; do i=$((i+1)); echo $i > /tmp/t; mv /tmp/t /tmp/n; done"


def test_pause_stops_a_busy_loop_and_resume_continues_it(
    client: Orchard, deployed: Deployed, sandbox_image: str
) -> None:
    with client.sandboxes.create(sandbox_image, timeout_s=300) as sb:
        loop = sb.process.start(COUNTER)
        time.sleep(0.5)
        pod = pod_of(sb.id)
        cpu, freezer = container_cgroup(pod, "cpuacct"), container_cgroup(pod, "freezer")
        pauses, resumes = [], []
        for _ in range(5):
            before = int(sb.exec("cat /tmp/n").stdout)
            t = time.monotonic()
            assert sb.pause().status == "paused"
            pauses.append(time.monotonic() - t)
            # The kernel's view: frozen, no CPU at all and a counter that stands still.
            assert (freezer / "freezer.state").read_text().strip() == "FROZEN"
            used, held = cpu_ns(cpu), counted(freezer)
            time.sleep(1.0)
            assert cpu_ns(cpu) - used == 0, "a paused sandbox used CPU"
            assert counted(freezer) == held >= before, (before, held)
            t = time.monotonic()
            assert sb.resume().status == "ready"
            resumes.append(time.monotonic() - t)
            assert (freezer / "freezer.state").read_text().strip() == "THAWED"
            # Memory kept: the same process counts on from where it stopped.
            a = int(sb.exec("cat /tmp/n").stdout)
            time.sleep(0.2)
            assert int(sb.exec("cat /tmp/n").stdout) > a >= held, (held, a)
        assert sb.process.get(loop.id).status == "running"
        pauses.sort()
        resumes.sort()
        report(
            "pause_resume",
            {
                "pause_p50_ms": round(1000 * pauses[2], 1),
                "pause_max_ms": round(1000 * pauses[-1], 1),
                "resume_p50_ms": round(1000 * resumes[2], 1),
                "resume_max_ms": round(1000 * resumes[-1], 1),
            },
        )


def test_a_paused_sandbox_refuses_calls_on_every_replica(
    client: Orchard, deployed: Deployed, sandbox_image: str
) -> None:
    """Paused is the cluster's state (the pod's annotation), not one replica's: whichever
    replica answers, the sandbox is paused and refuses its data path with 409."""
    with client.sandboxes.create(sandbox_image, timeout_s=300) as sb:
        assert sb.pause().status == "paused"
        assert pod_of(sb.id)["metadata"]["annotations"]["orchard.dev/paused"] == "true"
        for _ in range(6):  # the NodePort spreads these over both replicas
            assert client.sandboxes.get(sb.id).refresh().status == "paused"
            for call in (lambda: sb.exec("true"), lambda: sb.files.read("/etc/passwd")):
                with pytest.raises(Conflict) as err:
                    call()
                assert err.value.code == "sandbox_paused"
        assert sb.pause().status == "paused"  # pausing a paused sandbox is fine
        assert sb.resume().status == "ready"
        assert sb.resume().status == "ready"  # and resuming a running one
        assert "orchard.dev/paused" not in (pod_of(sb.id)["metadata"].get("annotations") or {})
        assert sb.exec("echo back").stdout == "back\n"


def test_a_paused_sandbox_is_deleted_at_once(client: Orchard, sandbox_image: str) -> None:
    """Thawed first: a frozen container cannot act on the kubelet's SIGTERM, and would
    hold its pod for the grace period."""
    sb = client.sandboxes.create(sandbox_image, timeout_s=300)
    sb.pause()
    t = time.monotonic()
    sb.delete()
    deadline = time.monotonic() + 30
    while kget("pods", "-n", NS, "-l", f"orchard.dev/sandbox={sb.id}")["items"]:
        assert time.monotonic() < deadline, "the paused sandbox's pod stayed"
        time.sleep(0.2)
    gone = time.monotonic() - t
    assert gone < 8, f"the pod took {gone:.1f} s to go (its grace period is 10 s)"


def test_diff_add_modify_delete(client: Orchard, sandbox_image: str) -> None:
    with client.sandboxes.create(sandbox_image, timeout_s=300) as sb:
        first = sb.files.diff()
        assert (first.added, first.modified, first.deleted) == ([], [], [])
        sb.exec(
            "mkdir /new && echo a > /new/a && echo x >> /etc/passwd && rm /etc/group"
            " && echo r > /tmp/r && mv /tmp/r /tmp/renamed && rm -rf /usr/sbin"
            " && mkdir /usr/sbin && echo again > /usr/sbin/mine && rm /bin/vi"
        )
        sb.files.write("/root/written.txt", b"through the file API\n")
        d = sb.files.diff()
        assert d.added == ["/new", "/new/a", "/root/written.txt", "/tmp/renamed", "/usr/sbin/mine"]
        assert d.modified == ["/etc/passwd"]
        # /usr/sbin was deleted and made anew (an opaque dir): what it held is deleted.
        sbin = sorted(
            "/usr/sbin/" + n
            for n in subprocess.run(
                ["docker", "run", "--rm", "--entrypoint", "/bin/ls", sandbox_image, "/usr/sbin"],
                capture_output=True, text=True, check=True,
            ).stdout.split()
        )  # fmt: skip
        assert d.deleted == sorted(["/bin/vi", "/etc/group", *sbin])
        # The same while paused (the helper reads the upper dir of a frozen container).
        sb.pause()
        paused = sb.files.diff()
        assert (paused.added, paused.modified, paused.deleted) == (d.added, d.modified, d.deleted)
        sb.resume()
        # Since a snapshot: one that does not exist is not found (the rest:
        # tests/live/test_k8s_snapshots.py).
        with pytest.raises(NotFound):
            sb.files.diff(since="snap-000000000000")


def test_another_tenant_cannot_pause_resume_or_diff(
    deployed: Deployed, helper: Helper, sandbox_image: str
) -> None:
    with (
        deployed.client("alice") as alice,
        deployed.client("bob") as bob,
        alice.sandboxes.create(sandbox_image, timeout_s=300) as sb,
    ):
        with httpx.Client(base_url=deployed.url, headers={"X-API-Key": deployed.keys["bob"]}) as h:
            for method, path in (
                ("POST", "pause"), ("POST", "resume"), ("GET", "diff"),
            ):  # fmt: skip
                r = h.request(method, f"/v1/sandboxes/{sb.id}/{path}")
                assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", r.text
        with pytest.raises(NotFound):
            bob.sandboxes.get(sb.id)
        assert sb.refresh().status == "ready"
        assert sb.exec("echo still-running").stdout == "still-running\n"


def test_the_helper_needs_its_nodes_token_and_no_sandbox_reaches_it(
    client: Orchard, helper: Helper, sandbox_image: str
) -> None:
    with client.sandboxes.create(sandbox_image, timeout_s=300) as sb:
        pod = pod_of(sb.id)
        cid = next(c for c in pod["status"]["containerStatuses"] if c["name"] == "sandbox")
        state = helper.url(
            f"/v1/pods/{pod['metadata']['uid']}/containers/"
            f"{cid['containerID'].split('://')[1]}/state"
        )
        # From the node (the firewall lets a node reach its pods): no anonymous access,
        # and no other node's token, nor a token of another key.
        for headers in (
            {},
            {"Authorization": "Bearer"},
            {"Authorization": f"Bearer {node_token(helper.key, 'another-node')}"},
            {"Authorization": f"Bearer {node_token('another key, as long', helper.node)}"},
        ):
            r = httpx.get(state, headers=headers, timeout=10)
            assert r.status_code == 401 and r.json()["code"] == "unauthorized", headers
        ok = {"Authorization": f"Bearer {node_token(helper.key, helper.node)}"}
        r = httpx.get(state, headers=ok, timeout=10)
        assert r.status_code == 200 and r.json()["frozen"] is False, r.text
        # From sandboxes: never, whatever their egress, and no allow-list may name it.
        probe = f"nc -w 3 {helper.ip} {PORT} </dev/null"
        assert sb.exec(probe, timeout_s=10).exit_code != 0
        with client.sandboxes.create(
            sandbox_image, timeout_s=300, network={"egress": "all"}
        ) as open_sb:
            assert open_sb.exec(probe, timeout_s=10).exit_code != 0
        with pytest.raises(EgressDenied):
            client.sandboxes.create(
                sandbox_image, timeout_s=300,
                network={"egress": "allow", "allow": [f"{helper.ip}/32"]},
            )  # fmt: skip


# The in-cluster registry (docs/kubernetes.md, "In-cluster registry"): the name images
# carry, and the trial overlay's fixed ClusterIP, which this machine (the node) dials.
REGISTRY_NAME, REGISTRY_IP = "orchard-registry.orchard-system.svc:5000", "10.96.0.50:5000"
MANIFESTS = ", ".join(
    (
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    )
)


def test_the_helper_commits_a_sandbox_as_an_image_the_node_runs(
    client: Orchard, helper: Helper, sandbox_image: str
) -> None:
    """The helper's commit (what snapshots will build on): the sandbox's changes as one
    layer over its image, pushed to the in-cluster registry; a pod from that image, pulled
    by the node's containerd, has the sandbox's files."""
    repo, tag = "orchard/test-commits", f"t-{int(time.time() * 1000)}"
    ns = "orchard-test-commit"
    registry = f"http://{REGISTRY_IP}/v2/{repo}"
    with client.sandboxes.create(sandbox_image, timeout_s=300) as sb:
        sb.exec("mkdir /made && echo committed > /made/file && rm /etc/group")
        pod = pod_of(sb.id)
        cs = next(c for c in pod["status"]["containerStatuses"] if c["name"] == "sandbox")
        path = f"/v1/pods/{pod['metadata']['uid']}/containers/{cs['containerID'].split('://')[1]}"
        ok = {"Authorization": f"Bearer {node_token(helper.key, helper.node)}"}
        body = {"image": cs["imageID"], "repository": repo, "tag": tag}
        r = httpx.post(helper.url(path + "/commit"), json=body, headers=ok, timeout=300)
        assert r.status_code == 200, r.text
        made = r.json()
        assert sb.exec("echo still-running").stdout == "still-running\n"  # thawed after
    try:
        m = httpx.get(f"{registry}/manifests/{tag}", headers={"Accept": MANIFESTS}, timeout=30)
        assert m.status_code == 200 and m.headers["Docker-Content-Digest"] == made["digest"]
        assert m.json()["layers"][-1]["digest"] == made["layer"]["digest"]
        report("commit", {"took_ms": made["took_ms"], "layer_bytes": made["layer"]["size"]})
        kubectl("create", "namespace", ns)
        container = {
            "name": "c",
            "image": f"{REGISTRY_NAME}/{repo}@{made['digest']}",
            "command": ["/bin/sh", "-c", "cat /made/file; ls /etc/group 2>&1 || true"],
        }
        spec = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "from-commit", "namespace": ns},
            "spec": {
                "restartPolicy": "Never",
                "automountServiceAccountToken": False,
                "containers": [container],
            },
        }
        kubectl("apply", "-f", "-", input_text=json.dumps(spec))
        deadline = time.monotonic() + 120
        while (phase := kget("pod", "-n", ns, "from-commit")["status"].get("phase")) not in (
            "Succeeded",
            "Failed",
        ):
            assert time.monotonic() < deadline, f"the pod from the commit is still {phase}"
            time.sleep(0.5)
        out = kubectl("-n", ns, "logs", "from-commit").stdout
        # stdout and stderr interleave in either order in a pod's log, so both go to stdout.
        assert out.startswith("committed\n") and "No such file" in out, out
    finally:
        kubectl("delete", "namespace", ns, "--ignore-not-found", "--wait=false", check=False)
        head = httpx.head(f"{registry}/manifests/{tag}", headers={"Accept": MANIFESTS}, timeout=30)
        if head.status_code == 200:
            httpx.delete(
                f"{registry}/manifests/{head.headers['Docker-Content-Digest']}", timeout=30
            )
