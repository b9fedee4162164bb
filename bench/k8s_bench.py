"""`make bench-k8s`: the Kubernetes benchmarks on the real node, in one run.

1. Cold create → ready, N = 200: Orchard against the kubelet's floor (k8s_floor.py).
2. Pool claims at 20/s through the in-cluster service (k8s_pools.py).
3. 300 sandboxes x 4 commands through the service, cold and from a pool (k8s_pools.py).

It deploys the `local` overlay itself (k8s_deploy.py) with a pending timeout long enough
for 200 creates at once on this node, and removes it afterwards; scripts/bench-k8s.sh
starts the cluster, builds and loads the images and holds the live suite's lock around
it. Results: bench/results/k8s_bench.json (its `markdown` is the tables of
docs/kubernetes.md).

    .venv/bin/python bench/k8s_bench.py --kubeconfig KUBECONFIG --image IMAGE \
        [--create-n 200 --create-concurrency 200 --n 300 --workers 16 --rate 20]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
import k8s_floor
import k8s_pools
from k8s_deploy import Kube, deployed

from orchard import Orchard

# 200 creates at once on a 2-core node: the last pods start minutes after their POST
# (about 1.5 pods/s), past the overlay's 120 s. The floor's bare pods wait as long.
SETTINGS = {"ORCHARD_K8S_PENDING_TIMEOUT_S": "900"}


def main(cleanup: common.Cleanup) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--image", required=True, help="an image the node has (busybox)")
    ap.add_argument("--create-n", type=int, default=200)
    ap.add_argument("--create-concurrency", type=int, default=200)
    ap.add_argument("--only", default="create,pools", help="create, pools, or both")
    ap.add_argument(
        "--cpu-request",
        help="the sandboxes' cpu request in cores, on both sides (default: the overlay's "
        "0.01; 0.005 lets N = 200 fit a 2-core node)",
    )
    k8s_pools.add_args(ap)
    args = ap.parse_args()
    only = set(args.only.split(","))
    kube = Kube(args.kubeconfig)
    out: dict[str, Any] = {"args": vars(args)}
    md: list[str] = []
    t0 = time.monotonic()
    settings = dict(SETTINGS)
    if args.cpu_request:
        settings["ORCHARD_K8S_DEFAULT_CPU"] = args.cpu_request
    with deployed(kube, settings) as svc:
        out["deploy_s"] = time.monotonic() - t0
        key = svc.keys["alice"]
        if "create" in only:
            out["create"], table = k8s_floor.measure(
                kube, svc.url, key, "alice", args.image, args.create_n, args.create_concurrency
            )
            md.append(table)
            common.write_json("k8s_bench", {**out, "markdown": table})  # kept if pools fail
        if "pools" in only:
            with Orchard(base_url=svc.url, api_key=key) as c:
                out["pools"], table = k8s_pools.measure(c, args.image, args, kube)
            md.append(table)
    out["total_s"] = time.monotonic() - t0
    out["markdown"] = "\n\n".join(md)
    common.write_json("k8s_bench", out)
    print("\n" + out["markdown"])
    return 0


if __name__ == "__main__":
    common.run(main)
