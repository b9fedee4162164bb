"""Cold create → ready on the real node: Orchard against the kubelet's own floor.

The floor: bare pods of the same image (busybox `sleep`), with the resources an Orchard
sandbox asks for on the `local` overlay (10m cpu, 1 core limit, 128 MiB, 1 GiB disk),
created straight through the API server (the lightkube client the backend uses), each
timed from its POST to the pod watch seeing it Running with an IP. Orchard: the same
number of `sandboxes.create(image)` through the in-cluster service, each timed to its
answer (the pod Running and its agent's /health answering). Both sides send the same
number at once (`concurrency`: a bounded pool of senders, each starting its next only
once its last is up), and both end with every pod deleted and gone before the next.

Run by bench/k8s_bench.py (`make bench-k8s`), which deploys the service first.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
import httpx2
import k8s_cpu
from k8s_deploy import Kube
from lightkube import AsyncClient, KubeConfig, codecs
from lightkube.resources.core_v1 import Namespace, Pod

from orchard import Orchard
from orchard.env.backends.base import SandboxSpec
from orchard.env.backends.binaries import locate_agent_binary
from orchard.env.backends.kubernetes import agent_parts
from orchard.env.backends.kubernetes.agent_parts import AgentParts
from orchard.env.backends.kubernetes.objects import (
    KubernetesOptions,
    build_pod,
    selector,
)
from orchard.env.backends.kubernetes.policies import build_baseline_policy
from orchard.env.backends.kubernetes.tenants import build_policies, tenant_namespace

# What an Orchard sandbox's main container asks for on the `local` overlay (config.yaml).
RESOURCES = {
    "requests": {"cpu": "10m", "memory": "134217728", "ephemeral-storage": "1Gi"},
    "limits": {"cpu": "1", "memory": "134217728", "ephemeral-storage": "1Gi"},
}


def bare_pod(name: str, namespace: str, image: str, cpu: str | None = None) -> dict[str, Any]:
    """A plain `sleep` pod; `cpu`: its cpu request in cores (default RESOURCES', 10m)."""
    resources = RESOURCES
    if cpu:
        resources = {**RESOURCES, "requests": {**RESOURCES["requests"], "cpu": cpu}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"orchard.bench": "floor"}},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["sleep", "3600"],
                    "resources": resources,
                }
            ],
        },
    }


def service_pods(kube: Kube) -> list[str]:
    """The Orchard replicas' pod uids: their CPU is counted apart on both sides."""
    replicas = kube.get("pods", "-n", "orchard-system", "-l", "app.kubernetes.io/name=orchard")
    return [p["metadata"]["uid"] for p in replicas["items"]]


def orchard_pod(
    name: str, namespace: str, image: str, opts: KubernetesOptions, agent: AgentParts | None
) -> dict[str, Any]:
    """The pod Orchard's service would make for `create(image)` (objects.build_pod, the
    deployed ConfigMap's options, the agent's ConfigMaps when that is how it is delivered),
    under a bench instance the service does not reconcile."""
    spec = SandboxSpec(
        id="sb-" + name.removeprefix("floor-").rjust(12, "0"),
        owner="bench",
        image=image,
        agent_token="bench",
        expires_at=time.time() + 3600,
    )
    pod = build_pod(spec, opts, time.time(), agent)
    pod["metadata"].update(name=name, namespace=namespace)
    return pod


SHAPES = ("bare", "policy", "orchard-volumes", "orchard-pod", "orchard-hostpath",
          "orchard-configmap", "orchard-image", "orchard-tenant")  # fmt: skip
# `orchard-tenant`: Orchard's pod under both policies a tenant namespace has (tenants.py:
# default deny for every pod, and the baseline), where the others have the baseline only.
# `orchard-configmap`, `orchard-image`: Orchard's pod with that agent delivery, whatever the
# deployed ConfigMap says (`orchard-pod` is as deployed). `orchard-hostpath`: the agent run
# straight from a node folder instead. Trial cluster only (its nodes are this machine, and
# the bench copies the agent there), and not a delivery Orchard offers: Pod Security
# `baseline`, which sandbox namespaces enforce, refuses hostPath volumes
# (docs/kubernetes.md, "Against the kubelet").
DELIVERY = {"orchard-configmap": "configmap", "orchard-image": "image"}
HOSTPATH = "/var/lib/orchard-bench-agent"


def place_agent_on_node() -> None:
    folder = Path(HOSTPATH)
    folder.mkdir(mode=0o755, exist_ok=True)
    tmp = folder / ".orchard-agent.tmp"
    tmp.write_bytes(locate_agent_binary().read_bytes())
    tmp.chmod(0o555)
    tmp.rename(folder / "orchard-agent")


async def namespace_for(
    client: AsyncClient, opts: KubernetesOptions, image: str, shape: str
) -> Callable[[str], dict[str, Any]]:
    """Make `opts.namespace` as a tenant's would be for `shape` (its deny-all policy, the
    agent's ConfigMaps); return the maker of that shape's pods in it."""
    ns = opts.namespace
    if shape in DELIVERY:
        opts = replace(opts, agent_delivery=DELIVERY[shape])  # type: ignore[arg-type]
    await client.create(
        codecs.from_dict({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    )
    if shape == "orchard-tenant":  # both of a tenant namespace's policies
        for pol in build_policies(opts, "bench"):
            pol["metadata"]["namespace"] = ns
            await client.create(codecs.from_dict(pol))
    elif shape != "bare":  # and its namespace's deny-all policy (tenants.py makes it)
        await client.create(codecs.from_dict(build_baseline_policy(opts)))
    agent = agent_parts.load() if opts.agent_delivery == "configmap" else None
    if shape == "orchard-hostpath":
        place_agent_on_node()
        agent = agent or agent_parts.load()
    if shape.startswith("orchard") and agent is not None:  # as the service makes them, once
        for cm in agent.configmaps(ns, {}):
            await client.create(codecs.from_dict(cm))

    def make(name: str) -> dict[str, Any]:
        if shape in ("orchard-pod", "orchard-tenant", *DELIVERY):
            return orchard_pod(name, ns, image, opts, agent)
        if shape == "orchard-hostpath":  # the agent from a node folder (above)
            pod = orchard_pod(name, ns, image, opts, agent)
            c = pod["spec"]["containers"][0]
            c["command"] = [f"{HOSTPATH}/orchard-agent"]
            for v in pod["spec"]["volumes"]:
                if v["name"] == agent_parts.VOLUME:
                    v.pop("projected")
                    v["hostPath"] = {"path": HOSTPATH, "type": "Directory"}
            for m in c["volumeMounts"]:
                if m["name"] == agent_parts.VOLUME:
                    m["mountPath"] = HOSTPATH
            return pod
        if shape == "orchard-volumes":  # its volumes and mounts, but `sleep`: no agent
            pod = orchard_pod(name, ns, image, opts, agent)
            pod["spec"]["containers"][0].update(command=["sleep", "3600"], args=[])
            return pod
        pod = bare_pod(name, ns, image, str(opts.default_cpu))  # as the sandboxes ask
        if shape == "policy":  # selected by the deny-all policy, as a sandbox is
            pod["metadata"]["labels"].update(selector(opts))
        return pod

    return make


async def _floor(
    kubeconfig: str, image: str, n: int, concurrency: int, uids: list[str], shape: str,
    settings: dict[str, str],
) -> dict[str, Any]:  # fmt: skip
    ns = f"orchard-bench-{common.RUN_ID}"
    opts = replace(
        KubernetesOptions.from_env(settings), namespace=ns, instance=f"bench-{common.RUN_ID}"
    )
    client = AsyncClient(KubeConfig.from_file(kubeconfig), timeout=httpx2.Timeout(120))
    make = await namespace_for(client, opts, image, shape)
    running: dict[str, asyncio.Event] = {f"floor-{i}": asyncio.Event() for i in range(n)}

    async def watch() -> None:
        async for _, pod in client.watch(Pod, namespace=ns):
            st = pod.status
            if st is not None and st.phase == "Running" and st.podIP:
                ev = running.get((pod.metadata.name if pod.metadata else None) or "")
                if ev is not None:
                    ev.set()

    watcher = asyncio.create_task(watch())
    await asyncio.sleep(0.5)  # the watch is open before the first create
    times: list[float] = []
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with sem:
            t = time.monotonic()
            await client.create(codecs.from_dict(make(f"floor-{i}")))
            await running[f"floor-{i}"].wait()
            times.append(time.monotonic() - t)

    t0, cpu0 = time.monotonic(), k8s_cpu.sample(uids)
    try:
        with common.perf_window(f"k8s-{shape}-{common.RUN_ID}"):
            await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(n))), 1800)
        wall, cpu = time.monotonic() - t0, k8s_cpu.per_pod(cpu0, k8s_cpu.sample(uids), n)
    finally:
        watcher.cancel()
        await client.delete(Namespace, ns)
        await client.close()
    return {"wall_s": wall, "pods_per_s": n / wall, "cpu_ms": cpu, **common.summarize(times)}


def floor(kube: Kube, image: str, n: int, concurrency: int, shape: str = "bare") -> dict[str, Any]:
    """Pods created through the API, timed to Running; the namespace gone after. `shape`:
    `bare` (one container), `policy` (the same under the deny-all policy a tenant namespace
    has), `orchard-pod`: Orchard's own pod (the agent's delivery, its limits, the policy)
    without the service, which tells the pod's cost from the service's, or
    `orchard-volumes`: that pod running `sleep`, which tells the delivery's cost (its
    volumes) from the agent's."""
    if shape not in SHAPES:
        raise ValueError(f"shape {shape!r} is not one of {', '.join(SHAPES)}")
    settings = kube.get("configmap", "orchard", "-n", "orchard-system").get("data") or {}
    r = asyncio.run(
        _floor(kube.kubeconfig, image, n, concurrency, service_pods(kube), shape, settings)
    )
    r["teardown_s"] = _wait_namespace_gone(kube, f"orchard-bench-{common.RUN_ID}")
    return r


def _wait_namespace_gone(kube: Kube, ns: str, timeout_s: float = 600) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if not kube.run("get", "namespace", ns, "--ignore-not-found", "-o", "name").strip():
            break
        time.sleep(1)
    return time.monotonic() - t0


def orchard_cold(
    kube: Kube, url: str, key: str, owner: str, image: str, n: int, concurrency: int
) -> dict[str, Any]:
    """n `sandboxes.create(image)` through the service, `concurrency` at a time."""
    times: list[float] = []
    ids: list[str] = []
    failures: list[str] = []
    lock = threading.Lock()
    with Orchard(base_url=url, api_key=key) as c:

        def one(i: int) -> None:
            t = time.monotonic()
            try:
                sb = c.sandboxes.create(image, labels={"bench": common.RUN_ID, "i": str(i)})
            except Exception as e:
                with lock:
                    failures.append(f"{type(e).__name__}: {e}")
                return
            with lock:
                times.append(time.monotonic() - t)
                ids.append(sb.id)

        uids = service_pods(kube)
        t0, cpu0 = time.monotonic(), k8s_cpu.sample(uids)
        with (
            common.perf_window(f"k8s-orchard-{common.RUN_ID}"),
            ThreadPoolExecutor(concurrency) as ex,
        ):
            list(ex.map(one, range(n)))
        wall, cpu = time.monotonic() - t0, k8s_cpu.per_pod(cpu0, k8s_cpu.sample(uids), len(ids))
        with ThreadPoolExecutor(16) as ex:
            list(ex.map(c.sandboxes.delete, ids))
    teardown = kube.wait_no_pods(tenant_namespace(KubernetesOptions(), owner))
    for f in failures[:5]:
        print(f"create failed: {f}", file=sys.stderr)
    return {
        "wall_s": wall,
        "pods_per_s": len(times) / wall,
        "success": len(times) / n,
        "failures": failures[:20],
        "teardown_s": teardown,
        "cpu_ms": cpu,
        **common.summarize(times),
    }


def measure(
    kube: Kube, url: str, key: str, owner: str, image: str, n: int, concurrency: int
) -> tuple[dict[str, Any], str]:
    """The bare floor, Orchard's pod without the service, then Orchard, each begun on a
    settled node (k8s_cpu.settle: the side before it torn down, its deletes a minute past);
    their results, the ratios to the floor, and the tables as Markdown."""
    waited = [k8s_cpu.settle()]
    fl = floor(kube, image, n, concurrency)
    print(f"floor: {n} pods in {fl['wall_s']:.1f} s, p50 {fl['p50_ms']:.0f} ms", file=sys.stderr)
    waited.append(k8s_cpu.settle(time.monotonic()))
    pod = floor(kube, image, n, concurrency, shape="orchard-pod")
    print(f"pod: {n} in {pod['wall_s']:.1f} s, p50 {pod['p50_ms']:.0f} ms", file=sys.stderr)
    waited.append(k8s_cpu.settle(time.monotonic()))
    orc = orchard_cold(kube, url, key, owner, image, n, concurrency)
    for r, w in zip((fl, pod, orc), waited, strict=True):
        r["settled_s"] = round(w, 1)
    print(f"orchard: {n} in {orc['wall_s']:.1f} s, p50 {orc['p50_ms']:.0f} ms", file=sys.stderr)
    if orc["success"] < 1:  # a ratio of failed creates would read as a fast Orchard
        raise RuntimeError(
            f"{round((1 - orc['success']) * n)} of {n} creates failed: {orc['failures'][:1]}"
        )
    ratio = {
        "wall": orc["wall_s"] / fl["wall_s"],
        "p50": orc["p50_ms"] / fl["p50_ms"],
        "p99": orc["p99_ms"] / fl["p99_ms"],
        "pod_wall": pod["wall_s"] / fl["wall_s"],
        "cpu": orc["cpu_ms"]["total"] / max(fl["cpu_ms"]["total"], 1e-9),
    }
    rows = [
        ("kubelet floor: bare pod -> Running", fl),
        ("Orchard's pod, no service -> Running", pod),
        ("Orchard: create -> ready", orc),
    ]
    md = common.table(
        f"cold create -> ready, N = {n}, {concurrency} at once",
        ["what", "wall s", "pods/s", "p50 ms", "p99 ms", "node CPU ms/pod"],
        [
            *([w, r["wall_s"], r["pods_per_s"], r["p50_ms"], r["p99_ms"], r["cpu_ms"]["total"]]
              for w, r in rows),
            ["ratio Orchard / floor", ratio["wall"], float("nan"), ratio["p50"], ratio["p99"],
             ratio["cpu"]],
        ],
    )  # fmt: skip
    parts = [k for k in orc["cpu_ms"] if any(r["cpu_ms"][k] for _, r in rows)]
    md += "\n\n" + common.table(
        "node CPU per pod while they start (ms; bench/k8s_cpu.py)",
        ["part", "kubelet floor", "Orchard's pod", "Orchard", "Orchard - floor"],
        [
            [k, fl["cpu_ms"][k], pod["cpu_ms"][k], orc["cpu_ms"][k],
             orc["cpu_ms"][k] - fl["cpu_ms"][k]]
            for k in parts
        ],
    )  # fmt: skip
    return {"floor": fl, "orchard_pod": pod, "orchard": orc, "ratio": ratio}, md
