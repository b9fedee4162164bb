"""Sandbox state: fork x8 vs 8 creates + set-up, pause/resume latency, snapshot size,
warm-pool claim vs create latency.

A "prepared SWE sample": a repository-like tree (2,000 small files, a 20 MiB blob, a
`git init` where git exists) written by a set-up step. Fork = one snapshot + 8 sandboxes
from it; the peer is 8 fresh creates that each run the set-up. Per backend (docker,
local), each in its own in-process service; `kubernetes` goes through the in-cluster
service at its NodePort (found as bench/k8s_pools.py finds it: `--kubeconfig`), with an
image the node has (`--k8s-image`). What a backend answers 501 (not_supported) is `n/a`.

"SWE set-up once + fork" (`swe_fork`) does the same with the SWE sample task
`intervals-1` (its image, built offline) and a task set-up that stands in for an install
(a virtualenv, the image's Python copied in as its dependencies and byte-compiled, the
tests collected): `sb.fork(8)` of the prepared sandbox, and what `orchard swe distill -k 8`
does (`orchard.swe.prepare.Preparer`: one set-up, 8 attempts from its snapshot), against 8
fresh creates that each run the set-up, all 8 at once.

    .venv/bin/python bench/state.py [--backends docker,local] [--n 8] [--rounds 20] [--no-swe]
    .venv/bin/python bench/state.py --only pools [--claims 40]
    .venv/bin/python bench/state.py --backends kubernetes --no-swe --k8s-image IMAGE \
        --kubeconfig /var/lib/orchard-cluster/kubeconfig/admin.kubeconfig
    .venv/bin/python bench/state.py --backends docker,local,kubernetes --deploy \
        --k8s-image IMAGE --kubeconfig ...   # the SWE fork beside docker and local
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

from orchard import Orchard
from orchard.env.config import ServiceConfig
from orchard.env.errors import NotSupported
from orchard.env.images import busybox_image

SETUP = (
    "mkdir -p /repo/src && cd /repo && "
    'for i in $(seq 2000); do echo "line $i" > src/f$i.py; done && '
    "dd if=/dev/urandom of=/repo/blob bs=1M count=20 2>/dev/null && sync"
)


# Offline stand-in for a SWE task's install step (no package index to install from).
SWE_SETUP = (
    "set -e; python3 -m venv --without-pip --system-site-packages /opt/env; "
    "sp=$(/opt/env/bin/python -c 'import site; print(site.getsitepackages()[0])'); "
    "lib=$(python3 -c 'import os; print(os.path.dirname(os.__file__))'); "
    'mkdir -p "$sp/vendor"; cp -a "$lib/." "$sp/vendor/"; '
    'find "$sp/vendor" -name __pycache__ -prune -exec rm -rf {} +; '
    '/opt/env/bin/python -m compileall -q "$sp/vendor" > /dev/null || true; '
    "/opt/env/bin/python -m pytest -q --co -p no:cacheprovider > /dev/null; "
    "echo prepared > /opt/env/ok"
)
SWE_TASK = "orchard-samples__intervals-1"


K8S: dict[str, str] = {"kubeconfig": "", "owner": "alice"}  # set by main


def _client(backend: str, state: Path) -> Orchard:
    if backend == "kubernetes":
        import k8s_pools

        url, key = k8s_pools.service(K8S["kubeconfig"], K8S["owner"])
        return Orchard(base_url=url, api_key=key)
    cfg = ServiceConfig(
        state_dir=state,
        backend=backend,
        agent_binary=str(common.agent_binary()),
        extra_labels={common.BENCH_LABEL: common.RUN_ID},
    )
    return Orchard(service_config=cfg)


def _bench(backend: str, image: str, n: int, rounds: int) -> dict[str, Any]:
    state = Path(tempfile.mkdtemp(prefix="ob-"))
    with _client(backend, state) as c:
        src = c.sandboxes.create(image, labels=common.LABELS)
        src.exec(SETUP)
        snap: Any = None
        t0 = time.perf_counter()
        try:
            with src.fork(n) as forks:
                fork_s: float | None = time.perf_counter() - t0
                assert len(forks) == n, forks.errors
                snap = forks.snapshot
            assert snap is not None
        except NotSupported:  # kubernetes before its snapshots
            fork_s = None

        def fresh() -> None:
            with c.sandboxes.create(image, labels=common.LABELS) as sb:
                sb.exec(SETUP)

        t0 = time.perf_counter()
        with ThreadPoolExecutor(n) as pool:
            list(pool.map(lambda _: fresh(), range(n)))
        create_s = time.perf_counter() - t0
        pause, resume = [], []
        src.process.start("while true; do :; done")
        for _ in range(rounds):
            with common.timer(pause):
                src.pause()
            with common.timer(resume):
                src.resume()
        src.delete()
        if snap is not None:
            c.snapshots.delete(snap.id)
    image_bytes = int(
        subprocess.run(
            ["docker", "image", "inspect", "-f", "{{.Size}}", image], capture_output=True, text=True
        ).stdout.strip()
        or 0
    )
    return {
        "fork_s": fork_s,
        "create_setup_s": create_s,
        "speedup": create_s / fork_s if fork_s else None,
        "pause": common.summarize(pause),
        "resume": common.summarize(resume),
        "snapshot_mib": snap.size_bytes / (1 << 20) if snap is not None else None,
        "image_mib": image_bytes / (1 << 20),
    }


def _swe_task() -> Any:
    from orchard.swe.images import task_image
    from orchard.swe.tasks import sample_tasks

    task = next(t for t in sample_tasks() if t.instance_id == SWE_TASK)
    task_image(task)
    return task.model_copy(update={"setup_script": SWE_SETUP})


def _prepared(sandboxes: list[Any]) -> None:
    for sb in sandboxes:
        assert sb.exec("cat /opt/env/ok").stdout.strip() == "prepared", sb.id


def _swe_attempts(c: Orchard, task: Any, n: int, fork: bool) -> tuple[float, int]:
    """n prepared sandboxes the way `orchard swe distill -k n` gets them; (seconds, set-ups)."""
    from orchard.swe.prepare import Preparer

    with Preparer(c, fork=fork) as prep, ThreadPoolExecutor(n) as pool:
        t0 = time.perf_counter()
        got = list(pool.map(lambda _: prep.start(task, labels=common.LABELS), range(n)))
        took = time.perf_counter() - t0
        try:
            _prepared(got)
        finally:
            for sb in got:
                sb.delete()
        return took, sum(prep.setups.values())


def _bench_swe_fork(backend: str, n: int) -> dict[str, Any]:
    """Fork xn of a prepared SWE sample sandbox vs n fresh creates + the same set-up."""
    from orchard.swe.prepare import run_setup

    task = _swe_task()
    if backend == "kubernetes" and K8S.get("load"):
        from k8s_deploy import CLUSTER_SH

        subprocess.run(["bash", str(CLUSTER_SH), "load", task.image], check=True)
    state = Path(tempfile.mkdtemp(prefix="ob-swe-"))
    with _client(backend, state) as c:
        c.sandboxes.create(task.image).delete()  # the image in the backend's store first
        t0 = time.perf_counter()
        src = c.sandboxes.create(task.image, labels=common.LABELS)
        run_setup(src, task)
        setup_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        with src.fork(n, labels=common.LABELS) as forks:
            fork_s = time.perf_counter() - t0
            assert len(forks) == n, forks.errors
            _prepared(list(forks))
            snap = forks.snapshot
        assert snap is not None
        c.snapshots.delete(snap.id)
        src.delete()
        swe_s, swe_setups = _swe_attempts(c, task, n, fork=True)
        fresh_s, fresh_setups = _swe_attempts(c, task, n, fork=False)
    assert (swe_setups, fresh_setups) == (1, n)
    return {
        "setup_s": setup_s,
        "fork_s": fork_s,
        "swe_fork_s": swe_s,
        "create_setup_s": fresh_s,
        "speedup_fork": fresh_s / fork_s,
        "speedup_swe": fresh_s / swe_s,
        "snapshot_mib": snap.size_bytes / (1 << 20),
    }


def _swe_table(results: dict[str, dict[str, Any]], n: int) -> None:
    rows = [
        [
            b,
            f"{r['setup_s']:.2f} s",
            f"{r['fork_s']:.2f} s",
            f"{r['swe_fork_s']:.2f} s",
            f"{r['create_setup_s']:.2f} s",
            f"{r['speedup_fork']:.1f}x / {r['speedup_swe']:.1f}x",
            f"{r['snapshot_mib']:.1f} MiB",
        ]
        for b, r in results.items()
    ]
    headers = [
        "backend",
        "create + set-up (one)",
        f"fork x{n} of it",
        f"swe: set-up once + {n} attempts",
        f"{n} creates + set-up each",
        "speed-up (fork / swe)",
        "snapshot",
    ]
    print(common.table(f"SWE sample {SWE_TASK}: set-up once + fork", headers, rows))


def _bench_pool(backend: str, image: str, claims: int, size: int = 10) -> dict[str, Any]:
    """Warm pool: `claims` claims (each from a full pool) vs as many plain creates, one at a
    time through the SDK (docs/pools.md); the target is a claim p50 of 30 ms or less."""
    state = Path(tempfile.mkdtemp(prefix="ob-"))
    with _client(backend, state) as c:
        c.pools.create("bench", image, size)
        claim, create, misses = [], [], 0
        while len(claim) < claims:
            c.pools.wait_ready("bench")
            got = []
            for _ in range(min(size, claims - len(claim))):
                t0 = time.perf_counter()
                sb = c.sandboxes.create(pool="bench", env={"RUN": "1"}, labels={"b": "1"})
                took = time.perf_counter() - t0
                got.append(sb)
                if sb.info.from_pool:
                    claim.append(took)
                else:
                    misses += 1
            for sb in got:
                sb.delete()
        c.pools.delete("bench")
        for _ in range(claims):
            with common.timer(create):
                sb = c.sandboxes.create(image)
            sb.delete()
    shutil.rmtree(state, ignore_errors=True)
    return {
        "claim": common.summarize(claim),
        "create": common.summarize(create),
        "misses": misses,
    }


def _pool_table(results: dict[str, dict[str, Any]]) -> str:
    rows = [
        [
            b,
            f"{r['claim']['p50_ms']:.1f} / {r['claim']['p99_ms']:.1f} ms",
            f"{r['create']['p50_ms']:.1f} / {r['create']['p99_ms']:.1f} ms",
            f"{r['create']['p50_ms'] / max(r['claim']['p50_ms'], 1e-9):.0f}x",
            str(r["misses"]),
        ]
        for b, r in results.items()
    ]
    headers = ["backend", "pool claim p50 / p99", "create p50 / p99", "speed-up", "misses"]
    return common.table("Warm pool claim vs create (target: claim p50 <= 30 ms)", headers, rows)


def main(cleanup: common.Cleanup) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--backends", default="docker,local")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-swe", action="store_true", help="skip the SWE set-up + fork section")
    ap.add_argument("--claims", type=int, default=40, help="warm-pool claims (and creates)")
    ap.add_argument("--only", choices=["pools"], help="run only this section")
    ap.add_argument("--kubeconfig", default="", help="kubernetes: the cluster's admin kubeconfig")
    ap.add_argument("--k8s-image", default="", help="kubernetes: an image the node has")
    ap.add_argument("--owner", default="alice", help="kubernetes: whose API key to use")
    ap.add_argument(
        "--deploy",
        action="store_true",
        help="kubernetes: deploy the local overlay for this run (bench/k8s_deploy.py, removed "
        "after) and load the SWE task's image into the trial cluster (deploy/cluster)",
    )
    args = ap.parse_args()
    K8S.update(kubeconfig=args.kubeconfig, owner=args.owner)
    if args.deploy and "kubernetes" in args.backends.split(","):
        from k8s_deploy import Kube, deployed

        K8S["load"] = "1"
        svc = deployed(Kube(args.kubeconfig), {})
        svc.__enter__()
        cleanup.add("the deployed service", lambda: svc.__exit__(None, None, None))
    image = busybox_image()
    claims = 10 if args.quick else args.claims
    local = [b for b in args.backends.split(",") if b != "kubernetes"]
    pools = {b: _bench_pool(b, image, claims) for b in local}  # k8s: bench/k8s_pools.py
    if pools:
        print(_pool_table(pools))
    if args.only == "pools":
        common.write_json("state", {"machine": common.machine(), "pools": pools})
        return 0
    results = {
        b: _bench(
            b,
            args.k8s_image if b == "kubernetes" else image,
            args.n,
            5 if args.quick else args.rounds,
        )
        for b in args.backends.split(",")
    }

    def fmt(v: float | None, spec: str, unit: str) -> str:
        return "n/a" if v is None else f"{v:{spec}}{unit}"

    rows = [
        [
            b,
            fmt(r["fork_s"], ".2f", " s"),
            f"{r['create_setup_s']:.2f} s",
            fmt(r["speedup"], ".1f", "x"),
            f"{r['pause']['p50_ms']:.1f} / {r['resume']['p50_ms']:.1f} ms",
            f"{fmt(r['snapshot_mib'], '.1f', '')} / {r['image_mib']:.1f} MiB",
        ]
        for b, r in results.items()
    ]
    headers = [
        "backend",
        f"fork x{args.n}",
        f"{args.n} creates + set-up",
        "speed-up",
        "pause / resume p50",
        "snapshot / image",
    ]
    print(common.table("Sandbox state", headers, rows))
    swe = {} if args.no_swe else {b: _bench_swe_fork(b, args.n) for b in args.backends.split(",")}
    if swe:
        _swe_table(swe, args.n)
    common.write_json(
        "state", {"machine": common.machine(), "results": results, "swe_fork": swe, "pools": pools}
    )
    return 0


if __name__ == "__main__":
    common.run(main)
