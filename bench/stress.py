"""Stress test: N sandboxes, each running four commands, then memory with all N idle.

Each sandbox runs `python3 -c 'import sys; print(sys.version)'`, `ls /`,
`cat /etc/os-release | head -1`, and the last again in a login shell (`bash -lc`).
Reports success rate, end-to-end time, create and exec latency, commands per second,
the host's peak memory, memory per idle sandbox and the service's resident memory.

The floor beside it: the same image as plain `sleep` containers made by the Engine API
(create + start, same concurrency): its rate is what the engine allows any caller, and
its memory per container is the runtime's own overhead, so "ours" is what lies above it.

    .venv/bin/python bench/stress.py [--n 1000] [--concurrency 64] [--floor-n 200]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
import docker

from orchard import AsyncOrchard
from orchard.env.sdk import AsyncSandbox

COMMANDS: list[str | list[str]] = [
    "python3 -c 'import sys; print(sys.version)'",
    "ls /",
    "cat /etc/os-release | head -1",
    ["bash", "-lc", "cat /etc/os-release | head -1"],
]


def settle_mib(baseline: float, wait_s: float = 3.0) -> float:
    """Host memory above `baseline` once the burst is over (a few samples, the lowest)."""
    xs = []
    for _ in range(int(wait_s / 0.5)):
        time.sleep(0.5)
        xs.append(common.host_used_mib() - baseline)
    return min(xs)


def floor(image: str, n: int, conc: int) -> dict[str, Any]:
    """Plain containers through the Engine API: create+start rate and memory per container."""
    dc = docker.from_env(max_pool_size=conc + 8, timeout=120)
    labels = {common.BENCH_LABEL: common.RUN_ID, "bench.floor": "1"}
    base = common.host_used_mib()
    times: list[float] = []

    def one(_: int) -> Any:
        t0 = time.perf_counter()
        c = dc.containers.run(
            image, ["sleep", "infinity"], detach=True, network_mode="none", labels=labels
        )
        times.append(time.perf_counter() - t0)
        return c

    t0 = time.perf_counter()
    try:
        with ThreadPoolExecutor(conc) as pool:
            list(pool.map(one, range(n)))
        wall = time.perf_counter() - t0
        shims = common.rss_of("containerd-shim")
        mem = settle_mib(base)
        _, cg = common.mean_cgroup_mib("bench.floor=1")
    finally:
        common.remove_containers("bench.floor=1")
        dc.close()
    s = common.summarize(times)
    return {
        "n": n,
        "wall_s": wall,
        "per_s": n / wall,
        "create_start_p50_ms": s["p50_ms"],
        "create_start_p99_ms": s["p99_ms"],
        "host_mib": mem,
        "host_mib_per_container": mem / n,
        "cgroup_mib_per_container": cg,
        "shim_rss_mib_per_container": shims[1] / max(1, shims[0]),
    }


async def stress(
    url: str, image: str, n: int, conc: int, timeout_s: float, measure: Callable[[], Any]
) -> dict[str, Any]:
    """Run the N pipelines; `measure()` runs with all sandboxes idle, then they are deleted."""
    async with AsyncOrchard(url) as client:
        res = await pipeline(client, image, n, conc, timeout_s)
        boxes = res.pop("boxes")
        measured = await asyncio.to_thread(measure)
        delete_s = await delete_all(boxes, 32)
        return {**res, "measured": measured, "delete_s": delete_s}


async def pipeline(
    client: AsyncOrchard, image: str, n: int, conc: int, timeout_s: float
) -> dict[str, Any]:
    """N sandboxes, each created and then running COMMANDS, `conc` in flight, all within
    `timeout_s`; the sandboxes are kept (`boxes`) for the caller to measure and delete."""
    create_t: list[float] = []
    exec_t: list[float] = []
    failures: list[str] = []
    boxes: list[AsyncSandbox] = []
    sem = asyncio.Semaphore(conc)

    async def one(i: int) -> None:
        async with sem:
            t0 = time.perf_counter()
            try:
                sb = await client.sandboxes.create(image, labels=common.LABELS)
            except Exception as e:
                failures.append(f"#{i} create: {type(e).__name__}: {e}")
                return
            create_t.append(time.perf_counter() - t0)
            boxes.append(sb)
            for cmd in COMMANDS:
                t1 = time.perf_counter()
                try:
                    r = await sb.exec(cmd, timeout_s=60)
                except Exception as e:
                    failures.append(f"#{i} exec {cmd!r}: {type(e).__name__}: {e}")
                    return
                exec_t.append(time.perf_counter() - t1)
                if r.exit_code != 0 or not r.stdout.strip():
                    failures.append(f"#{i} exec {cmd!r}: exit {r.exit_code}: {r.stderr[:200]}")
                    return

    t0 = time.perf_counter()
    tasks = [asyncio.create_task(one(i)) for i in range(n)]
    _done, pending = await asyncio.wait(tasks, timeout=timeout_s)
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    e2e = time.perf_counter() - t0
    if pending:
        failures.append(f"{len(pending)} sandboxes unfinished after {timeout_s:g} s")
    ok = n - len({f.split()[0] for f in failures if f.startswith("#")}) - len(pending)
    return {
        "create_s": create_t,
        "exec_s": exec_t,
        "failures": failures,
        "ok": ok,
        "e2e_s": e2e,
        "boxes": boxes,
    }


async def delete_all(boxes: list[AsyncSandbox], conc: int, timeout: float = 300) -> float:
    """Delete every sandbox (32 at a time); a failure is left to the final cleanup."""
    sem = asyncio.Semaphore(conc)

    async def rm(sb: AsyncSandbox) -> None:
        async with sem:
            await sb.delete()

    t0 = time.perf_counter()
    jobs = asyncio.gather(*(rm(b) for b in boxes), return_exceptions=True)
    try:
        # Bounded: an engine slow to remove containers must not hold the results hostage.
        await asyncio.wait_for(jobs, timeout)
    except TimeoutError:
        print(f"delete: not done after {timeout:g} s; cleanup removes the rest", file=sys.stderr)
    return time.perf_counter() - t0


def main(cleanup: common.Cleanup) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--n", type=int, default=1000, help="sandboxes (default 1000)")
    ap.add_argument("--concurrency", type=int, default=64, help="sandboxes in flight")
    ap.add_argument("--floor-n", type=int, default=200, help="plain containers for the floor")
    ap.add_argument("--timeout", type=float, default=600, help="bound on the whole run, s")
    args = ap.parse_args()
    image = common.bench_image()
    fl = floor(image, min(args.floor_n, args.n), args.concurrency) if args.floor_n else {}
    svc = common.ServiceProcess(cleanup)
    time.sleep(1)
    svc_idle = common.rss_mib(svc.pid)
    base = common.host_used_mib()
    loop = asyncio.new_event_loop()
    cleanup.add("loop", loop.close)
    sandboxes = f"orchard.state_dir={svc.dir / 'state'}"

    def measure() -> dict[str, float]:
        host = settle_mib(base)
        _, cg = common.mean_cgroup_mib(sandboxes)
        agents = common.rss_of("agent")
        return {
            "host": host,
            "cgroup": cg,
            "agent": agents[1] / max(1, agents[0]),
            "svc_rss": common.rss_mib(svc.pid),
            "svc_hwm": common.rss_mib(svc.pid, "VmHWM"),
        }

    with common.PeakMemory() as peak:
        res = loop.run_until_complete(
            stress(svc.url, image, args.n, args.concurrency, args.timeout, measure)
        )
    m = res["measured"]
    idle_mib, svc_rss, svc_hwm, delete_s = m["host"], m["svc_rss"], m["svc_hwm"], res["delete_s"]
    cmds = len(res["exec_s"])
    c, e = common.summarize(res["create_s"]), common.summarize(res["exec_s"])
    n = args.n
    per_sb = idle_mib / n
    out = {
        "n": n,
        "concurrency": args.concurrency,
        "image": image,
        "success_rate": res["ok"] / n,
        "ok": res["ok"],
        "e2e_s": res["e2e_s"],
        "create_mean_ms": c.get("mean_ms"),
        "create_p99_ms": c["p99_ms"],
        "exec_mean_ms": e.get("mean_ms"),
        "exec_p99_ms": e["p99_ms"],
        "commands": cmds,
        "commands_per_s": cmds / res["e2e_s"],
        "host_peak_mib": peak.peak_mib - base,
        "host_idle_mib": idle_mib,
        "host_mib_per_sandbox": per_sb,
        "cgroup_mib_per_sandbox": m["cgroup"],
        "service_growth_mib_per_sandbox": (svc_rss - svc_idle) / n,
        "mib_per_sandbox_above_floor": (
            m["cgroup"] - fl["cgroup_mib_per_container"] + (svc_rss - svc_idle) / n if fl else None
        ),
        "agent_rss_mib_per_sandbox": m["agent"],
        "service_rss_idle_mib": svc_idle,
        "service_rss_mib": svc_rss,
        "service_hwm_mib": svc_hwm,
        "delete_s": delete_s,
        "floor": fl,
        "failures": res["failures"],
    }
    rows = [
        ["success", f"{res['ok']}/{n} ({100 * res['ok'] / n:.1f}%)"],
        ["end to end", f"{res['e2e_s']:.1f} s"],
        ["create mean / p99", f"{c.get('mean_ms', 0):.0f} / {c['p99_ms']:.0f} ms"],
        ["exec mean / p99", f"{e.get('mean_ms', 0):.1f} / {e['p99_ms']:.1f} ms"],
        ["commands/s", f"{cmds / res['e2e_s']:.0f}"],
        ["host peak memory (above baseline)", f"{peak.peak_mib - base:.0f} MiB"],
        ["host memory per idle sandbox (whole host, noisy)", f"{per_sb:.1f} MiB"],
        ["sandbox cgroup memory (mean)", f"{m['cgroup']:.1f} MiB"],
        ["service growth per sandbox", f"{(svc_rss - svc_idle) / n:.2f} MiB"],
        ["agent RSS per sandbox", f"{out['agent_rss_mib_per_sandbox']:.1f} MiB"],
        ["service RSS idle / after / peak", f"{svc_idle:.0f} / {svc_rss:.0f} / {svc_hwm:.0f} MiB"],
        ["delete all", f"{delete_s:.1f} s"],
    ]
    if fl:
        rows += [
            [
                f"floor: Engine API create+start ({fl['n']} plain containers)",
                f"{fl['per_s']:.1f}/s, p50 {fl['create_start_p50_ms']:.0f} ms",
            ],
            [
                "floor: host memory per plain container (noisy)",
                f"{fl['host_mib_per_container']:.1f} MiB",
            ],
            ["floor: plain container cgroup memory", f"{fl['cgroup_mib_per_container']:.1f} MiB"],
            [
                "per sandbox above the floor (cgroup + service)",
                f"{out['mib_per_sandbox_above_floor']:.1f} MiB",
            ],
        ]
    out["markdown"] = common.table(
        f"stress: {n} sandboxes x {len(COMMANDS)} commands", ["measure", "value"], rows
    )
    for f in res["failures"][:20]:
        print("FAIL", f)
    common.write_json("stress", out)
    return 0 if res["ok"] == n else 1


if __name__ == "__main__":
    common.run(main)
