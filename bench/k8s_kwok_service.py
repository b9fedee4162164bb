"""Orchard's deployed service at kwok scale: thousands of sandboxes held by two replicas.

bench/k8s_kwok.py measures the control plane and Orchard's backend in its own process;
this measures the service as users run it, deployed in the cluster (the `local` overlay,
two replicas, one per real node), with its sandboxes on kwok's fake Nodes:

  (a) N (5000) sandboxes through the service's NodePort, C (64) creates in flight, in
      batches (1000): create latency and rate; after every batch each replica's RSS and
      CPU time (from /proc: the replicas run on this machine's two nodes), the API
      server's RSS, and the API requests the replicas made per create (the API server's
      own count for the `service-accounts` flow schema, which only the replicas use while
      this runs); then every replica asked directly for the list (each must hold all N).
  (b) a warm pool of P (1000) on the fake Nodes: time to fill, claims at R/s (20, open
      loop, labels only: one pod update each) p50 / p99, then two clients, one per
      replica, racing for K (200) claims: no sandbox may be handed out twice.
  (c) quota exactness: the owner `capped` (max_sandboxes 5 in the overlay's limits)
      sends 50 creates at once, half to each replica: at most 5 may succeed, and the
      tenant namespace never holds more than 5 pods (sampled from the API server).
  (d) N deletes through the service.

A fake Node runs nothing, so no agent answers at a sandbox's address, and the service
waits for its agent's /health before a create returns. A FAKE AGENT stands in for it
(fake_agent below, named so in every result): one HTTP server on this machine, on the
agent port, that answers /health and PUT /defaults and nothing else, reached because the
fake Nodes' pod ranges are routed to this machine as its own addresses (`ip route add
local CIDR dev lo`, removed on the way out). It does not check tokens: it measures the
service, not the agent (tests/live and bench/k8s_bench.py run the real agent).

Needs root on the trial cluster's machine, Orchard's images loaded (`make test-k8s` or
`bash deploy/kubernetes/images/build.sh local` + `cluster.sh load`), and go (kwok):

    make bench-kwok-service   # = .venv/bin/python bench/k8s_kwok_service.py --kubeconfig K
        [--nodes 200 --sandboxes 5000 --batch 1000 --concurrency 64 --pool 1000 --rate 20]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
import k8s_kwok as kw
from k8s_deploy import Kube, Service, deployed
from k8s_pools import steady_claims
from lightkube.resources.core_v1 import Node

from orchard import Orchard
from orchard.env import images
from orchard.env.backends.kubernetes.objects import KubernetesOptions
from orchard.env.backends.kubernetes.tenants import tenant_namespace

AGENT_PORT = 9090  # KubernetesOptions.agent_port
OWNER, CAPPED, CAP = "alice", "capped", 5  # overlays/local/limits.yaml: capped's max_sandboxes
# The overlay's limits, with room for alice's sandboxes and pool (the default owner cap,
# env/limits.py, is 2,000).
LIMITS = """default: {}
capped: {max_sandboxes: 5}
alice: {max_sandboxes: 20000}
"""
SETTINGS = {
    "ORCHARD_K8S_NODE_SELECTOR": json.dumps(kw.NODE_LABELS),
    "ORCHARD_K8S_TOLERATIONS": json.dumps(kw.TOLERATIONS),
    "ORCHARD_K8S_PENDING_TIMEOUT_S": "900",
}


# ---------------------------------------------------------------- the fake agent


class _FakeAgent(BaseHTTPRequestHandler):
    """FAKE: answers what the service asks of a new or claimed sandbox's agent."""

    protocol_version = "HTTP/1.1"
    counts: dict[str, int] = {}
    lock = threading.Lock()

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        with self.lock:
            key = f"{self.command} {self.path.split('?')[0]}"
            self.counts[key] = self.counts.get(key, 0) + 1
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.split("?")[0] == "/health":
            self._answer(200, {"status": "ok", "version": "fake-kwok", "uptime_s": 1.0, "pid": 1})
        else:
            self._answer(501, {"code": "not_supported", "message": "fake agent (kwok bench)"})

    def do_PUT(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(n)
        if self.path.split("?")[0] == "/defaults":
            self._answer(200, {})
        else:
            self._answer(501, {"code": "not_supported", "message": "fake agent (kwok bench)"})

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def fake_agent(cidrs: list[str]) -> Iterator[dict[str, int]]:
    """The FAKE agent on AGENT_PORT, and the fake Nodes' pod ranges as local addresses."""
    added: list[str] = []
    server = ThreadingHTTPServer(("0.0.0.0", AGENT_PORT), _FakeAgent)
    server.handle_error = lambda request, client_address: None  # type: ignore[method-assign]
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        for cidr in cidrs:
            subprocess.run(["ip", "route", "replace", "local", cidr, "dev", "lo"], check=True)
            added.append(cidr)
        yield _FakeAgent.counts
    finally:
        for cidr in added:
            subprocess.run(["ip", "route", "del", "local", cidr, "dev", "lo"], check=False)
        server.shutdown()
        server.server_close()


# ---------------------------------------------------------------- what is sampled


def replica_pids() -> dict[str, int]:
    """The service replicas' processes on this machine (both nodes' pods are), by pid."""
    out = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if b"serve" in argv and b"kubernetes" in argv and b"orchard" in b" ".join(argv):
                out[f"replica-{proc.name}"] = int(proc.name)
    return out


def replicas_sample(label: str, held: int) -> dict[str, Any]:
    pids = replica_pids()
    api = kw._pids().get("kube-apiserver")
    return {
        "at": label,
        "held": held,
        "replica_rss_mib": {n: common.rss_mib(p) for n, p in pids.items()},
        "replica_cpu_s": {n: kw.k8s_cpu.proc_cpu_s(p) for n, p in pids.items()},
        "apiserver_rss_mib": common.rss_mib(api) if api else float("nan"),
    }


def sa_requests(kube: Kube) -> float:
    """Requests the API server has dispatched for service accounts (APF's flow schema
    `service-accounts`: the replicas here; the other service accounts stay idle)."""
    total = 0.0
    for line in kube.run("get", "--raw", "/metrics").splitlines():
        if line.startswith("apiserver_flowcontrol_dispatched_requests_total{") and (
            'flow_schema="service-accounts"' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


def replica_urls(kube: Kube) -> list[str]:
    pods = kube.get("pods", "-n", "orchard-system", "-l", "app.kubernetes.io/name=orchard")
    return [
        f"http://{p['status']['podIP']}:8080"
        for p in pods["items"]
        if p["status"].get("podIP") and not p["metadata"].get("deletionTimestamp")
    ]


# ---------------------------------------------------------------- (a) and (d)


def hold(
    kube: Kube, svc: Service, image: str, args: argparse.Namespace, samples: list[dict[str, Any]]
) -> tuple[dict[str, Any], list[str]]:
    ids: list[str] = []
    creates: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    batches = []
    with Orchard(base_url=svc.url, api_key=svc.keys[OWNER], timeout=900) as c:

        def one(i: int) -> None:
            t = time.monotonic()
            try:
                sb = c.sandboxes.create(image, labels={"kwok": "1"}, timeout_s=7200)
            except Exception as e:
                with lock:
                    errors.append(f"{i}: {e}")
                return
            with lock:
                creates.append(time.monotonic() - t)
                ids.append(sb.id)

        t0 = time.monotonic()
        with ThreadPoolExecutor(args.concurrency) as ex:
            for start in range(0, args.sandboxes, args.batch):
                tb, calls = time.monotonic(), sa_requests(kube)
                n = min(args.batch, args.sandboxes - start)
                list(ex.map(one, range(start, start + n)))
                took = time.monotonic() - tb
                per_create = (sa_requests(kube) - calls) / max(n, 1)
                batches.append({"held": len(ids), "s": took, "api_requests_per_create": per_create})
                samples.append(replicas_sample(f"{len(ids)} sandboxes", len(ids)))
                print(
                    f"  {len(ids)} sandboxes held ({took:.1f} s for {n}, "
                    f"{per_create:.1f} API requests each)",
                    flush=True,
                )
        wall = time.monotonic() - t0
    phases: dict[str, int] = {}  # the sandbox pods in the cluster, by namespace and phase
    for p in kube.get("pods", "-A", "-l", "app.kubernetes.io/component=sandbox")["items"]:
        key = f"{p['metadata']['namespace']} {p['status'].get('phase', '?')}" + (
            " (deleting)" if p["metadata"].get("deletionTimestamp") else ""
        )
        phases[key] = phases.get(key, 0) + 1
    views = {}
    for url in replica_urls(kube):
        with Orchard(base_url=url, api_key=svc.keys[OWNER], timeout=300) as direct:
            t = time.monotonic()
            listed = direct.sandboxes.list(labels={"kwok": "1"})
            views[url] = {"listed": len(listed), "list_s": time.monotonic() - t}
    return {
        "n": args.sandboxes,
        "held": len(ids),
        "concurrency": args.concurrency,
        "wall_s": wall,
        "creates_per_s": len(ids) / wall,
        "create": common.summarize(creates),
        "batches": batches,
        "replica_views": views,
        "sandbox_pods_by_phase": phases,
        "errors": len(errors),
        "first_errors": errors[:5],
    }, ids


def delete_all(svc: Service, ids: list[str], concurrency: int) -> dict[str, Any]:
    took: list[float] = []
    with Orchard(base_url=svc.url, api_key=svc.keys[OWNER], timeout=600) as c:

        def one(sid: str) -> None:
            t = time.monotonic()
            with contextlib.suppress(Exception):
                c.sandboxes.delete(sid)
                took.append(time.monotonic() - t)

        t0 = time.monotonic()
        with ThreadPoolExecutor(concurrency) as ex:
            list(ex.map(one, ids))
    return {"n": len(ids), "wall_s": time.monotonic() - t0, "delete": common.summarize(took)}


# ---------------------------------------------------------------- (b) pools


def pools(kube: Kube, svc: Service, image: str, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"size": args.pool}
    name = f"kwok-{common.RUN_ID}"
    with Orchard(base_url=svc.url, api_key=svc.keys[OWNER], timeout=900) as c:
        c.pools.create(name, image, args.pool)
        try:
            t = time.monotonic()
            c.pools.wait_ready(name, timeout_s=1800)
            out["fill_s"] = time.monotonic() - t
            print(f"  pool of {args.pool} filled in {out['fill_s']:.1f} s", flush=True)
            out["claims"] = steady_claims(c, name, args.claims, args.rate, env=False)
            c.pools.wait_ready(name, timeout_s=1800)
            out["race"] = race(kube, svc, name, args.race)
        finally:
            c.pools.delete(name)
    return out


def race(kube: Kube, svc: Service, pool: str, k: int) -> dict[str, Any]:
    """k claims at once, half to each replica directly: every claimed id distinct."""
    urls = replica_urls(kube)
    clients = [Orchard(base_url=u, api_key=svc.keys[OWNER], timeout=600) for u in urls]
    got: list[tuple[str, bool]] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        sb = clients[i % len(clients)].sandboxes.create(pool=pool, labels={"race": str(i)})
        with lock:
            got.append((sb.id, bool(sb.info.from_pool)))

    try:
        t0 = time.monotonic()
        with ThreadPoolExecutor(64) as ex:
            list(ex.map(one, range(k)))
        wall = time.monotonic() - t0
        with ThreadPoolExecutor(16) as ex:
            list(ex.map(clients[0].sandboxes.delete, [i for i, _ in got]))
    finally:
        for c in clients:
            c.close()
    ids = [i for i, _ in got]
    return {
        "claims": k,
        "replicas": len(urls),
        "distinct": len(set(ids)),
        "warm": sum(w for _, w in got),
        "wall_s": wall,
    }


# ---------------------------------------------------------------- (c) quota


def quota(kube: Kube, svc: Service, image: str, n: int = 50) -> dict[str, Any]:
    urls = replica_urls(kube)
    ns = tenant_namespace(KubernetesOptions(), CAPPED)
    peak, stop = 0, threading.Event()

    def sampler() -> None:
        nonlocal peak
        while not stop.is_set():
            with contextlib.suppress(Exception):
                peak = max(peak, kube.pod_count(ns))

    clients = [Orchard(base_url=u, api_key=svc.keys[CAPPED], timeout=600) for u in urls]
    made: list[str] = []
    refused: dict[str, int] = {}
    lock = threading.Lock()

    def one(i: int) -> None:
        try:
            sb = clients[i % len(clients)].sandboxes.create(image, labels={"q": str(i)})
        except Exception as e:
            code = getattr(e, "code", type(e).__name__)
            with lock:
                refused[code] = refused.get(code, 0) + 1
            return
        with lock:
            made.append(sb.id)

    watcher = threading.Thread(target=sampler, daemon=True)
    watcher.start()
    try:
        with ThreadPoolExecutor(n) as ex:
            list(ex.map(one, range(n)))
        time.sleep(2)
    finally:
        stop.set()
        watcher.join()
        for sid in made:
            with contextlib.suppress(Exception):
                clients[0].sandboxes.delete(sid)
        for c in clients:
            c.close()
    return {
        "cap": CAP,
        "sent": n,
        "replicas": len(urls),
        "created": len(made),
        "refused": refused,
        "peak_pods": peak,
    }


# ---------------------------------------------------------------- run


def _report(out: dict[str, Any]) -> str:
    a, samples = out["hold"], out["samples"]
    first, last = samples[0], samples[-1]
    k = max(a["held"], 1) / 1000
    both = first["replica_rss_mib"].keys() & last["replica_rss_mib"].keys()  # same processes
    rss0, rss1 = (sum(s["replica_rss_mib"][n] for n in both) for s in (first, last))
    cpu0, cpu1 = (sum(s["replica_cpu_s"][n] for n in both) for s in (first, last))
    per_create = [b["api_requests_per_create"] for b in a["batches"]]
    views = ", ".join(str(v["listed"]) for v in a["replica_views"].values())
    rows: list[list[Any]] = [
        ["fake Nodes Ready (FAKE agent on their addresses)", out["nodes"]["n"],
         f"{out['nodes']['ready_s']:.1f} s"],
        ["sandboxes through the service (2 replicas)", f"{a['held']} of {a['n']}, "
         f"{a['concurrency']} at once", f"{_p(a['create'])}, {a['creates_per_s']:.1f}/s"],
        ["API requests per create (the replicas')", a["held"],
         f"{min(per_create):.1f}-{max(per_create):.1f}"],
        [f"replicas' RSS ({len(both)} processes)", f"{rss0:.0f} → {rss1:.0f} MiB",
         f"{(rss1 - rss0) / k:+.1f} MiB / 1,000 sandboxes"],
        [f"replicas' CPU ({len(both)} processes)", f"{cpu1 - cpu0:.0f} s",
         f"{(cpu1 - cpu0) / a['held'] * 1000:.0f} ms per create"],
        ["each replica lists them all", f"{len(a['replica_views'])} replicas", views],
    ]  # fmt: skip
    if p := out.get("pools"):
        cl, r = p["claims"], p["race"]
        rows += [
            ["pool on the fake Nodes: fill", p["size"], f"{p['fill_s']:.1f} s"],
            [f"pool claims at {out['args']['rate']:g}/s (labels only)",
             f"{cl['n']}, {cl['warm']} warm",
             f"{_p(cl)}, {cl['rate_achieved']:.1f}/s reached"],
            ["claims racing on both replicas", f"{r['claims']}, {r['warm']} warm",
             f"{r['distinct']} distinct sandboxes"],
        ]  # fmt: skip
    if q := out.get("quota"):
        rows.append(
            [f"quota {q['cap']}: creates at once on {q['replicas']} replicas", q["sent"],
             f"{q['created']} made, peak {q['peak_pods']} pods, refused {q['refused']}"]
        )  # fmt: skip
    if d := out.get("delete"):
        rows.append(["deletes through the service", d["n"],
                     f"{_p(d['delete'])}, {d['wall_s']:.1f} s wall"])  # fmt: skip
    return common.table("Orchard deployed at kwok scale", ["what", "n", "result"], rows)


def _p(d: dict[str, Any]) -> str:
    return f"p50 {d['p50_ms']:.0f} ms, p99 {d['p99_ms']:.0f} ms"


async def _nodes(kubeconfig: str, n: int) -> tuple[dict[str, Any], list[str]]:
    client = kw._client(kubeconfig)
    try:
        made = await kw.make_nodes(client, n, 32)
        nodes = [x async for x in client.list(Node, labels={common.BENCH_LABEL: kw.BENCH})]
        return made, [x.spec.podCIDR for x in nodes if x.spec and x.spec.podCIDR]
    finally:
        await client.close()


def main(cleanup: common.Cleanup) -> int:
    ap = kw.parser(__doc__)
    ap.add_argument("--sandboxes", type=int, default=5000, help="(a): sandboxes held")
    ap.add_argument("--batch", type=int, default=1000, help="(a): sampled after each batch")
    ap.add_argument("--concurrency", type=int, default=64, help="(a), (d): requests at once")
    ap.add_argument("--pool", type=int, default=1000, help="(b): pool size; 0 skips (b)")
    ap.add_argument("--claims", type=int, default=100, help="(b): claims at --rate")
    ap.add_argument("--rate", type=float, default=20, help="(b): claims a second")
    ap.add_argument("--race", type=int, default=200, help="(b): claims racing on both replicas")
    args = ap.parse_args()
    kube = Kube(args.kubeconfig)
    kw.start_kwok(cleanup, kube)
    image = images.busybox_image()
    out: dict[str, Any] = {"args": vars(args), "agent": "FAKE (see the module docstring)"}
    t0 = time.monotonic()
    try:
        print(f"creating {args.nodes} fake Nodes", flush=True)
        out["nodes"], cidrs = asyncio.run(_nodes(args.kubeconfig, args.nodes))
        with fake_agent(cidrs) as agent_counts, deployed(kube, SETTINGS, LIMITS) as svc:
            time.sleep(10)  # the replicas the rollout replaced are gone
            samples = [replicas_sample("deployed", 0)]
            out["samples"] = samples
            print(f"holding {args.sandboxes} sandboxes through the service", flush=True)
            out["hold"], ids = hold(kube, svc, image, args, samples)
            if args.pool:
                print(f"a pool of {args.pool} beside them", flush=True)
                out["pools"] = pools(kube, svc, image, args)
            print("quota under two replicas", flush=True)
            out["quota"] = quota(kube, svc, image)
            print(f"deleting the {len(ids)} sandboxes", flush=True)
            out["delete"] = delete_all(svc, ids, args.concurrency)
            out["fake_agent_requests"] = dict(agent_counts)
        out["markdown"] = _report(out)
    finally:
        out["total_s"] = time.monotonic() - t0
        name = "k8s_kwok_service" if "markdown" in out else "k8s_kwok_service_partial"
        common.write_json(name, out)
    return 0


if __name__ == "__main__":
    common.run(main)
