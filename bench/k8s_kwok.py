"""Control-plane scale with kwok: thousands of pods on hundreds of fake Nodes, on one machine.

kwok (deploy/cluster/kwok.sh) plays the kubelet for Nodes annotated kwok.x-k8s.io/node=fake:
they turn Ready and keep a Lease, and a pod bound to one turns Running with an IP at once,
while nothing runs at all. What is left to measure is what a real cluster of that size asks
of its control plane, with no agent and no container runtime in the way:

  (a) bare pods straight through the API, N (5000) in batches (1000), at most C (32) POSTs
      in flight: admission (the POST's latency), create → Running as a watch sees it, wall;
  (b) the control plane's memory (RSS from /proc of etcd, kube-apiserver, the scheduler,
      the controller manager, kube-proxy, kube-router and kwok) and CPU seconds, before the
      Nodes, with the Nodes, after every batch, and after the pods are gone: MiB per 1,000
      pods; and etcd's database size;
  (c) Orchard's own control plane with no agent: the Kubernetes backend
      (src/orchard/env/backends/kubernetes), in this process, creating M (1000) sandboxes
      onto the fake Nodes through its settings' node selector and tolerations
      (ORCHARD_K8S_NODE_SELECTOR / ORCHARD_K8S_TOLERATIONS: create = pod POST, then its
      watch until Running with an IP; the service would call the agent next), then a fresh
      backend as a new replica would start: its watch's sync time and cache memory per 1,000
      sandboxes (tracemalloc), the reconcile's list pass from that cache, and the deletes.
      Its instance label is this run's own, so a deployed Orchard never adopts them.

The fake Nodes carry the label type=kwok and the taint kwok.x-k8s.io/node=fake:NoSchedule,
so only pods that tolerate it land there (a DaemonSet that tolerates every taint, like
Orchard's node helper, does too: it is counted and left to the garbage collector).
Everything lives in the namespace orchard-kwok-<run id> and the Nodes kwok-<run id>-<i>;
on the way out, even after a failure or Ctrl-C, the namespace goes first (while kwok still
finishes the pods' deletions), then the Nodes, then kwok. Results:
bench/results/k8s_kwok.json and a table (the one in docs/kubernetes.md).

Needs root on the cluster's machine (the trial cluster of deploy/cluster/cluster.sh: its
components' pid files under /run/orchard-cluster) and go (kwok is built once, cached):

    .venv/bin/python bench/k8s_kwok.py --kubeconfig $(bash deploy/cluster/cluster.sh kubeconfig)
    .venv/bin/python bench/k8s_kwok.py --kubeconfig K --nodes 200 --pods 5000 --batch 1000 \\
        --concurrency 32 --orchard-pods 1000     # the defaults; --orchard-pods 0 skips (c)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import subprocess
import sys
import time
import tracemalloc
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
import httpx2
import k8s_cpu
import k8s_floor
from k8s_deploy import Kube
from lightkube import AsyncClient, KubeConfig, codecs
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Node, Pod
from lightkube.types import on_error_retry

from orchard.env import images
from orchard.env.backends.base import SandboxSpec
from orchard.env.backends.kubernetes.backend import KubernetesBackend
from orchard.env.backends.kubernetes.objects import KubernetesOptions

KWOK_SH = common.ROOT / "deploy" / "cluster" / "kwok.sh"
KWOK_PID = (
    Path(os.environ.get("ORCHARD_CLUSTER_STATE", "/var/lib/orchard-cluster")) / "kwok/kwok.pid"
)
COMPONENTS = (
    "etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kube-proxy",
    "kube-router",
)  # fmt: skip
FAKE_KEY, FAKE_VALUE = "kwok.x-k8s.io/node", "fake"
NODE_LABELS = {"type": "kwok"}
TOLERATIONS = [{"key": FAKE_KEY, "operator": "Exists", "effect": "NoSchedule"}]
BENCH = f"kwok-{common.RUN_ID}"  # the orchard.bench label of everything made here
NAMESPACE = f"orchard-kwok-{common.RUN_ID}"
# Never pulled: no container runtime ever sees a pod on a fake Node.
IMAGE = "orchard.local/pause:1"
# A big real node's (and what Orchard's pods request: ephemeral-storage too).
SIZE = {"cpu": "32", "memory": "256Gi", "ephemeral-storage": "1Ti", "pods": "110"}


# ---------------------------------------------------------------- objects


def fake_node(name: str) -> dict[str, Any]:
    """A Node kwok manages (its annotation), sized like a big real one, tainted so that
    nothing lands there without asking."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {FAKE_KEY: FAKE_VALUE, "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                **NODE_LABELS,
                common.BENCH_LABEL: BENCH,
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
            },
        },
        "spec": {"taints": [{"key": FAKE_KEY, "value": FAKE_VALUE, "effect": "NoSchedule"}]},
        "status": {
            "allocatable": {**SIZE},
            "capacity": {**SIZE},
        },
    }


def kwok_pod(name: str) -> dict[str, Any]:
    """The floor's bare pod (the size of an Orchard sandbox on the local overlay), sent to
    the fake Nodes."""
    pod = k8s_floor.bare_pod(name, NAMESPACE, IMAGE)
    pod["metadata"]["labels"] = {common.BENCH_LABEL: BENCH}
    pod["spec"].update(nodeSelector=NODE_LABELS, tolerations=TOLERATIONS)
    return pod


# ---------------------------------------------------------------- control-plane sampling


def _pids() -> dict[str, int]:
    return {**k8s_cpu.cluster_pids(COMPONENTS), **k8s_cpu.cluster_pids(("kwok",), KWOK_PID.parent)}


def etcd_db_mib() -> float:
    """etcd's database file (its metrics port, loopback): what the pods cost on disk."""
    url = "http://127.0.0.1:2381/metrics"
    with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("etcd_mvcc_db_total_size_in_bytes "):
                return float(line.split()[1]) / 2**20
    return float("nan")


def sample(label: str, pods: int) -> dict[str, Any]:
    pids = _pids()
    return {
        "at": label,
        "pods": pods,
        "rss_mib": {n: common.rss_mib(p) for n, p in pids.items()},
        "cpu_s": {n: k8s_cpu.proc_cpu_s(p) for n, p in pids.items()},
        "etcd_db_mib": etcd_db_mib(),
    }


def per_1000(before: dict[str, Any], after: dict[str, Any], pods: int) -> dict[str, float]:
    """MiB of RSS each component grew by per 1,000 pods between two samples."""
    k = pods / 1000
    return {
        n: (after["rss_mib"][n] - before["rss_mib"][n]) / k
        for n in after["rss_mib"]
        if n in before["rss_mib"]
    }


# ---------------------------------------------------------------- helpers


def _client(kubeconfig: str) -> AsyncClient:
    return AsyncClient(KubeConfig.from_file(kubeconfig), timeout=httpx2.Timeout(120))


async def _bounded(n: int, limit: int, fn: Callable[[int], Awaitable[Any]]) -> None:
    sem = asyncio.Semaphore(limit)

    async def one(i: int) -> None:
        async with sem:
            await fn(i)

    await asyncio.gather(*(one(i) for i in range(n)))


def _ready(node: Any) -> bool:
    conds = (node.status.conditions if node.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conds)


async def make_nodes(client: AsyncClient, n: int, concurrency: int) -> dict[str, Any]:
    """Create the Nodes; wait until kwok has them all Ready (and the controller manager has
    given them pod CIDRs, which kwok draws the pods' IPs from)."""
    t0 = time.monotonic()
    await _bounded(
        n, concurrency, lambda i: client.create(codecs.from_dict(fake_node(f"{BENCH}-{i}")))
    )
    created = time.monotonic() - t0
    ready = 0
    while time.monotonic() - t0 < 300:
        nodes = [x async for x in client.list(Node, labels={common.BENCH_LABEL: BENCH})]
        ready = sum(1 for x in nodes if _ready(x) and x.spec and x.spec.podCIDR)
        if ready >= n:
            break
        await asyncio.sleep(1)
    if ready < n:
        raise RuntimeError(f"only {ready} of {n} fake Nodes Ready with a pod CIDR after 300 s")
    return {"n": n, "create_s": created, "ready_s": time.monotonic() - t0}


async def _delete_pods(
    client: AsyncClient, names: list[str], concurrency: int, timeout_s: float = 600
) -> dict[str, Any]:
    """The pods, one DELETE each with `concurrency` in flight (one delete-collection of
    thousands outlasts the API server's 60 s request timeout), timed until a watch has
    seen them all gone (kwok finishes each deletion); then what is left."""
    gone = 0
    done = asyncio.Event()
    latency: list[float] = []

    async def watch() -> None:
        nonlocal gone
        async for kind, _ in client.watch(Pod, namespace=NAMESPACE, on_error=on_error_retry):
            if kind == "DELETED":
                gone += 1
                if gone >= len(names):
                    done.set()

    async def delete(i: int) -> None:
        t = time.monotonic()
        with contextlib.suppress(Exception):  # what is left is counted below
            await client.delete(Pod, names[i], namespace=NAMESPACE)
            latency.append(time.monotonic() - t)

    watcher = asyncio.create_task(watch())
    await asyncio.sleep(1)  # open (its first events are the pods as they are)
    t0 = time.monotonic()
    try:
        await _bounded(len(names), concurrency, delete)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), timeout_s)
        took = time.monotonic() - t0
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watcher
    left = len([p async for p in client.list(Pod, namespace=NAMESPACE, chunk_size=500)])
    return {"delete_s": took, "delete": common.summarize(latency), "seen_deleted": gone,
            "left": left}  # fmt: skip


# ---------------------------------------------------------------- (a) + (b): bare pods


async def bare_pods(
    client: AsyncClient, n: int, batch: int, concurrency: int, samples: list[dict[str, Any]]
) -> dict[str, Any]:
    names = [f"pod-{i}" for i in range(n)]
    running: dict[str, asyncio.Event] = {x: asyncio.Event() for x in names}
    seen_at: dict[str, float] = {}
    posted_at: dict[str, float] = {}
    admission: list[float] = []
    errors: list[str] = []

    async def watch() -> None:
        async for _, pod in client.watch(Pod, namespace=NAMESPACE, on_error=on_error_retry):
            st, meta = pod.status, pod.metadata
            name = meta.name if meta and meta.name else ""
            if st is not None and st.phase == "Running" and st.podIP and name not in seen_at:
                seen_at[name] = time.monotonic()
                if ev := running.get(name):
                    ev.set()

    watcher = asyncio.create_task(watch())
    await asyncio.sleep(0.5)  # the watch is open before the first create
    batches: list[dict[str, Any]] = []
    t0 = time.monotonic()
    try:
        for start in range(0, n, batch):
            chunk = names[start : start + batch]
            tb = time.monotonic()

            async def post(i: int, chunk: list[str] = chunk) -> None:
                name = chunk[i]
                t = time.monotonic()
                posted_at[name] = t
                try:
                    await client.create(codecs.from_dict(kwok_pod(name)))
                except Exception as e:  # counted, not fatal: the rest still measure
                    errors.append(f"{name}: {e}")
                    running[name].set()
                    return
                admission.append(time.monotonic() - t)

            await _bounded(len(chunk), concurrency, post)
            posted = time.monotonic() - tb
            await asyncio.wait_for(asyncio.gather(*(running[x].wait() for x in chunk)), timeout=900)
            done = start + len(chunk)
            batches.append({"pods": done, "post_s": posted, "running_s": time.monotonic() - tb})
            samples.append(sample(f"{done} pods", done))
            print(f"  {done} pods Running ({time.monotonic() - t0:.1f} s)", flush=True)
        wall = time.monotonic() - t0
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watcher
    to_running = [seen_at[x] - posted_at[x] for x in names if x in seen_at and x in posted_at]
    return {
        "n": n,
        "batch": batch,
        "concurrency": concurrency,
        "wall_s": wall,
        "pods_per_s": n / wall,
        "admission": common.summarize(admission),
        "to_running": common.summarize(to_running),
        "errors": len(errors),
        "first_errors": errors[:5],
        "batches": batches,
    }


# ---------------------------------------------------------------- (c): Orchard's backend


def _options(kubeconfig: str) -> KubernetesOptions:
    """What ORCHARD_K8S_NODE_SELECTOR / ORCHARD_K8S_TOLERATIONS give a kwok pool; this run's
    own namespace and instance (no deployed service selects them); one replica's settings."""
    return KubernetesOptions(
        namespace=NAMESPACE,
        instance=BENCH,
        kubeconfig=kubeconfig,
        node_selector=dict(NODE_LABELS),
        tolerations=[dict(t) for t in TOLERATIONS],
        default_cpu=0.01,
        default_cpu_limit=1.0,
        default_memory_bytes=128 << 20,
        ephemeral_storage="1Gi",
        cilium="off",
        pending_timeout_s=900,
    )


async def orchard_backend(kubeconfig: str, m: int, concurrency: int) -> dict[str, Any]:
    opts = _options(kubeconfig)
    backend = KubernetesBackend(opts)
    image = images.busybox_image()
    ids = [f"kwok{common.RUN_ID}{i}" for i in range(m)]
    creates: list[float] = []
    deletes: list[float] = []
    errors: list[str] = []

    async def create(i: int) -> None:
        spec = SandboxSpec(
            id=ids[i], owner="alice", image=image, agent_token="unused-no-agent",
            expires_at=time.time() + 3600, cmd=["sleep", "3600"],
        )  # fmt: skip
        t = time.monotonic()
        try:
            await backend.create(spec)
        except Exception as e:
            errors.append(f"create {ids[i]}: {e}")
            return
        creates.append(time.monotonic() - t)

    out: dict[str, Any] = {"n": m, "concurrency": concurrency}
    try:
        t0 = time.monotonic()
        await _bounded(m, concurrency, create)
        out["create_wall_s"] = time.monotonic() - t0
        out["creates_per_s"] = m / out["create_wall_s"]
        out["create"] = common.summarize(creates)
        print(f"  Orchard backend: {len(creates)} sandboxes Running", flush=True)
        out.update(await _replica_view(opts, len(creates)))
        t0 = time.monotonic()

        async def delete(i: int) -> None:
            t = time.monotonic()
            try:
                await backend.delete(ids[i])
            except Exception as e:
                errors.append(f"delete {ids[i]}: {e}")
                return
            deletes.append(time.monotonic() - t)

        await _bounded(m, concurrency, delete)
        out["delete_wall_s"] = time.monotonic() - t0
        out["delete"] = common.summarize(deletes)
    finally:
        await backend.close()
    out["errors"] = len(errors)
    out["first_errors"] = errors[:5]
    return out


async def _replica_view(opts: KubernetesOptions, m: int) -> dict[str, Any]:
    """A fresh backend, as a replica starting up: its watch's sync (list + cache) timed and
    its memory traced; then the reconcile's list pass (records from the cache) timed."""
    fresh = KubernetesBackend(opts)
    try:
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        t0 = time.monotonic()
        await fresh.list()  # starts the watch (and, until it syncs, lists through the API)
        while not fresh._synced or len(fresh._pods) < m:  # the cache itself, as the service
            if time.monotonic() - t0 > 300:
                break
            await asyncio.sleep(0.05)
        sync_s = time.monotonic() - t0
        gc.collect()
        cache_bytes = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        passes: list[float] = []
        for _ in range(5):
            t = time.monotonic()
            records = await fresh.list()
            passes.append(time.monotonic() - t)
        cached = len(fresh._pods)
    finally:
        await fresh.close()
    return {
        "replica_sync_s": sync_s,
        "replica_cached": cached,
        "replica_cache_mib": cache_bytes / 2**20,
        "replica_cache_mib_per_1000": cache_bytes / 2**20 / (max(cached, 1) / 1000),
        "reconcile_list": common.summarize(passes),
        "reconcile_records": len(records),
    }


# ---------------------------------------------------------------- run


def _p(d: dict[str, Any], unit: float = 1.0, fmt: str = ".0f", name: str = "ms") -> str:
    """'p50 X, p99 Y' of a summarize() result, in ms (or s with unit=1000)."""
    return f"p50 {d['p50_ms'] / unit:{fmt}} {name}, p99 {d['p99_ms'] / unit:{fmt}} {name}"


def _report(out: dict[str, Any]) -> str:
    a, mem = out["pods"], out["memory"]
    nodes, pods = mem["with_nodes"], mem["with_pods"]
    k = a["n"] / 1000
    rows: list[list[Any]] = [
        ["fake Nodes Ready", out["nodes"]["n"], f"{out['nodes']['ready_s']:.1f} s"],
        ["bare pods: POST (admission)", f"{a['n']}, {a['concurrency']} in flight",
         _p(a["admission"])],
        ["bare pods: create → Running", a["n"], _p(a["to_running"], 1000, ".2f", "s")],
        ["bare pods: wall", a["n"], f"{a['wall_s']:.1f} s ({a['pods_per_s']:.1f} pods/s)"],
        ["bare pods: DELETE", a["n"], _p(a["delete"])],
        ["bare pods: all gone", a["n"], f"{a['delete_s']:.1f} s"],
    ]  # fmt: skip
    for comp in ("kube-apiserver", "etcd", "kube-scheduler", "kube-controller-manager", "kwok"):
        if comp in mem["per_1000_pods_mib"]:
            was, now = nodes["rss_mib"][comp], pods["rss_mib"][comp]
            grew = mem["per_1000_pods_mib"][comp]
            rows.append(
                [f"{comp} RSS", f"{was:.0f} → {now:.0f} MiB", f"{grew:+.1f} MiB / 1,000 pods"]
            )
    db0, db1 = nodes["etcd_db_mib"], pods["etcd_db_mib"]
    rows.append(
        ["etcd database", f"{db0:.1f} → {db1:.1f} MiB", f"{(db1 - db0) / k:+.1f} MiB / 1,000 pods"]
    )
    if c := out.get("orchard"):
        per = c["replica_cache_mib_per_1000"]
        rows += [
            ["Orchard backend: create → Running", f"{c['n']}, {c['concurrency']} at once",
             f"{_p(c['create'], 1000, '.2f', 's')}, {c['creates_per_s']:.1f}/s"],
            ["Orchard replica: watch sync", f"{c['replica_cached']} sandboxes",
             f"{c['replica_sync_s']:.2f} s"],
            ["Orchard replica: watch cache", f"{c['replica_cache_mib']:.1f} MiB",
             f"{per:.1f} MiB / 1,000 sandboxes"],
            ["Orchard reconcile: list pass", f"{c['reconcile_records']} records",
             f"p50 {c['reconcile_list']['p50_ms']:.1f} ms"],
            ["Orchard backend: delete", c["n"],
             f"{_p(c['delete'])}, {c['delete_wall_s']:.1f} s wall"],
        ]  # fmt: skip
    return common.table("Control-plane scale (kwok)", ["what", "n", "result"], rows)


async def amain(args: argparse.Namespace, out: dict[str, Any]) -> None:
    """Fills `out` as it goes: what was measured is written even if a later part fails."""
    samples: list[dict[str, Any]] = [sample("before Nodes", 0)]
    out["samples"] = samples
    client = _client(args.kubeconfig)
    try:
        meta = ObjectMeta(name=NAMESPACE, labels={common.BENCH_LABEL: BENCH})
        await client.create(Namespace(metadata=meta))
        print(f"creating {args.nodes} fake Nodes", flush=True)
        out["nodes"] = await make_nodes(client, args.nodes, args.concurrency)
        await asyncio.sleep(5)  # the node controllers settle (CIDRs, leases) before sampling
        samples.append(sample("with Nodes", 0))
        print(f"creating {args.pods} pods, {args.batch} a batch", flush=True)
        out["pods"] = await bare_pods(client, args.pods, args.batch, args.concurrency, samples)
        foreign = [
            p
            async for p in client.list(Pod, namespace="*", chunk_size=500)
            if p.metadata and p.metadata.namespace != NAMESPACE
            and p.spec and (p.spec.nodeName or "").startswith(BENCH)
        ]  # fmt: skip
        out["foreign_pods_on_fake_nodes"] = len(foreign)
        with_pods, with_nodes, k = samples[-1], samples[1], args.pods / 1000
        out["memory"] = {
            "with_nodes": with_nodes,
            "with_pods": with_pods,
            "per_1000_pods_mib": per_1000(with_nodes, with_pods, args.pods),
            "cpu_s_per_1000_pods": {
                n: (with_pods["cpu_s"][n] - with_nodes["cpu_s"][n]) / k
                for n in with_pods["cpu_s"]
                if n in with_nodes["cpu_s"]
            },
        }
        print("deleting them", flush=True)
        names = [f"pod-{i}" for i in range(args.pods)]
        out["pods"].update(await _delete_pods(client, names, args.concurrency))
        await asyncio.sleep(5)
        samples.append(sample("pods deleted", 0))
        if args.orchard_pods:
            print(f"Orchard's backend: {args.orchard_pods} sandboxes", flush=True)
            out["orchard"] = await orchard_backend(
                args.kubeconfig, args.orchard_pods, args.orchard_concurrency
            )
    finally:
        await client.close()


def parser(doc: str | None) -> argparse.ArgumentParser:
    """The kwok benches' command line: the cluster and how many fake Nodes."""
    ap = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--kubeconfig", required=True, help="the trial cluster's admin kubeconfig")
    ap.add_argument("--nodes", type=int, default=200, help="fake Nodes (≤ 250: one /24 each)")
    return ap


def main(cleanup: common.Cleanup) -> int:
    ap = parser(__doc__)
    ap.add_argument("--pods", type=int, default=5000, help="bare pods for (a) and (b)")
    ap.add_argument("--batch", type=int, default=1000, help="pods per batch (sampled after each)")
    ap.add_argument("--concurrency", type=int, default=32, help="API requests in flight")
    ap.add_argument("--orchard-pods", type=int, default=1000, help="(c): sandboxes; 0 skips it")
    ap.add_argument(
        "--orchard-concurrency", type=int, default=100,
        help="(c): creates at once (the backend itself holds 32 API calls in flight)",
    )  # fmt: skip
    args = ap.parse_args()
    kube = Kube(args.kubeconfig)
    start_kwok(cleanup, kube)
    cleanup.add(
        "namespace",
        lambda: kube.run("delete", "namespace", NAMESPACE, "--ignore-not-found",
                         "--wait=true", "--timeout=600s", check=False),
    )  # fmt: skip
    t0 = time.monotonic()
    out: dict[str, Any] = {"args": vars(args)}
    try:
        asyncio.run(amain(args, out))
        out["markdown"] = _report(out)
    finally:
        out["total_s"] = time.monotonic() - t0
        common.write_json("k8s_kwok" if "markdown" in out else "k8s_kwok_partial", out)
    return 0


def start_kwok(cleanup: common.Cleanup, kube: Kube) -> None:
    """kwok started, to be stopped on the way out after this run's fake Nodes are deleted
    (undone last to first: kwok stops last, so pods' deletions still finish at once)."""
    cleanup.add("kwok", lambda: _sh("stop", kube.kubeconfig))
    cleanup.add(
        "fake Nodes",
        lambda: kube.run("delete", "nodes", "-l", f"{common.BENCH_LABEL}={BENCH}",
                         "--ignore-not-found", "--wait=false", check=False),
    )  # fmt: skip
    _sh("start", kube.kubeconfig)


def _sh(cmd: str, kubeconfig: str) -> None:
    subprocess.run(["bash", str(KWOK_SH), cmd, kubeconfig], check=True)


if __name__ == "__main__":
    common.run(main)
