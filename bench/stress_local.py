"""Stress test per backend: local (runc) beside docker, in the same run, same image, same load.

Each backend gets its own `orchard serve` (ORCHARD_BACKEND=local|docker) and the pipeline
of `stress.py`: N sandboxes, each created then running its four commands, `--concurrency`
in flight. The workload's floor (bench/floor.py: the same commands as plain host processes,
same N and concurrency) runs in the same invocation; the table gives each backend's end to
end time and CPU per sandbox as ratios to it. Then, with all N idle, memory is read; then
every sandbox is deleted (timed one by one). Beside them, the engine's own floor: plain
containers by `docker run -d` and `docker rm -f` through the Engine API, at the same
concurrency.

Memory per idle sandbox, all-in: what the host lost per sandbox once the burst settled
(whole host, so noisy when others share it), and the accounted part: the sandbox's
cgroup (agent and its page cache and kernel objects) plus the service's growth.

    .venv/bin/python bench/stress_local.py [--backend both|local|docker] [--n 1000]
        [--local-runtime auto|crun|runc]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
import cpu_split
import docker
import floor
import local_leaks
from stress import COMMANDS, pipeline, settle_mib

from orchard import AsyncOrchard
from orchard.env.sdk import AsyncSandbox

TARGET_E2E_S = 26.0
TARGET_MIB = 12.0


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process plus its reaped children (for the local service: runc, and
    each sandbox's init with everything it reaped, once the sandbox is deleted)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    f = text[text.rindex(")") + 2 :].split()
    return sum(int(x) for x in f[11:15]) / os.sysconf("SC_CLK_TCK")  # utime..cstime


def engine_cpu_s() -> float:
    """CPU seconds of the Docker engine's daemons (and the shims they reaped)."""
    total = 0.0
    for name in ("dockerd", "containerd"):
        for d in Path("/proc").glob("[0-9]*"):
            with contextlib.suppress(OSError):
                if (d / "comm").read_text().strip() == name:
                    total += tree_cpu_s(int(d.name))
    return total


def cpu_parts(svc_pid: int) -> dict[str, float]:
    """CPU seconds so far of the service's tree, the Docker engine and this client."""
    return {
        "service": sum(cpu_split.proc_times(svc_pid).values()),  # with its spawner's tree
        "engine": engine_cpu_s(),
        "client": sum(os.times()[:2]),
    }


def local_cgroup_mib(state: Path) -> tuple[int, float]:
    """(sandboxes, mean memory cgroup MiB) of the local sandboxes under a state folder."""
    xs = []
    for box in (state / "sandboxes").iterdir():
        for path in (
            Path(f"/sys/fs/cgroup/memory/orchard/{box.name}/memory.usage_in_bytes"),
            Path(f"/sys/fs/cgroup/orchard/{box.name}/memory.current"),
        ):
            with contextlib.suppress(OSError):
                xs.append(int(path.read_text()) / 2**20)
                break
    return len(xs), (sum(xs) / len(xs) if xs else float("nan"))


def delete_local_sandboxes(state: Path) -> None:
    """Cleanup after an aborted run: a backend over the same folder removes what is left."""
    if not (state / "sandboxes").is_dir():
        return
    from orchard.env.backends.local.backend import LocalBackend

    async def go() -> int:
        backend = LocalBackend(state, common.agent_binary())
        ids = {r.id for r in await backend.list()} | {
            p.name for p in (state / "sandboxes").iterdir()
        }
        for sid in ids:
            await backend.delete(sid)
        await backend.close()
        return len(ids)

    if n := asyncio.run(go()):
        print(f"cleanup: removed {n} local sandboxes", file=sys.stderr)


async def delete_timed(
    boxes: list[AsyncSandbox], conc: int, timeout_s: float = 300
) -> tuple[list[float], float]:
    """Delete every sandbox, `conc` at a time, timing each; bounded, so an engine that
    stalls on removals cannot hold the results hostage (the cleanup removes the rest)."""
    sem = asyncio.Semaphore(conc)
    times: list[float] = []

    async def rm(sb: AsyncSandbox) -> None:
        async with sem:
            t0 = time.perf_counter()
            await sb.delete()
            times.append(time.perf_counter() - t0)

    with common.perf_window(f"deletes-{common.RUN_ID}"):
        t0 = time.perf_counter()
        jobs = asyncio.gather(*(rm(b) for b in boxes), return_exceptions=True)
        try:
            await asyncio.wait_for(jobs, timeout_s)
        except TimeoutError:
            print(
                f"delete: not done after {timeout_s:g} s; cleanup removes the rest",
                file=sys.stderr,
            )
        return times, time.perf_counter() - t0


def run_backend(
    cleanup: common.Cleanup,
    backend: str,
    image: str,
    n: int,
    conc: int,
    timeout_s: float,
    runtime: str = "auto",
) -> dict[str, Any]:
    # Read by `orchard serve` (no --backend given); the runtime only by the local backend.
    os.environ.update(ORCHARD_BACKEND=backend, ORCHARD_LOCAL_RUNTIME=runtime)
    try:
        svc = common.ServiceProcess(cleanup)
    finally:
        del os.environ["ORCHARD_BACKEND"], os.environ["ORCHARD_LOCAL_RUNTIME"]
    state = svc.dir / "state"
    if backend == "local":

        def stop_and_clean() -> None:
            svc.stop()
            delete_local_sandboxes(state)

        cleanup.add("local sandboxes", stop_and_clean)
    with asyncio.Runner() as runner:
        client = AsyncOrchard(svc.url)

        async def warm() -> None:
            # The image's first use (local: import and unpack it once) is not the burst.
            sb = await client.sandboxes.create(image)
            await sb.delete()

        runner.run(warm())
        time.sleep(1)
        svc_idle = common.rss_mib(svc.pid)
        base = common.host_used_mib()
        load0 = os.getloadavg()[0]
        cpu0 = cpu_parts(svc.pid)
        times0 = cpu_split.proc_times(svc.pid)
        busy0 = cpu_split.host_busy_s()
        with common.PeakMemory() as peak, common.perf_window(f"burst-{common.RUN_ID}"):
            res = runner.run(pipeline(client, image, n, conc, timeout_s))
        load1 = os.getloadavg()[0]
        busy = cpu_split.host_busy_s() - busy0
        boxes = cpu_split.sandbox_cpu(state) if backend == "local" else None
        used = local_leaks.runtimes(state) if backend == "local" else ""
        seen = local_leaks.snapshot(state) if backend == "local" else {}
        host = settle_mib(base)
        if backend == "local":
            _, cg = local_cgroup_mib(state)
        else:
            _, cg = common.mean_cgroup_mib(f"orchard.state_dir={state}")
        agents = common.rss_of("agent")
        svc_rss = common.rss_mib(svc.pid)
        # Docker 20.10's engine deadlocked under 32 concurrent removals of 1,000 containers
        # (libnetwork's store lock): it gets 8 at a time.
        del_t, del_wall = runner.run(delete_timed(res["boxes"], 32 if backend == "local" else 8))
        runner.run(client.close())
        cpu = {k: v - cpu0[k] for k, v in cpu_parts(svc.pid).items()}
        times1 = cpu_split.proc_times(svc.pid)
    left = local_leaks.leftovers(state, seen) if backend == "local" else {}
    parts = cpu_split.split(times0, times1, boxes, n) if boxes else {}
    svc.stop()
    c, e = common.summarize(res["create_s"]), common.summarize(res["exec_s"])
    d = common.summarize(del_t)
    growth = (svc_rss - svc_idle) / n
    # The engine's CPU is not local's (on a shared host it is other work's): reported apart.
    total_cpu = sum(cpu.values()) - (0.0 if backend == "docker" else cpu["engine"])
    return {
        "backend": backend,
        "runtime": used,
        "n": n,
        "ok": res["ok"],
        "success_rate": res["ok"] / n,
        "e2e_s": res["e2e_s"],
        "commands": len(res["exec_s"]),
        "commands_per_s": len(res["exec_s"]) / res["e2e_s"],
        "create_p50_ms": c["p50_ms"],
        "create_p99_ms": c["p99_ms"],
        "exec_p50_ms": e["p50_ms"],
        "exec_p99_ms": e["p99_ms"],
        "delete_p50_ms": d["p50_ms"],
        "delete_p99_ms": d["p99_ms"],
        "delete_all_s": del_wall,
        "host_peak_mib": peak.peak_mib - base,
        "host_mib_per_sandbox": host / n,
        "cgroup_mib_per_sandbox": cg,
        "service_growth_mib_per_sandbox": growth,
        "accounted_mib_per_sandbox": cg + growth,
        "agent_rss_mib": agents[1] / max(1, agents[0]),
        # Client + service + its children (+ dockerd/containerd for docker), per sandbox:
        # the machine's own budget, whatever else shares it (n x this / cores = best e2e).
        "cpu_ms_per_sandbox": 1000 * total_cpu / n,
        **{f"cpu_{k}_ms_per_sandbox": 1000 * v / n for k, v in cpu.items()},
        **{f"split_{k}_ms": v for k, v in parts.items()},
        # The whole host over the burst (create + commands, not the deletes): ours, the
        # kernel's threads (e.g. namespace teardown) and, on a shared host, others' work.
        "host_busy_ms_per_sandbox": 1000 * busy / n,
        "load_start": load0,
        "load_end": load1,
        "leftovers": left,
        "failures": res["failures"][:20],
    }


def engine_floor(image: str, n: int, conc: int) -> dict[str, Any]:
    """Plain `docker run -d` / `docker rm -f` through the Engine API: p50 of each."""
    dc = docker.from_env(max_pool_size=conc + 8, timeout=120)
    labels = {common.BENCH_LABEL: common.RUN_ID, "bench.floor": "1"}
    run_t: list[float] = []
    rm_t: list[float] = []

    def run(_: int) -> Any:
        t0 = time.perf_counter()
        c = dc.containers.run(
            image, ["sleep", "infinity"], detach=True, network_mode="none", labels=labels
        )
        run_t.append(time.perf_counter() - t0)
        return c

    def rm(c: Any) -> None:
        t0 = time.perf_counter()
        c.remove(force=True)
        rm_t.append(time.perf_counter() - t0)

    try:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(conc) as pool:
            containers = list(pool.map(run, range(n)))
        run_wall = time.perf_counter() - t0
        with ThreadPoolExecutor(min(conc, 32)) as pool:
            list(pool.map(rm, containers))
    finally:
        common.remove_containers("bench.floor=1")
        dc.close()
    r, d = common.summarize(run_t), common.summarize(rm_t)
    return {
        "n": n,
        "per_s": n / run_wall,
        "run_p50_ms": r["p50_ms"],
        "rm_p50_ms": d["p50_ms"],
    }


def workload_rows(results: list[dict[str, Any]], work: dict[str, Any]) -> list[list[Any]]:
    """The issue's ratios: each backend against the same commands as plain host processes."""
    pad = [""] * (len(results) - 1)
    rows: list[list[Any]] = [
        [f"workload floor: end to end (s, {work['n']} x 4 as host processes)", work["e2e_s"], *pad],
        ["workload floor: CPU per sandbox (ms)", work["cpu_ms_per_sandbox"], *pad],
    ]
    for label, key in (
        ("end to end / floor", "e2e_ratio"),
        ("CPU per sandbox / floor", "cpu_ratio"),
        ("overhead, % of the floor's CPU", "overhead_pct_of_floor_cpu"),
    ):
        rows.append([label, *(r.get(key, "") for r in results)])
    return rows


def main(cleanup: common.Cleanup) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--backend", choices=("both", "local", "docker"), default="both")
    ap.add_argument("--n", type=int, default=1000, help="sandboxes per backend (default 1000)")
    ap.add_argument("--concurrency", type=int, default=64, help="sandboxes in flight")
    ap.add_argument("--floor-n", type=int, default=100, help="plain containers for the floor")
    ap.add_argument(
        "--no-workload-floor",
        action="store_true",
        help="skip the four commands as plain host processes (bench/floor.py)",
    )
    ap.add_argument("--timeout", type=float, default=600, help="bound on each run, s")
    ap.add_argument(
        "--local-runtime",
        choices=("auto", "crun", "runc"),
        default="auto",
        help="the local backend's OCI runtime (default auto: crun if installed)",
    )
    args = ap.parse_args()
    image = common.bench_image()
    backends = ["local", "docker"] if args.backend == "both" else [args.backend]
    results: list[dict[str, Any]] = []
    for b in backends:
        results.append(
            run_backend(
                cleanup, b, image, args.n, args.concurrency, args.timeout, args.local_runtime
            )
        )
        # Kept as soon as one backend is done: a later one that fails must not lose it.
        partial = {"concurrency": args.concurrency, "image": image, "results": results}
        common.write_json("stress_local", partial)
    fl = engine_floor(image, args.floor_n, args.concurrency) if args.floor_n else {}
    work = {} if args.no_workload_floor else floor.measure(image, args.n, args.concurrency)
    for r in results if work else []:
        r.update(floor.ratios(r, work))
    rows: list[list[Any]] = []
    for label, key, unit in (
        ("success", "success_rate", "%"),
        ("end to end", "e2e_s", "s"),
        ("create p50", "create_p50_ms", "ms"),
        ("create p99", "create_p99_ms", "ms"),
        ("exec p50", "exec_p50_ms", "ms"),
        ("delete p50", "delete_p50_ms", "ms"),
        ("delete all", "delete_all_s", "s"),
        ("commands/s", "commands_per_s", ""),
        ("memory per idle sandbox, host (noisy)", "host_mib_per_sandbox", "MiB"),
        ("memory per idle sandbox, cgroup + service", "accounted_mib_per_sandbox", "MiB"),
        ("agent RSS", "agent_rss_mib", "MiB"),
        ("CPU per sandbox, create + 4 commands + delete", "cpu_ms_per_sandbox", "ms"),
        ("  of which the service and its children", "cpu_service_ms_per_sandbox", "ms"),
        ("    service (Python)", "split_service_ms", "ms"),
        ("    runtime (crun or runc, ip)", "split_runtime_ms", "ms"),
        ("    agent (incl. the runtime init's last stage)", "split_agent_ms", "ms"),
        ("    rest of the sandbox: the 4 commands", "split_commands_ms", "ms"),
        ("    of all these, kernel (system time)", "split_kernel_ms", "ms"),
        ("  of which this client", "cpu_client_ms_per_sandbox", "ms"),
        ("Docker engine CPU meanwhile, per sandbox", "cpu_engine_ms_per_sandbox", "ms"),
        ("host CPU busy in the burst, all, per sandbox", "host_busy_ms_per_sandbox", "ms"),
        ("load average (1 min), start of the burst", "load_start", ""),
        ("load average (1 min), end of the burst", "load_end", ""),
    ):
        vals = [100 * r[key] if unit == "%" else r.get(key, "") for r in results]
        rows.append([f"{label} ({unit})" if unit else label, *vals])
    if work:
        rows += workload_rows(results, work)
    if fl:
        pad = [""] * (len(results) - 1)
        rows.append(
            [f"engine floor: docker run -d p50 (ms, {fl['n']} plain)", fl["run_p50_ms"], *pad]
        )
        pad = [""] * (len(results) - 1)
        rows.append(["engine floor: docker rm -f p50 (ms)", fl["rm_p50_ms"], *pad])
    headers = ["measure", *(f"{r['backend']} {r['runtime']}".strip() for r in results)]
    md = common.table(
        f"stress: {args.n} sandboxes x {len(COMMANDS)} commands per backend", headers, rows
    )
    for r in results:
        for f in r["failures"]:
            print("FAIL", r["backend"], f)
        if r.get("leftovers"):
            print(f"{r['backend']} leftovers after the deletes:", r["leftovers"])
    local = next((r for r in results if r["backend"] == "local"), None)
    if local:
        print(
            f"\nlocal target: {args.n} x {len(COMMANDS)} at 100% in <= {TARGET_E2E_S:g} s, "
            f"<= {TARGET_MIB:g} MiB per idle sandbox: "
            f"{100 * local['success_rate']:.1f}%, {local['e2e_s']:.1f} s, "
            f"{local['accounted_mib_per_sandbox']:.1f} MiB accounted, "
            f"{local['host_mib_per_sandbox']:.1f} MiB host"
        )
    common.write_json(
        "stress_local",
        {
            "concurrency": args.concurrency,
            "image": image,
            "results": results,
            "floor": fl,
            "workload_floor": work,
            "markdown": md,
        },
    )
    return 0 if all(r["ok"] == r["n"] for r in results) else 1


if __name__ == "__main__":
    common.run(main)
