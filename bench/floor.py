"""The workload's own floor: the stress test's four commands as plain host processes.

The four commands of each sandbox (stress.COMMANDS) are the user's work; everything else
Orchard does around them (service, runtime, agent, namespaces, cgroups, mounts, network) is
overhead. The floor runs the same commands, N times, `concurrency` "sandboxes" in flight,
each running its four in order, as plain processes chrooted into the image's own root
filesystem (the same binaries and libraries), started the way the agent starts them
(`/bin/sh -c LINE` for a string, argv as is for a list, the agent's PATH and HOME). CPU is
the children's rusage (user + system) plus this driver's own, wall time from the first
start to the last exit: what stress_local.py measures of Orchard, minus Orchard.

    .venv/bin/python bench/floor.py [--n 1000] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
import cpu_split
from stress import COMMANDS

# What the agent gives a command it starts (agent/internal/exec): the image's PATH, HOME.
ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
}


def export_rootfs(image: str, dest: Path) -> Path:
    """The image's filesystem as a folder (`docker create` + `docker export`), for chroot."""
    cid = subprocess.run(
        ["docker", "create", "--label", f"{common.BENCH_LABEL}={common.RUN_ID}", image, "true"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    try:
        exp = subprocess.Popen(["docker", "export", cid], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", str(dest)], stdin=exp.stdout, check=True)
        if exp.wait() != 0:
            raise RuntimeError(f"docker export {cid} failed")
    finally:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True)
    return dest


def argv(cmd: str | list[str]) -> list[str]:
    return ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)


async def run_one(root: Path, cmd: str | list[str]) -> tuple[int, bytes]:
    # chroot(8) execs the command in place: one extra execve, no extra process.
    proc = await asyncio.create_subprocess_exec(
        "chroot",
        str(root),
        *argv(cmd),
        env=ENV,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, _err = await proc.communicate()
    return proc.returncode or 0, out


async def burst(root: Path, n: int, conc: int) -> dict[str, Any]:
    sem = asyncio.Semaphore(conc)
    failures: list[str] = []

    async def box(i: int) -> None:
        async with sem:
            for cmd in COMMANDS:
                code, out = await run_one(root, cmd)
                if code != 0 or not out.strip():
                    failures.append(f"#{i} {cmd!r}: exit {code}")
                    return

    t0 = time.perf_counter()
    await asyncio.gather(*(box(i) for i in range(n)))
    return {"e2e_s": time.perf_counter() - t0, "failures": failures}


def children_cpu() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime, r.ru_stime


def measure(image: str, n: int, conc: int) -> dict[str, Any]:
    """The floor of N sandboxes' commands on this host, now (call it beside Orchard's run)."""
    with tempfile.TemporaryDirectory(prefix="orchard-floor-") as d:
        root = export_rootfs(image, Path(d))
        asyncio.run(burst(root, 4, 4))  # page cache warm, as Orchard's warm-up create is
        load0 = os.getloadavg()[0]
        cu0, cs0 = children_cpu()
        me0 = sum(os.times()[:2])
        busy0 = cpu_split.host_busy_s()
        res = asyncio.run(burst(root, n, conc))
        busy = cpu_split.host_busy_s() - busy0
        cu1, cs1 = children_cpu()
        me = sum(os.times()[:2]) - me0
        shutil.rmtree(root, ignore_errors=True)
    commands = (cu1 - cu0) + (cs1 - cs0)
    return {
        "n": n,
        "concurrency": conc,
        "ok": n - len(res["failures"]),
        "e2e_s": res["e2e_s"],
        "cpu_ms_per_sandbox": 1000 * (commands + me) / n,
        "commands_ms_per_sandbox": 1000 * commands / n,
        "commands_sys_ms_per_sandbox": 1000 * (cs1 - cs0) / n,
        "driver_ms_per_sandbox": 1000 * me / n,
        "host_busy_ms_per_sandbox": 1000 * busy / n,
        "load_start": load0,
        "failures": res["failures"][:10],
    }


def ratios(orchard: dict[str, Any], floor: dict[str, Any]) -> dict[str, float]:
    """Orchard's run against the floor's: the issue's two targets, as numbers."""
    cpu, fcpu = orchard["cpu_ms_per_sandbox"], floor["cpu_ms_per_sandbox"]
    return {
        "e2e_ratio": orchard["e2e_s"] / floor["e2e_s"],
        "cpu_ratio": cpu / fcpu,
        "overhead_pct_of_floor_cpu": 100 * (cpu - fcpu) / fcpu,
    }


def main(cleanup: common.Cleanup) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--n", type=int, default=1000, help="sandboxes' worth of commands")
    ap.add_argument("--concurrency", type=int, default=64, help="sandboxes in flight")
    args = ap.parse_args()
    fl = measure(common.bench_image(), args.n, args.concurrency)
    rows = [[k, v] for k, v in fl.items() if k != "failures"]
    common.table(f"floor: {args.n} x {len(COMMANDS)} commands as host processes", ["", ""], rows)
    for f in fl["failures"]:
        print("FAIL", f)
    common.write_json("floor", fl)
    return 0 if fl["ok"] == fl["n"] else 1


if __name__ == "__main__":
    common.run(main)
