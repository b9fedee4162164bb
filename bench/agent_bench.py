"""Agent budgets and exec latency, measured beside the floors on this machine.

Checks the agent's budgets (binary <= 12 MB, idle RSS <= 8 MiB, ready <= 20 ms after
start) and compares its exec latency with a host fork/exec of the same command, in
the same run, so the ratio means something on a noisy machine. Prints a table and
writes bench/results/agent.json.

    .venv/bin/python bench/agent_bench.py [--n 300]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AGENT = Path(os.environ.get("ORCHARD_AGENT_BINARY", ROOT / "build" / "orchard-agent"))
BUDGETS = {"binary_mb": 12.0, "idle_rss_mib": 8.0, "ready_ms": 20.0}


class UnixHTTPConnection(http.client.HTTPConnection):
    """Stdlib HTTP over a Unix socket: the cheapest client, so we time the agent, not the client."""

    def __init__(self, path: str) -> None:
        super().__init__("localhost")
        self.path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(self.path)
        self.sock = s


def start_agent(sock: Path, token: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "ORCHARD_AGENT_TOKEN": token}
    return subprocess.Popen(
        [str(AGENT), "--socket", str(sock), "--spill-dir", str(sock.parent / "spill")],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def time_to_ready(tmp: Path, token: str) -> float:
    """Seconds from spawn to the first /health answered over the socket."""
    sock = tmp / f"ready-{secrets.token_hex(4)}.sock"
    t0 = time.perf_counter()
    proc = start_agent(sock, token)
    try:
        while True:
            try:
                conn = UnixHTTPConnection(str(sock))
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    return time.perf_counter() - t0
            except OSError:
                pass
            if time.perf_counter() - t0 > 5:
                raise RuntimeError("agent did not become ready in 5 s")
            time.sleep(0.0005)
    finally:
        proc.terminate()
        proc.wait()


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def summarize(name: str, xs: list[float]) -> dict[str, float | str]:
    ms = [x * 1000 for x in xs]
    return {
        "path": name,
        "p50_ms": pct(ms, 0.5),
        "p90_ms": pct(ms, 0.9),
        "p99_ms": pct(ms, 0.99),
        "mean_ms": statistics.fmean(ms),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--n", type=int, default=300, help="exec samples per path (default 300)")
    args = ap.parse_args()
    if not AGENT.exists():
        print(f"agent binary {AGENT} missing: run `make agent`", file=sys.stderr)
        return 2
    token = secrets.token_hex(16)
    out: dict[str, object] = {"binary_mb": AGENT.stat().st_size / 1e6}
    with tempfile.TemporaryDirectory(prefix="orchard-bench-") as d:
        tmp = Path(d)
        readies = [time_to_ready(tmp, token) * 1000 for _ in range(20)]
        out["ready_ms_p50"] = statistics.median(readies)
        sock = tmp / "agent.sock"
        proc = start_agent(sock, token)
        try:
            while not sock.exists():
                time.sleep(0.001)
            time.sleep(0.3)
            out["idle_rss_mib"] = rss_mib(proc.pid)
            conn = UnixHTTPConnection(str(sock))
            body = json.dumps({"cmd": ["sh", "-c", "true"]})
            headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
            agent_t: list[float] = []
            host_t: list[float] = []
            for _ in range(args.n):  # interleaved, so drift hits both paths alike
                t0 = time.perf_counter()
                conn.request("POST", "/exec", body=body, headers=headers)
                resp = conn.getresponse()
                payload = json.loads(resp.read())
                agent_t.append(time.perf_counter() - t0)
                if resp.status != 200 or payload.get("exit_code") != 0:
                    raise RuntimeError(f"exec failed: {resp.status} {payload}")
                t0 = time.perf_counter()
                subprocess.run(["sh", "-c", "true"], check=True)
                host_t.append(time.perf_counter() - t0)
            out["rss_after_execs_mib"] = rss_mib(proc.pid)
        finally:
            proc.terminate()
            proc.wait()
    rows = [summarize("agent /exec over Unix socket", agent_t), summarize("host fork/exec", host_t)]
    agent_p50 = float(rows[0]["p50_ms"])
    for r in rows:
        r["ratio_to_agent"] = float(r["p50_ms"]) / agent_p50
    out["exec"] = rows
    print(f"{'path':32} {'p50':>8} {'p90':>8} {'p99':>8} {'mean':>8} {'ratio':>7}")
    for r in rows:
        print(
            f"{r['path']:32} {r['p50_ms']:8.2f} {r['p90_ms']:8.2f} {r['p99_ms']:8.2f}"
            f" {r['mean_ms']:8.2f} {r['ratio_to_agent']:7.2f}"
        )
    checks = {
        "binary_mb": float(out["binary_mb"]),  # type: ignore[arg-type]
        "idle_rss_mib": float(out["idle_rss_mib"]),  # type: ignore[arg-type]
        "ready_ms": float(out["ready_ms_p50"]),  # type: ignore[arg-type]
    }
    print()
    for key, value in checks.items():
        ok = "ok" if value <= BUDGETS[key] else "OVER BUDGET"
        print(f"{key:14} {value:8.2f}  (budget {BUDGETS[key]:.0f})  {ok}")
    out["budgets"] = BUDGETS
    res = ROOT / "bench" / "results"
    res.mkdir(parents=True, exist_ok=True)
    (res / "agent.json").write_text(json.dumps(out, indent=2))
    print(f"\nwrote {res / 'agent.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
