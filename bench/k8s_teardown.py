"""What a pod's teardown costs its node, beside its start (docs/kubernetes.md, "Deletes").

N pods created at once straight through the API server and timed to Running, then all
deleted at once and timed until the watch reports each gone; the node's CPU per pod in
each phase, split by part (bench/k8s_cpu.py). Two shapes of bench/k8s_floor.py's: `policy`
(busybox `sleep`, grace 0, under the deny-all policy a tenant namespace has) and
`orchard-pod` (the pod Orchard's service makes, its agent from the namespace's
ConfigMaps, grace 10). A bare pod with grace 0 leaves the API at once, before the kubelet
has torn it down, so for it `after_cpu` (the 10 s after) holds most of its teardown.

Why it exists: it is the measurement that made deletes retire (backends/kubernetes/
retire.py): the teardown costs about as much as the start.

    BENCH=k8s_teardown bash scripts/bench-k8s.sh [--n 100 --shapes policy,orchard-pod]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
import httpx2
import k8s_cpu
from k8s_deploy import OVERLAY, Kube
from k8s_floor import namespace_for
from lightkube import AsyncClient, KubeConfig, codecs
from lightkube.resources.core_v1 import Namespace, Pod

from orchard.env import images
from orchard.env.backends.kubernetes.objects import KubernetesOptions


async def measure(
    kubeconfig: str, image: str, n: int, shape: str, settings: dict[str, str]
) -> dict[str, Any]:
    ns = f"orchard-teardown-{common.RUN_ID}-{shape}"
    opts = replace(KubernetesOptions.from_env(settings), namespace=ns, instance="teardown")
    client = AsyncClient(KubeConfig.from_file(kubeconfig), timeout=httpx2.Timeout(120))
    try:
        make = await namespace_for(client, opts, image, shape)
        names = [f"floor-{i}" for i in range(n)]
        running = {x: asyncio.Event() for x in names}
        gone = {x: asyncio.Event() for x in names}

        async def watch() -> None:
            async for kind, pod in client.watch(Pod, namespace=ns):
                name = pod.metadata.name if pod.metadata else ""
                st = pod.status
                if kind == "DELETED" and name in gone:
                    gone[name].set()
                elif st is not None and st.phase == "Running" and st.podIP and name in running:
                    running[name].set()

        watcher = asyncio.create_task(watch())
        await asyncio.sleep(0.5)
        t0, c0 = time.monotonic(), k8s_cpu.sample()
        await asyncio.gather(*(client.create(codecs.from_dict(make(x))) for x in names))
        await asyncio.wait_for(asyncio.gather(*(running[x].wait() for x in names)), 1200)
        t1, c1 = time.monotonic(), k8s_cpu.sample()
        await asyncio.sleep(5)  # the last starts' stragglers, not charged to the deletes
        t2, c2 = time.monotonic(), k8s_cpu.sample()
        await asyncio.gather(*(client.delete(Pod, x, namespace=ns) for x in names))
        await asyncio.wait_for(asyncio.gather(*(gone[x].wait() for x in names)), 1200)
        t3, c3 = time.monotonic(), k8s_cpu.sample()
        await asyncio.sleep(10)
        c4 = k8s_cpu.sample()
        watcher.cancel()
    finally:
        await client.delete(Namespace, ns)
        await client.close()
    return {
        "shape": shape,
        "n": n,
        "create_s": t1 - t0,
        "create_cpu": k8s_cpu.per_pod(c0, c1, n),
        "delete_s": t3 - t2,
        "delete_cpu": k8s_cpu.per_pod(c2, c3, n),
        "after_cpu": k8s_cpu.per_pod(c3, c4, n),
    }


def main(cleanup: common.Cleanup) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--image", help="the pods' image (default: the busybox test image)")
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--shapes", default="policy,orchard-pod", help="of bench/k8s_floor.py's")
    ap.add_argument("--cpu-request", help="the sandboxes' cpu request in cores (as k8s_bench.py)")
    args = ap.parse_args()
    kube = Kube(args.kubeconfig)
    docs = list(yaml.safe_load_all(kube.run("kustomize", str(OVERLAY))))
    settings = next(
        d["data"]
        for d in docs
        if d and d["kind"] == "ConfigMap" and d["metadata"]["name"] == "orchard"
    )
    if args.cpu_request:
        settings["ORCHARD_K8S_DEFAULT_CPU"] = args.cpu_request
    results, rows = [], []
    for shape in args.shapes.split(","):
        image = args.image or images.busybox_image()
        r = asyncio.run(measure(args.kubeconfig, image, args.n, shape, settings))
        results.append(r)
        for phase, cpu in (("create", "create_cpu"), ("delete", "delete_cpu")):
            ms = r[cpu]
            rows.append([shape, phase, r[f"{phase}_s"], ms["total"], ms["kubelet"],
                         ms["containerd"], ms["kube-router"], ms["kube-apiserver"],
                         ms["rest (shims, runc, kernel)"]])  # fmt: skip
        rows.append([shape, "10 s after", float("nan"), r["after_cpu"]["total"]] + [""] * 5)
        time.sleep(15)  # the namespace's teardown, before the next shape
    print(common.table(
        f"{args.n} pods created, then deleted, at once: CPU per pod (ms)",
        ["shape", "phase", "wall s", "node total", "kubelet", "containerd", "kube-router",
         "API server", "shims, runc, kernel"],
        rows,
    ))  # fmt: skip
    common.write_json("k8s_teardown", {"runs": results})
    return 0


if __name__ == "__main__":
    common.run(main)
