"""Load: the highest exec rate the service sustains with p99 latency under 50 ms.

    python bench/load.py [--sandboxes 4] [--levels 1,2,4,8,16,32] [--seconds 10]

Closed loop: at each concurrency level, that many client threads run `exec true` round
robin over the sandboxes for `--seconds`. For each level: requests per second, p50/p99
latency, errors, and the CPU each part used (the service process, the agents, this client),
as a share of one core, so the part that saturates first is named. The answer is the best
rate among levels whose p99 stays under the bound. Client and service share this machine,
so the client's own CPU is reported beside them.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from typing import Any

import httpx
from common import Cleanup, ServiceProcess, machine, run, summarize, table, write_json
from soak import agent_pids

from orchard.env import images

P99_BOUND_MS = 50.0
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (and its reaped children)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / _TICK


def host_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        vals = [int(x) / _TICK for x in f.readline().split()[1:8]]
    return sum(vals) - vals[3] - vals[4], sum(vals)  # idle and iowait are not busy


def level(svc: ServiceProcess, ids: list[str], agents: list[int], n: int, secs: float) -> Any:
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    stop = time.monotonic() + secs

    def worker(k: int) -> None:
        transport = httpx.HTTPTransport(uds=str(svc.socket))
        with httpx.Client(transport=transport, base_url="http://orchard", timeout=60) as c:
            i = k
            while time.monotonic() < stop:
                sid = ids[i % len(ids)]
                i += 1
                t0 = time.perf_counter()
                r = c.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": ["true"]})
                dt = time.perf_counter() - t0
                with lock:
                    if r.status_code == 200 and r.json()["exit_code"] == 0:
                        latencies.append(dt)
                    else:
                        errors.append(f"{r.status_code} {r.text[:100]}")

    host0 = host_busy()
    before = (cpu_s(svc.pid), sum(cpu_s(p) for p in agents), time.process_time())
    t0 = time.monotonic()
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    after = (cpu_s(svc.pid), sum(cpu_s(p) for p in agents), time.process_time())
    host1 = host_busy()
    parts = ("service", "agents", "client")
    cpu = {part: (a - b) / wall for part, a, b in zip(parts, after, before, strict=True)}
    # Everything else on the machine (other jobs, dockerd, the kernel): cores busy, not ours.
    cpu["rest_of_host"] = max(0.0, (host1[0] - host0[0]) / wall - sum(cpu.values()))
    return {
        "concurrency": n,
        "rps": len(latencies) / wall,
        **summarize(latencies),
        "errors": len(errors),
        "error_samples": errors[:5],
        "cpu_cores": cpu,
    }


def main(cleanup: Cleanup) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sandboxes", type=int, default=4)
    ap.add_argument("--levels", default="1,2,4,8,16,32")
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()

    svc = ServiceProcess(cleanup)
    image = images.busybox_image()
    transport = httpx.HTTPTransport(uds=str(svc.socket))
    with httpx.Client(transport=transport, base_url="http://orchard", timeout=120) as c:
        ids = [
            c.post("/v1/sandboxes", json={"image": image}).json()["id"]
            for _ in range(args.sandboxes)
        ]
    agents = agent_pids(ids)
    results = [level(svc, ids, agents, int(n), args.seconds) for n in args.levels.split(",") if n]
    rows = [
        [
            r["concurrency"],
            r["rps"],
            r["p50_ms"],
            r["p99_ms"],
            r["errors"],
            r["cpu_cores"]["service"],
            r["cpu_cores"]["agents"],
            r["cpu_cores"]["client"],
            r["cpu_cores"]["rest_of_host"],
        ]
        for r in results
    ]
    print(
        table(
            "Load: exec true, closed loop (cpu columns: cores busy)",
            ["clients", "req/s", "p50 ms", "p99 ms", "errors", "svc", "agents", "client", "rest"],
            rows,
        )
    )
    good = [r for r in results if r["p99_ms"] < P99_BOUND_MS and not r["errors"]]
    best = max(good, key=lambda r: r["rps"]) if good else None
    top = results[-1]["cpu_cores"]
    first = max(top, key=lambda k: top[k])
    if best:
        print(f"highest rate with p99 < {P99_BOUND_MS:g} ms: {best['rps']:.0f} req/s")
    print(f"at the highest load, the busiest part: {first} ({top[first]:.2f} cores)")
    write_json(
        "load",
        {
            "machine": machine(),
            "args": vars(args),
            "load_avg_at_end": os.getloadavg(),
            "levels": results,
            "best_under_bound": best,
            "saturates_first": first,
        },
    )
    return 0 if all(not r["errors"] for r in results) else 1


if __name__ == "__main__":
    run(main)
