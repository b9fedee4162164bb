"""Footprint: the agent's idle resident memory and start-to-ready time, on the host and inside.

Host: the agent as a plain process (spawn -> first /health answered), as in agent_bench.py.
Inside a sandbox: the idle agent's RSS and its cgroup's charge, and the service's own RSS.

    .venv/bin/python bench/footprint.py [--n 50]
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import agent_bench
import common

from orchard import Orchard


def main(cleanup: common.Cleanup) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--n", type=int, default=50, help="agent starts timed on the host")
    args = ap.parse_args()
    token = secrets.token_hex(16)
    binary = common.agent_binary()
    out: dict[str, Any] = {"binary_mib": binary.stat().st_size / 2**20}
    with tempfile.TemporaryDirectory(prefix="orchard-fp-") as d:
        tmp = Path(d)
        ready = [agent_bench.time_to_ready(tmp, token) * 1000 for _ in range(args.n)]
        sock = tmp / "idle.sock"
        proc = agent_bench.start_agent(sock, token)
        try:
            while not sock.exists():
                time.sleep(0.001)
            time.sleep(0.5)
            out["host_idle_rss_mib"] = common.rss_mib(proc.pid)
        finally:
            proc.terminate()
            proc.wait()
    out["ready_ms_p50"] = statistics.median(ready)
    out["ready_ms_p99"] = common.pct(ready, 0.99)

    image = common.bench_image()
    svc = common.ServiceProcess(cleanup)
    client = Orchard(svc.url)
    cleanup.add("client", client.close)
    time.sleep(1)
    out["service_idle_rss_mib"] = common.rss_mib(svc.pid)
    sb = client.sandboxes.create(image, labels=common.LABELS)
    time.sleep(1)
    cid = common.container_ids(f"orchard.sandbox={sb.id}")[0]
    pid = int(
        subprocess.run(
            ["docker", "inspect", "--format", "{{.State.Pid}}", cid], capture_output=True, text=True
        ).stdout
    )
    out["sandbox_agent_rss_mib"] = common.rss_mib(pid)
    out["sandbox_cgroup_mib"] = common.cgroup_mib(cid)
    rows = [
        ["agent binary", f"{out['binary_mib']:.1f} MiB"],
        [
            "agent start -> ready (host, p50 / p99)",
            f"{out['ready_ms_p50']:.2f} / {out['ready_ms_p99']:.2f} ms",
        ],
        ["agent idle RSS (host process)", f"{out['host_idle_rss_mib']:.1f} MiB"],
        ["agent idle RSS (in a sandbox)", f"{out['sandbox_agent_rss_mib']:.1f} MiB"],
        ["idle sandbox cgroup charge", f"{out['sandbox_cgroup_mib']:.1f} MiB"],
        ["service RSS, idle", f"{out['service_idle_rss_mib']:.0f} MiB"],
    ]
    out["markdown"] = common.table("footprint", ["measure", "value"], rows)
    common.write_json("footprint", out)
    return 0


if __name__ == "__main__":
    common.run(main)
