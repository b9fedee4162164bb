"""Warm pools on Kubernetes through the in-cluster service (docs/kubernetes.md, "Warm pools").

1. Pool claims at a steady rate (default 20 claims/s, open loop: claim i is sent at
   i / rate s whatever the others do), from a full pool on a settled node (no sandbox pod
   still going away or starting), as labels only (one API update) and with env (the agent
   told, two updates). p50 / p99 of each claim's round trip, and each claim's send time
   and latency (`timeline`: where in the run the slow ones fell).
2. N sandboxes x 4 commands (default 300), `--workers` at a time, each created, used and
   deleted: cold first (before the pool exists, so no refill competes), then claimed from
   a full pool (its size at most 100: the rest is whatever the refill had ready, else
   cold). The ratio of the two end-to-end times.

`make bench-k8s` runs this from bench/k8s_bench.py, which deploys the service first. Alone
it needs Orchard deployed in the cluster (`ORCHARD_TEST_KEEP_DEPLOYMENT=1 make test-k8s`
leaves the trial install up), reached at its NodePort; the API key is read from the
Secret the install uses (the admin kubeconfig may read it).

    .venv/bin/python bench/k8s_pools.py --image IMAGE \
        --kubeconfig /var/lib/orchard-cluster/kubeconfig/admin.kubeconfig \
        [--rate 20 --claims 100 --n 300 --workers 16 --pool-size 100]
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
from k8s_deploy import Kube

from orchard import Orchard
from orchard.env.backends.kubernetes.objects import A_RETIRED, L_COMPONENT

COMMANDS = ["echo $0", "ls /", "cat /proc/version | head -c 40", "sh -lc 'cat /proc/version'"]


def kubectl(kubeconfig: str, *args: str) -> str:
    return Kube(kubeconfig).run(*args)


def service(kubeconfig: str, owner: str | None) -> tuple[str, str]:
    """(URL, API key) of the deployed service: the node's address and the NodePort."""
    raw = kubectl(
        kubeconfig, "-n", "orchard-system", "get", "secret", "orchard-secrets", "-o", "json"
    )
    keys = dict(
        pair.split(":", 1)
        for pair in base64.b64decode(json.loads(raw)["data"]["api-keys"]).decode().split(",")
    )
    key = keys[owner] if owner else next(iter(keys.values()))
    return f"http://{Kube(kubeconfig).node_ip()}:30080", key


def settled(kube: Kube | None, timeout_s: float = 300) -> None:
    """Wait until no sandbox pod is still going away or starting (the phase before this
    one deleted and refilled a hundred: its teardown must not be charged to these claims)."""
    if kube is None:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pods = kube.get("pods", "-A", "-l", f"{L_COMPONENT}=sandbox")["items"]
        busy = [
            p
            for p in pods
            if p["metadata"].get("deletionTimestamp")
            or p["status"].get("phase") == "Pending"
            or A_RETIRED in (p["metadata"].get("annotations") or {})  # torn down soon
        ]
        if not busy:
            time.sleep(2)  # the kubelet's and kube-router's last syncs
            return
        time.sleep(1)
    print(f"the node did not settle in {timeout_s:g} s; measuring anyway", file=sys.stderr)


def steady_claims(c: Orchard, pool: str, n: int, rate: float, env: bool) -> dict[str, Any]:
    """n claims sent at `rate`/s (open loop), each timed from its own send."""
    times: list[float] = []
    sent: list[tuple[float, float]] = []  # (s after the first send, ms)
    warm, ids, lock = 0, [], threading.Lock()
    start = time.monotonic() + 0.2

    def one(i: int) -> None:
        nonlocal warm
        delay = start + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        t = time.monotonic()
        sb = c.sandboxes.create(
            pool=pool, labels={"i": str(i)}, env={"TASK": str(i)} if env else {}
        )
        took = time.monotonic() - t
        with lock:
            times.append(took)
            sent.append((round(t - start, 2), round(took * 1000, 1)))
            ids.append(sb.id)
            warm += bool(sb.info.from_pool)

    with ThreadPoolExecutor(64) as ex:
        list(ex.map(one, range(n)))
    wall = time.monotonic() - start
    with ThreadPoolExecutor(16) as ex:
        list(ex.map(c.sandboxes.delete, ids))
    timeline = sorted(sent)  # where in the run the tail fell (a refill starting, say)
    return {
        **common.summarize(times),
        "warm": warm,
        "rate_achieved": n / wall,
        "timeline": timeline,
    }


def burst(c: Orchard, image: str, n: int, workers: int, pool: str | None) -> dict[str, Any]:
    """n sandboxes x 4 commands, `workers` at a time; each deleted once done."""
    creates: list[float] = []
    failures, warm, lock = 0, 0, threading.Lock()

    def one(i: int) -> None:
        nonlocal failures, warm
        t = time.monotonic()
        try:
            if pool:
                sb = c.sandboxes.create(pool=pool, labels={"i": str(i)}, timeout_s=900)
            else:
                sb = c.sandboxes.create(image, labels={"i": str(i)}, timeout_s=900)
        except Exception as e:
            with lock:
                failures += 1
            print(f"create {i} failed: {e}", file=sys.stderr)
            return
        made = time.monotonic() - t
        ok = True
        try:
            for cmd in COMMANDS:
                ok = ok and sb.exec(cmd).exit_code == 0
        except Exception as e:  # counted: the success rate is part of the result
            ok = False
            print(f"exec in {sb.id} failed: {e}", file=sys.stderr)
        finally:
            sb.delete(missing_ok=True)
        with lock:
            creates.append(made)
            warm += bool(sb.info.from_pool)
            failures += not ok

    t0 = time.monotonic()
    with ThreadPoolExecutor(workers) as ex:
        list(ex.map(one, range(n)))
    total = time.monotonic() - t0
    s = common.summarize(creates)
    return {"total_s": total, "success": (n - failures) / n, "warm": warm, **s}


def measure(
    c: Orchard, image: str, args: argparse.Namespace, kube: Kube | None = None
) -> tuple[dict[str, Any], str]:
    """Cold burst first (no pool yet, so no refill competes), then the pool: its claims at
    a steady rate (labels only, then with env; refilled in between), then the burst from
    it. Returns the results and their tables as Markdown."""
    out: dict[str, Any] = {}
    md = ""
    if not args.skip_burst:
        settled(kube)
        out["burst_cold"] = burst(c, image, args.n, args.workers, None)
    name = f"bench-{common.RUN_ID}"
    c.pools.create(name, image, args.pool_size)
    try:
        t = time.monotonic()
        c.pools.wait_ready(name, timeout_s=900)
        out["pool_fill_s"] = time.monotonic() - t
        rows = []
        for env in (False, True):
            c.pools.wait_ready(name, timeout_s=900)
            settled(kube)
            r = steady_claims(c, name, min(args.claims, args.pool_size), args.rate, env)
            out["claims_env" if env else "claims"] = r
            what = "claim, env + labels" if env else "claim, labels"
            rows.append([what, r["n"], r["warm"], r["rate_achieved"], r["p50_ms"], r["p99_ms"]])
        md = common.table(
            f"pool claims at {args.rate:g}/s through the in-cluster service "
            f"(pool of {args.pool_size}, filled in {out['pool_fill_s']:.0f} s)",
            ["what", "n", "warm", "claims/s", "p50 ms", "p99 ms"],
            rows,
        )
        if not args.skip_burst:
            c.pools.wait_ready(name, timeout_s=900)
            settled(kube)  # the claims' sandboxes torn down, as before the cold burst
            out["burst_pool"] = burst(c, image, args.n, args.workers, name)
    finally:
        c.pools.delete(name)
    if not args.skip_burst:
        cold, warm = out["burst_cold"], out["burst_pool"]
        out["burst_ratio"] = cold["total_s"] / warm["total_s"]
        md += "\n\n" + common.table(
            f"{args.n} x 4 commands, {args.workers} at a time, through the in-cluster service",
            ["how", "total s", "success", "warm", "create p50 ms", "create p99 ms"],
            [
                ["cold", cold["total_s"], cold["success"], 0, cold["p50_ms"], cold["p99_ms"]],
                [
                    f"pool of {args.pool_size}",
                    warm["total_s"],
                    warm["success"],
                    warm["warm"],
                    warm["p50_ms"],
                    warm["p99_ms"],
                ],
                ["ratio cold / pool", out["burst_ratio"], float("nan"), float("nan"),
                 float("nan"), float("nan")],
            ],
        )  # fmt: skip
        print(f"\ncold / pool end to end: {out['burst_ratio']:.2f}x")
    return out, md


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--rate", type=float, default=20.0, help="claims per second")
    ap.add_argument("--claims", type=int, default=100)
    ap.add_argument("--n", type=int, default=300, help="sandboxes of the x 4 burst")
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--pool-size", type=int, default=100)
    ap.add_argument("--skip-burst", action="store_true")


def main(cleanup: common.Cleanup) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--image", required=True, help="an image the node has (busybox)")
    ap.add_argument("--owner", default="alice")
    add_args(ap)
    args = ap.parse_args()
    url, key = service(args.kubeconfig, args.owner)
    with Orchard(base_url=url, api_key=key) as c:
        out, md = measure(c, args.image, args, Kube(args.kubeconfig))
    common.write_json("k8s_pools", {"args": vars(args), **out, "markdown": md})
    return 0


if __name__ == "__main__":
    common.run(main)
