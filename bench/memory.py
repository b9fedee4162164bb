"""Memory snapshots (CRIU, local backend): checkpoint and restore time, image size.

Two workloads, each in its own sandbox: `counter` (busybox, a shell loop) and `python`
(Debian, a Python HTTP server holding --mib MiB in memory). Per workload: a memory
snapshot (wall time, CRIU's own checkpoint time, image size) and a sandbox made from it
(wall time to ready, CRIU's restore time), then a fork x--n with memory. The peer, in
the same run: a files-only snapshot and fork x--n of the same sandbox, after which each
copy must start its process again and wait for it (what a memory fork saves).

    .venv/bin/python bench/memory.py [--n 4] [--rounds 3] [--mib 64]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

from orchard import Orchard
from orchard.env.backends.local import criu
from orchard.env.config import ServiceConfig
from orchard.env.images import busybox_image, debian_python_image
from orchard.env.sdk import Sandbox

COUNTER = "i=0; while true; do i=$((i+1)); echo $i > /tmp/t; mv /tmp/t /tmp/n; sleep 0.05; done"
SERVER = """
import http.server, sys
held = b"x" * (int(sys.argv[1]) << 20)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", 8000), H).serve_forever()
"""
GET = "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/')"


def _wait(check: Callable[[], bool], within_s: float = 60) -> None:
    deadline = time.monotonic() + within_s
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit("the workload never came up")
        time.sleep(0.05)


def _workloads(mib: int) -> dict[str, tuple[str, Callable[[Sandbox], None]]]:
    def counter(sb: Sandbox) -> None:
        sb.process.start(COUNTER)
        _wait(lambda: sb.exec("test -s /tmp/n").exit_code == 0)

    def python(sb: Sandbox) -> None:
        sb.process.start(["python3", "-c", SERVER, str(mib)])
        _wait(lambda: sb.exec(["python3", "-c", GET]).exit_code == 0)

    debian = debian_python_image(("python3", "git", "python3-pytest", "ca-certificates"))
    return {"counter": (busybox_image(), counter), "python": (debian, python)}


def _meta(state: Path, kind: str, ident: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((state / kind / ident / "meta.json").read_text())
    return data


def _bench(
    c: Orchard, state: Path, image: str, start: Callable[[Sandbox], None], n: int, rounds: int
) -> dict[str, Any]:
    out: dict[str, list[float]] = {k: [] for k in ("snap", "ckpt", "mib", "copy", "restore")}
    out |= {"fork": [], "files_snap": [], "files_copy": [], "files_fork": []}
    with c.sandboxes.create(image) as src:
        start(src)
        for _ in range(rounds):
            t0 = time.perf_counter()
            snap = src.snapshot(memory=True)
            out["snap"].append(time.perf_counter() - t0)
            extra = _meta(state, "snapshots", snap.id)["extra"]["memory"]
            out["ckpt"].append(extra["checkpoint_ms"] / 1000)
            out["mib"].append(extra["bytes"] / (1 << 20))
            t0 = time.perf_counter()
            with c.sandboxes.create(snapshot=snap.id) as copy:
                out["copy"].append(time.perf_counter() - t0)
                out["restore"].append(_meta(state, "sandboxes", copy.id)["restore_ms"] / 1000)
            t0 = time.perf_counter()
            with src.fork(n, memory=True) as forks:
                assert len(forks) == n, forks.errors
                out["fork"].append(time.perf_counter() - t0)
            # The peer: files only, then each copy starts its process again.
            t0 = time.perf_counter()
            files = src.snapshot()
            out["files_snap"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            with c.sandboxes.create(snapshot=files.id) as copy:
                start(copy)
                out["files_copy"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            with src.fork(n) as forks:
                for sb in forks:
                    start(sb)
                out["files_fork"].append(time.perf_counter() - t0)
            for s in c.snapshots.list():
                c.snapshots.delete(s.id)
    return {k: statistics.median(v) for k, v in out.items()}


def main(cleanup: common.Cleanup) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mib", type=int, default=64, help="memory the Python workload holds")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.n < 1 or args.rounds < 1 or args.mib < 0:
        ap.error("--n and --rounds must be at least 1, --mib at least 0")
    why = criu.unsupported()
    if why is not None:
        print(f"memory snapshots are not available here: {why}")
        return 0
    rounds = 1 if args.quick else args.rounds
    state = Path(tempfile.mkdtemp(prefix="om-"))
    cfg = ServiceConfig(
        state_dir=state,
        backend="local",
        agent_binary=str(common.agent_binary()),
        extra_labels={common.BENCH_LABEL: common.RUN_ID},
    )
    results = {}
    with Orchard(service_config=cfg) as c:
        for name, (image, start) in _workloads(args.mib).items():
            results[name] = _bench(c, state, image, start, args.n, rounds)
    rows = [
        [
            name,
            f"{r['snap'] * 1000:.0f} ms ({r['ckpt'] * 1000:.0f})",
            f"{r['mib']:.1f} MiB",
            f"{r['copy'] * 1000:.0f} ms ({r['restore'] * 1000:.0f})",
            f"{r['files_copy'] * 1000:.0f} ms",
            f"{r['fork']:.2f} s",
            f"{r['files_fork']:.2f} s",
        ]
        for name, r in results.items()
    ]
    headers = [
        "workload",
        "memory snapshot (CRIU dump)",
        "image",
        "copy ready (CRIU restore)",
        "files-only copy + restart",
        f"memory fork x{args.n}",
        f"files fork x{args.n} + restart",
    ]
    print(common.table("Memory snapshots (local, CRIU)", headers, rows))
    common.write_json("memory", {"machine": common.machine(), "mib": args.mib, "results": results})
    return 0


if __name__ == "__main__":
    common.run(main)
