"""Soak: N sandboxes doing mixed operations for a set time; nothing may grow, nothing is lost.

    python bench/soak.py [--sandboxes 4] [--duration 600] [--sample 10]

Each worker owns a sandbox and loops over a mix: blocking exec, streaming exec, a
background process (start, wait, read output, delete), a file round trip (upload random
bytes, download, compare), and now and then a create+exec+delete of a fresh sandbox.
Every operation is counted by kind and outcome; any failure is recorded with its message
(there should be none). Every `--sample` seconds the service's and the agents' resident
memory and open files are read from /proc. Growth compares the mean of the first and last
quarter of the samples (the first sample after a warm-up minute, or 10% of the run).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import statistics
import subprocess
import threading
import time
from collections import Counter
from typing import Any

import httpx
from common import Cleanup, ServiceProcess, machine, rss_mib, run, table, write_json

from orchard.env import images


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def containers_of(ids: list[str]) -> list[str]:
    """The containers of these sandboxes: found by label, as names are an HMAC of the id."""
    out = subprocess.run(
        [
            "docker",
            "ps",
            "-a",
            "--filter",
            "label=orchard.sandbox",
            "--format",
            '{{.ID}} {{.Label "orchard.sandbox"}}',
        ],
        capture_output=True,
        text=True,
    ).stdout
    wanted = set(ids)
    return [c for c, _, sid in (line.partition(" ") for line in out.splitlines()) if sid in wanted]


def agent_pids(ids: list[str]) -> list[int]:
    fmt = "{{.State.Pid}}"
    out = subprocess.run(
        ["docker", "inspect", "-f", fmt, *containers_of(ids)],
        capture_output=True,
        text=True,
    ).stdout.split()
    return [int(p) for p in out if p.isdigit() and p != "0"]


class Soak:
    def __init__(self, svc: ServiceProcess, image: str, deadline: float) -> None:
        self.svc = svc
        self.image = image
        self.deadline = deadline
        self.ok: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        self.errors: list[str] = []
        self.lock = threading.Lock()

    def client(self) -> httpx.Client:
        transport = httpx.HTTPTransport(uds=str(self.svc.socket))
        return httpx.Client(transport=transport, base_url="http://orchard", timeout=120)

    def _record(self, kind: str, fn: Any) -> None:
        try:
            fn()
        except Exception as e:  # every failure is counted and kept, none is hidden
            with self.lock:
                self.failed[kind] += 1
                self.errors.append(f"{kind}: {type(e).__name__}: {str(e)[:200]}")
        else:
            with self.lock:
                self.ok[kind] += 1

    @staticmethod
    def _check(r: httpx.Response, status: int = 200) -> Any:
        if r.status_code != status:
            raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
        return r.json() if r.content and status != 204 else None

    def create(self, c: httpx.Client) -> str:
        sid: str = self._check(c.post("/v1/sandboxes", json={"image": self.image}), 201)["id"]
        return sid

    def worker(self, seed: int) -> None:
        rnd = random.Random(seed)
        with self.client() as c:
            sid = self.create(c)
            base = f"/v1/sandboxes/{sid}"

            def exec_() -> None:
                n = rnd.randint(1, 2000)
                out = self._check(c.post(base + "/exec", json={"cmd": f"seq {n} | tail -1"}))
                assert out["stdout"] == f"{n}\n", out

            def stream() -> None:
                body = {"cmd": "for i in 1 2 3; do echo $i; done"}
                with c.stream("POST", base + "/exec/stream", json=body) as r:
                    events = [json.loads(line) for line in r.iter_lines() if line]
                text = "".join(e.get("data", "") for e in events if e["type"] == "stdout")
                assert text == "1\n2\n3\n" and events[-1]["type"] == "exit", events

            def process() -> None:
                p = self._check(c.post(base + "/processes", json={"cmd": "echo bg"}), 201)
                pid = p["id"]
                info = self._check(c.get(f"{base}/processes/{pid}/wait", params={"timeout_s": 30}))
                assert info["status"] == "exited", info
                out = self._check(c.get(f"{base}/processes/{pid}/output"))
                assert out["data"] == "bg\n", out
                self._check(c.delete(f"{base}/processes/{pid}"), 204)

            def files() -> None:
                data = rnd.randbytes(rnd.randint(0, 256 << 10))
                path = {"path": f"/tmp/f{seed}"}
                self._check(c.put(base + "/files", params=path, content=data), 201)
                back = c.get(base + "/files", params=path)
                assert hashlib.sha256(back.content).digest() == hashlib.sha256(data).digest()

            def churn() -> None:
                extra = self.create(c)
                self._check(c.post(f"/v1/sandboxes/{extra}/exec", json={"cmd": "true"}))
                self._check(c.delete(f"/v1/sandboxes/{extra}"), 204)

            ops = [("exec", exec_)] * 4 + [("stream", stream), ("process", process)] * 2
            ops += [("files", files)] * 2 + [("create_delete", churn)]
            while time.monotonic() < self.deadline:
                kind, fn = rnd.choice(ops)
                self._record(kind, fn)
            self._check(c.delete(base), 204)


def main(cleanup: Cleanup) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sandboxes", type=int, default=4)
    ap.add_argument("--duration", type=float, default=600.0, help="seconds")
    ap.add_argument("--sample", type=float, default=10.0, help="seconds between samples")
    args = ap.parse_args()

    svc = ServiceProcess(cleanup)
    soak = Soak(svc, images.busybox_image(), time.monotonic() + args.duration)
    threads = [threading.Thread(target=soak.worker, args=(i,)) for i in range(args.sandboxes)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    samples: list[dict[str, float]] = []
    # Sampled only while the workers run (they delete their sandboxes at the end).
    while time.monotonic() + args.sample < soak.deadline:
        time.sleep(args.sample)
        with soak.client() as c:
            listed = c.get("/v1/sandboxes").json()["sandboxes"]
        pids = agent_pids([s["id"] for s in listed])
        agents = [(rss_mib(p), open_files(p)) for p in pids if os.path.exists(f"/proc/{p}")]
        samples.append(
            {
                "t_s": time.monotonic() - t0,
                "service_rss_mib": rss_mib(svc.pid),
                "service_fds": open_files(svc.pid),
                "agent_rss_mib": statistics.fmean(a[0] for a in agents) if agents else 0.0,
                "agent_fds": statistics.fmean(a[1] for a in agents) if agents else 0.0,
                "sandboxes": len(listed),
            }
        )
    for t in threads:
        t.join()

    warm = min(60.0, args.duration * 0.1)
    steady = [s for s in samples if s["t_s"] >= warm] or samples
    q = max(1, len(steady) // 4)
    growth = {
        k: statistics.fmean(s[k] for s in steady[-q:]) - statistics.fmean(s[k] for s in steady[:q])
        for k in ("service_rss_mib", "service_fds", "agent_rss_mib", "agent_fds")
    }
    total_ok, total_failed = sum(soak.ok.values()), sum(soak.failed.values())
    rows = [[k, soak.ok[k], soak.failed[k]] for k in sorted(soak.ok | soak.failed)]
    print(table("Soak: operations", ["operation", "ok", "failed"], rows))
    first, last = steady[0], steady[-1]
    print(
        table(
            "Soak: resources (steady state: first vs last sample, growth = last - first quarter)",
            ["what", "first", "last", "growth"],
            [[k, first[k], last[k], growth[k]] for k in growth],
        )
    )
    for e in soak.errors[:20]:
        print("error:", e)
    write_json(
        "soak",
        {
            "machine": machine(),
            "args": vars(args),
            "load_avg_at_end": os.getloadavg(),
            "ops_ok": dict(soak.ok),
            "ops_failed": dict(soak.failed),
            "ops_per_s": total_ok / (time.monotonic() - t0),
            "errors": soak.errors,
            "growth": growth,
            "samples": samples,
        },
    )
    return 1 if total_failed else 0


if __name__ == "__main__":
    run(main)
