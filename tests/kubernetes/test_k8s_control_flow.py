"""The kubernetes backend's control flow against FakeKubeAPIServer (a fake API server that
speaks the real wire format; no cluster can run here): create, watch to running, delete,
reconcile, expiry, retries on 409/429/5xx, stuck pods, and two replicas racing."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from lightkube import codecs

from orchard.env.backends.base import SandboxSpec
from orchard.env.backends.kubernetes import objects as objs
from orchard.env.backends.kubernetes.policies import never_reached
from orchard.env.config import ServiceConfig
from orchard.env.errors import (
    Conflict,
    EgressDenied,
    ImageNotFound,
    ImageRefused,
    InvalidRequest,
    RegistryUnavailable,
    SandboxExited,
    Unavailable,
)
from orchard.env.models import NetworkPolicy, SandboxCreate
from orchard.env.server.service import SandboxService
from tests.kubernetes.fake_apiserver import FakeKubeAPIServer, Obj
from tests.kubernetes.kube_helpers import NS, fake_cluster, instant_kubelet

pytestmark = pytest.mark.anyio


def spec(sid: str, **kw: object) -> SandboxSpec:
    base: dict[str, object] = {
        "id": sid,
        "owner": "alice",
        "image": "python:3.12-slim",
        "agent_token": "t0k3n",
        "expires_at": time.time() + 600,
        "cmd": ["sleep", "infinity"],
    }
    base.update(kw)
    return SandboxSpec(**base)  # type: ignore[arg-type]


async def until(cond: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


async def test_create_watch_to_running_get_list_delete(tmp_path: Path) -> None:
    async with fake_cluster(tmp_path, kubelet=instant_kubelet) as (api, make):
        backend = make()
        rec = await backend.create(spec("sb-one", labels={"task": "x/1"}))
        assert rec.state == "running" and rec.owner == "alice"
        pod = api.pods(NS)["orchard-sb-one"]
        ip = pod["status"]["podIP"]
        assert rec.endpoint.base_url == f"http://{ip}:9090" and rec.endpoint.socket_path is None
        assert rec.labels == {"task": "x/1"}
        # The token is in the pod spec as an env var; nothing else carries it.
        env = pod["spec"]["containers"][0]["env"]
        assert {"name": "ORCHARD_AGENT_TOKEN", "value": "t0k3n"} in env
        assert pod["spec"]["automountServiceAccountToken"] is False
        # A baseline default-deny policy exists; egress none needs no per-sandbox policy.
        assert set(api.items("networkpolicies", NS)) == {"orchard-baseline-default"}
        await until(lambda: backend._synced)
        assert [r.id for r in await backend.list()] == ["sb-one"]
        got = await backend.get("sb-one")
        assert got is not None and got.endpoint == rec.endpoint
        await backend.delete("sb-one")
        assert api.pods(NS) == {}
        assert await backend.get("sb-one") is None
        await backend.delete("sb-one")  # gone already: fine
        await until(lambda: not backend._pods)
        assert await backend.list() == []
        # Exec and files never go through the API server.
        assert not [p for _, p, _ in api.requests if p.endswith(("/exec", "/attach"))]


async def test_expiry_and_network_change_at_run_time(tmp_path: Path) -> None:
    async with fake_cluster(tmp_path, kubelet=instant_kubelet) as (api, make):
        backend = make()
        allow = NetworkPolicy(egress="allow", allow=["198.51.100.0/24", "192.0.2.7"])
        await backend.create(spec("sb-net", network=allow))
        npol = api.items("networkpolicies", NS)["orchard-sb-net"]
        pod = api.pods(NS)["orchard-sb-net"]
        assert npol["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
        blocks = [p["ipBlock"]["cidr"] for p in npol["spec"]["egress"][0]["to"]]
        assert blocks == ["198.51.100.0/24", "192.0.2.7/32"]

        rec = await backend.set_network("sb-net", NetworkPolicy(egress="all"))
        assert rec.network.egress == "all"
        npol = api.items("networkpolicies", NS)["orchard-sb-net"]
        never = [str(n) for n in never_reached(backend.opts)]
        assert npol["spec"]["egress"] == [
            {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": never}}]}
        ]
        # `all` never reaches private ranges (the cluster) nor the metadata service.
        assert {"10.0.0.0/8", "169.254.0.0/16", "192.168.0.0/16"} <= set(never)
        rec = await backend.set_network("sb-net", NetworkPolicy())
        assert rec.network.egress == "none" and "orchard-sb-net" not in api.items(
            "networkpolicies", NS
        )
        new_expiry = time.time() + 3600
        rec = await backend.set_expiry("sb-net", new_expiry)
        assert rec.expires_at == new_expiry
        got = await backend.get("sb-net")
        assert got is not None and got.expires_at == new_expiry and got.network.egress == "none"
        # Deleting the pod takes its policy with it.
        await backend.set_network("sb-net", allow)
        await backend.delete("sb-net")
        assert set(api.items("networkpolicies", NS)) == {"orchard-baseline-default"}


async def test_cilium_is_detected_and_gets_fqdn_rules(tmp_path: Path) -> None:
    async with fake_cluster(tmp_path, kubelet=instant_kubelet, cilium=True) as (api, make):
        backend = make(cilium="auto")
        policy = NetworkPolicy(egress="allow", allow=["files.example.org", "198.51.100.0/24"])
        await backend.create(spec("sb-cil", network=policy))
        cnp = api.items("ciliumnetworkpolicies", NS)["orchard-sb-cil"]
        assert {"toFQDNs": [{"matchName": "files.example.org"}]} in cnp["spec"]["egress"]
        assert {"toCIDRSet": [{"cidr": "198.51.100.0/24"}]} in cnp["spec"]["egress"]
        assert "orchard-sb-cil" not in api.items("networkpolicies", NS)
        await backend.delete("sb-cil")
        assert api.items("ciliumnetworkpolicies", NS) == {}
    async with fake_cluster(tmp_path, kubelet=instant_kubelet) as (api, make):
        backend = make(cilium="auto")  # no Cilium: plain NetworkPolicy with ipBlocks
        await backend.create(spec("sb-std", network=NetworkPolicy(egress="all")))
        assert "orchard-sb-std" in api.items("networkpolicies", NS)


async def test_retries_on_429_5xx_and_409_with_backoff(tmp_path: Path) -> None:
    async with fake_cluster(tmp_path, kubelet=instant_kubelet) as (api, make):
        backend = make()
        api.fail("POST", "pods", 429, times=2, retry_after="0")
        api.fail("POST", "pods", 503, times=1)
        await backend.create(spec("sb-retry"))
        assert sum(1 for m, p, _ in api.requests if m == "POST" and p.endswith("/pods")) == 4
        api.fail("PATCH", "pods", 409, times=2, reason="Conflict")
        api.fail("PATCH", "pods", 500, times=1)
        rec = await backend.set_expiry("sb-retry", time.time() + 99)
        assert rec.state == "running"
        api.fail("GET", "pods", 504, times=1)
        assert await backend.get("sb-retry") is not None
        # AlreadyExists is a real conflict, not a transient one: no retry.
        before = len(api.requests)
        with pytest.raises(Conflict):
            await backend.create(spec("sb-retry"))
        assert sum(1 for m, _, _ in api.requests[before:] if m == "POST") == 1
        # Retries are bounded: a server that keeps failing gives 503, not a hang.
        api.fail("DELETE", "pods", 500, times=99)
        with pytest.raises(Unavailable, match="500"):
            await make(retries=2).delete("sb-retry")


async def test_unschedulable_pod_reports_scheduler_reason_and_is_removed(tmp_path: Path) -> None:
    reason = "0/3 nodes are available: 3 Insufficient cpu."

    async def scheduler(api: FakeKubeAPIServer, pod: Obj) -> None:
        cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
        await api.set_status(
            NS, pod["metadata"]["name"], {"conditions": [{**cond, "message": reason}]}
        )

    async with fake_cluster(tmp_path, kubelet=scheduler) as (api, make):
        backend = make(pending_timeout_s=0.4)
        with pytest.raises(Unavailable) as err:
            await backend.create(spec("sb-big", cpu=64.0))
        assert reason in err.value.message and err.value.details == {
            "reason": f"Unschedulable: {reason}"
        }
        assert api.pods(NS) == {}


@pytest.mark.parametrize(
    ("reason", "message", "error"),
    [
        ("ErrImagePull", 'failed to pull "nope:1": manifest unknown', ImageNotFound),
        ("ImagePullBackOff", "Back-off pulling image: dial tcp: i/o timeout", RegistryUnavailable),
        ("InvalidImageName", 'invalid reference format "UPPER"', ImageNotFound),
        ("CreateContainerConfigError", 'secret "x" not found', InvalidRequest),
    ],
)
async def test_image_and_config_failures_are_clear_errors(
    tmp_path: Path, reason: str, message: str, error: type[Exception]
) -> None:
    async def kubelet(api: FakeKubeAPIServer, pod: Obj) -> None:
        waiting = {"waiting": {"reason": reason, "message": message}}
        status = {"name": "sandbox", "ready": False, "restartCount": 0, "image": "", "imageID": ""}
        await api.set_status(
            NS, pod["metadata"]["name"], {"containerStatuses": [{**status, "state": waiting}]}
        )

    async with fake_cluster(tmp_path, kubelet=kubelet) as (api, make):
        with pytest.raises(error) as err:
            await make().create(spec("sb-img"))
        assert message in str(err.value)
        assert api.pods(NS) == {}


async def test_exited_pod_and_set_network_on_it(tmp_path: Path) -> None:
    async with fake_cluster(tmp_path, kubelet=instant_kubelet) as (api, make):
        backend = make()
        await backend.create(spec("sb-exit"))
        term = {"terminated": {"exitCode": 3, "reason": "Error"}}
        cs = {"name": "sandbox", "ready": False, "restartCount": 0, "image": "", "imageID": ""}
        await api.set_status(
            NS, "orchard-sb-exit", {"phase": "Failed", "containerStatuses": [{**cs, "state": term}]}
        )
        rec = await backend.get("sb-exit")
        assert rec is not None and rec.state == "exited" and rec.exit_code == 3
        with pytest.raises(SandboxExited):
            await backend.set_network("sb-exit", NetworkPolicy(egress="all"))
        oom = {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}
        await api.set_status(NS, "orchard-sb-exit", {"containerStatuses": [{**cs, "state": oom}]})
        rec = await backend.get("sb-exit")
        assert rec is not None and rec.state == "failed" and rec.error == "out of memory"


async def test_watch_keeps_cache_and_recovers_from_410_gone(tmp_path: Path) -> None:
    async with fake_cluster(tmp_path, kubelet=instant_kubelet) as (api, make):
        a, b = make(), make()
        await a.create(spec("sb-w1"))
        await b.list()  # starts b's watch
        await until(lambda: b._synced and "sb-w1" in b._pods)
        ip = api.pods(NS)["orchard-sb-w1"]["status"]["podIP"]
        assert b._pods["sb-w1"]["status"]["podIP"] == ip
        # Changes made by another replica reach b through its watch alone.
        await a.set_expiry("sb-w1", 1234.5)
        await until(lambda: b._pods["sb-w1"]["metadata"]["annotations"][objs.A_EXPIRES] == "1234.5")
        lists_before = sum(1 for m, _, q in api.requests if m == "GET" and "watch" not in q)
        assert [r.expires_at for r in await b.list()] == [1234.5]
        lists_after = sum(1 for m, _, q in api.requests if m == "GET" and "watch" not in q)
        assert lists_after == lists_before  # served from the cache
        # The watch drops while the pod is deleted and the history compacted: b's resumed
        # watch gets 410 Gone, lists again, and forgets the pod.
        await api.drop_watches()
        await a.delete("sb-w1")
        api.compact()
        await until(lambda: "sb-w1" not in b._pods)
        await b.create(spec("sb-w2"))
        await until(lambda: "sb-w2" in b._pods and b._synced)
        assert [r.id for r in await b.list()] == ["sb-w2"]


async def test_api_concurrency_is_bounded(tmp_path: Path) -> None:
    async with fake_cluster(tmp_path, kubelet=instant_kubelet) as (api, make):
        backend = make(api_concurrency=3)
        await backend.create(spec("sb-c"))
        api.latency_s = 0.03
        api.max_in_flight = 0
        results = await asyncio.gather(*(backend.get("sb-c") for _ in range(20)))
        assert all(r is not None for r in results)
        assert api.max_in_flight == 3


async def test_refused_credentials_are_unavailable(tmp_path: Path) -> None:
    async with fake_cluster(tmp_path) as (api, make):
        backend = make()
        api.token = "rotated"
        with pytest.raises(Unavailable, match="refused"):
            await backend.get("sb-x")


async def test_invalid_requests(tmp_path: Path) -> None:
    async with fake_cluster(tmp_path, kubelet=instant_kubelet) as (api, make):
        backend = make()
        with pytest.raises(InvalidRequest):
            await backend.create(spec("Not_A_Name"))
        with pytest.raises(InvalidRequest, match="entrypoint"):
            await backend.create(spec("sb-e", cmd=[]))
        with pytest.raises(InvalidRequest, match="reserved"):
            await backend.create(spec("sb-e", env={"ORCHARD_AGENT_TOKEN": "x"}))
        assert await backend.get("Not_A_Name") is None
        await backend.delete("Not_A_Name")
        assert api.pods(NS) == {}


# ---------------------------------------------------------------- service level


def service(tmp_path: Path, backend: object, name: str) -> SandboxService:
    config = ServiceConfig(state_dir=tmp_path / name, secret=b"shared-secret", backend="kubernetes")
    return SandboxService(config, backend)  # type: ignore[arg-type]


async def test_two_replicas_race_expiry_and_reconcile(tmp_path: Path) -> None:
    async with fake_cluster(tmp_path, kubelet=instant_kubelet) as (api, make):
        one, two = service(tmp_path, make(), "r1"), service(tmp_path, make(), "r2")
        req = SandboxCreate(image="busybox", cmd=["sleep", "60"], timeout_s=0.5, wait=False)
        made = [await one.create("alice", req) for _ in range(3)]
        keep = await two.create("alice", req.model_copy(update={"timeout_s": 600}))
        # Both replicas see every sandbox, whoever made it; the token is the same HMAC.
        listed = {s.id for s in await two.list_sandboxes("alice")}
        assert listed == {s.id for s in [*made, keep]}
        pod = api.pods(NS)[f"orchard-{made[0].id}"]
        env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
        assert env["ORCHARD_AGENT_TOKEN"] == two.config.agent_token(made[0].id)
        await asyncio.sleep(0.6)
        removed = await asyncio.gather(one.reconcile(), two.reconcile())
        expired = sorted(removed[0]["expired"] + removed[1]["expired"])
        # Each expired sandbox is removed by one replica or both (deleting the gone is fine).
        assert set(expired) == {s.id for s in made}
        assert set(api.pods(NS)) == {f"orchard-{keep.id}"}
        assert [s.id for s in await one.list_sandboxes("alice")] == [keep.id]
        assert await two.list_sandboxes("bob") == []


async def test_reconcile_removes_pods_stuck_pending(tmp_path: Path) -> None:
    async with fake_cluster(tmp_path) as (api, make):
        backend = make(pending_timeout_s=30)
        # A pod a crashed replica created long ago; no kubelet ever started it.
        body = objs.build_pod(spec("sb-stuck"), backend.opts, time.time() - 60)
        backend2 = make(pending_timeout_s=30)
        svc = service(tmp_path, backend2, "r")
        await backend.client.create(codecs.from_dict(body))
        removed = await svc.reconcile()
        assert removed["orphan"] == ["sb-stuck"]
        assert api.pods(NS) == {}


def _verb(method: str, path: str, query: str) -> tuple[str, str]:
    parts = path.strip("/").split("/")
    plural = parts[parts.index("namespaces") + 2]
    named = len(parts) > parts.index("namespaces") + 3
    if method == "GET":
        verb = "watch" if "watch=true" in query else ("get" if named else "list")
    else:
        verb = {"POST": "create", "DELETE": "delete", "PATCH": "patch", "PUT": "update"}[method]
    return plural, verb


async def test_the_role_grants_exactly_what_the_backend_calls(tmp_path: Path) -> None:
    """Least privilege, checked against the calls a whole lifecycle makes (with Cilium)."""
    import yaml

    rbac = Path(__file__).resolve().parents[2] / "deploy/kubernetes/base/rbac.yaml"
    role = next(d for d in yaml.safe_load_all(rbac.read_text()) if d["kind"] == "Role")
    granted = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    used: set[tuple[str, str]] = set()
    for cilium in (True, False):
        async with fake_cluster(tmp_path, kubelet=instant_kubelet, cilium=cilium) as (api, make):
            backend = make(cilium="auto")
            await backend.create(spec("sb-r", network=NetworkPolicy(egress="all")))
            await until(lambda b=backend: b._synced)
            await backend.list()
            await backend.set_expiry("sb-r", time.time() + 60)
            await backend.set_network("sb-r", NetworkPolicy(egress="allow", allow=["198.51.100.1"]))
            await backend.set_network("sb-r", NetworkPolicy())
            await backend.set_network("sb-r", NetworkPolicy(egress="all"))
            await backend.delete("sb-r")
            used |= {_verb(*r) for r in api.requests}
    assert used <= granted, used - granted
    assert granted <= used, f"granted but never used: {granted - used}"


async def test_private_registries_and_cluster_ranges_are_refused(tmp_path: Path) -> None:
    """The kubelet pulls from the node, so the registry policy applies as on docker/local;
    an allow entry inside the cluster's ranges is refused, a wider one trimmed."""
    async with fake_cluster(tmp_path, kubelet=instant_kubelet) as (api, make):
        backend = make()
        with pytest.raises(ImageRefused):
            await backend.create(spec("sb-img", image="127.0.0.1:5000/probe:x"))
        assert "orchard-sb-img" not in api.pods(NS)
        inside = NetworkPolicy(egress="allow", allow=["10.244.0.7/32"])
        with pytest.raises(EgressDenied):
            await backend.create(spec("sb-in", network=inside))
        wide = NetworkPolicy(egress="allow", allow=["0.0.0.0/0"])
        await backend.create(spec("sb-wide", network=wide))
        block = api.items("networkpolicies", NS)["orchard-sb-wide"]["spec"]["egress"][0]["to"][0]
        assert "10.0.0.0/8" in block["ipBlock"]["except"]
