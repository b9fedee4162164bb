"""Create latency: request -> ready to exec, Orchard beside `docker run` and the Engine API.

Orchard: `sandboxes.create(image)` (returns once the agent answers), then the first exec.
Peers on the same image: `docker run -d` + first `docker exec` (CLI), and the Engine API's
create + start + first exec_run (docker-py), the floor any Docker-based service stands on.
Sequential runs interleave the peers; concurrent runs (32 callers) alternate in rounds.
Containers are removed between measurements, outside the timed part.

    .venv/bin/python bench/create_latency.py [--n 40] [--concurrent-n 96] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
import docker

from orchard import Orchard

# One attempt: returns (seconds to ready, seconds to first exec done, handle to remove later).
Attempt = Callable[[], tuple[float, float, Any]]


def main(cleanup: common.Cleanup) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--n", type=int, default=40, help="sequential creates per peer")
    ap.add_argument("--concurrent-n", type=int, default=96, help="concurrent creates per peer")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    image = common.bench_image()
    svc = common.ServiceProcess(cleanup)
    client = Orchard(svc.url)
    cleanup.add("client", client.close)
    dc = docker.from_env(max_pool_size=64, timeout=120)
    cleanup.add("docker client", dc.close)
    labels = {common.BENCH_LABEL: common.RUN_ID}

    def orchard() -> tuple[float, float, Any]:
        t0 = time.perf_counter()
        sb = client.sandboxes.create(image, labels=common.LABELS)
        t1 = time.perf_counter()
        assert sb.exec(["true"]).exit_code == 0
        return t1 - t0, time.perf_counter() - t0, sb

    def cli() -> tuple[float, float, Any]:
        t0 = time.perf_counter()
        cid = common.docker_run(image)
        t1 = time.perf_counter()
        subprocess.run(["docker", "exec", cid, "true"], check=True)
        return t1 - t0, time.perf_counter() - t0, cid

    def api() -> tuple[float, float, Any]:
        t0 = time.perf_counter()
        c = dc.containers.run(
            image, ["sleep", "infinity"], detach=True, network_mode="none", labels=labels
        )
        t1 = time.perf_counter()
        assert c.exec_run(["true"]).exit_code == 0
        return t1 - t0, time.perf_counter() - t0, c

    def remove(handles: list[Any]) -> None:
        cids = [h for h in handles if isinstance(h, str)]
        cids += [h.id for h in handles if hasattr(h, "attrs")]
        sbs = [h for h in handles if hasattr(h, "exec") and not hasattr(h, "attrs")]
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda s: s.delete(), sbs))
        for i in range(0, len(cids), 100):
            subprocess.run(["docker", "rm", "-f", *cids[i : i + 100]], capture_output=True)

    peers: dict[str, Attempt] = {
        "orchard create (SDK)": orchard,
        "docker run + exec (CLI)": cli,
        "Engine API create+start + exec_run": api,
    }
    out: dict[str, Any] = {"image": image}
    md = []
    for mode in ("sequential", f"concurrency {args.concurrency}"):
        ready: dict[str, list[float]] = {k: [] for k in peers}
        first: dict[str, list[float]] = {k: [] for k in peers}
        wall: dict[str, float] = {k: 0.0 for k in peers}
        t_mode = time.perf_counter()
        if mode == "sequential":
            for _ in range(args.n):
                for name, fn in peers.items():
                    r, f, h = fn()
                    ready[name].append(r)
                    first[name].append(f)
                    wall[name] += f
                    remove([h])
        else:
            per_round = max(1, args.concurrent_n // args.rounds)
            for _ in range(args.rounds):
                for name, fn in peers.items():
                    t0 = time.perf_counter()
                    with ThreadPoolExecutor(args.concurrency) as pool:
                        res = [f.result() for f in [pool.submit(fn) for _ in range(per_round)]]
                    wall[name] += time.perf_counter() - t0
                    ready[name] += [r for r, _, _ in res]
                    first[name] += [f for _, f, _ in res]
                    remove([h for _, _, h in res])
        print(f"[{mode}] {time.perf_counter() - t_mode:.1f} s", file=sys.stderr)
        base = common.summarize(first["orchard create (SDK)"])
        rows = []
        for name in peers:
            r, f = common.summarize(ready[name]), common.summarize(first[name])
            rate = len(first[name]) / wall[name] if wall[name] else float("nan")
            rows.append(
                [
                    name,
                    r["p50_ms"],
                    r["p99_ms"],
                    f["p50_ms"],
                    f["p99_ms"],
                    rate,
                    f"{common.ratio(f['p50_ms'], base['p50_ms']):.2f}x",
                ]
            )
            out.setdefault(mode, {})[name] = {
                "ready": r,
                "first_exec": f,
                "per_s": rate,
                "ready_samples_ms": [round(x * 1000, 3) for x in ready[name]],
            }
        heads = [
            "peer",
            "ready p50 ms",
            "ready p99 ms",
            "+exec p50 ms",
            "+exec p99 ms",
            "creates/s",
            "+exec p50 / orchard",
        ]
        md.append(
            f"**{mode}** (n={len(first['orchard create (SDK)'])} per peer)\n\n"
            + common.table(f"create -> ready -> first exec — {mode}", heads, rows)
        )
    out["markdown"] = "\n\n".join(md)
    common.write_json("create_latency", out)
    return 0


if __name__ == "__main__":
    common.run(main)
