"""Orchard-GUI: browser sandbox cold start, reset and step latency, memory, and a direct peer.

Measured through `orchard serve` on a Unix socket (so Playwright goes through the relay and
the service's port proxy, as with `Orchard()`):
  - cold start: `BrowserEnv.reset` on a new env (sandbox, offline sites, Chromium, first
    observation of the shop's home page);
  - reset: later resets of one env (sites reset, browser wiped, start page, observation);
  - step: `env.step` per action type (each includes its observation, a PNG screenshot);
  - memory: the browser sandbox's cgroup (`memory.current`) and `docker stats` usage.
The peer, in the same run and on the same Chromium: the same `Browser` actions and
observations over a direct CDP connection to the container's IP on the Docker bridge, so
the proxy's overhead is a ratio. New headless Chromium binds DevTools to 127.0.0.1 only,
so the peer goes through a minimal TCP forwarder in the sandbox (stdlib Python threads).

    .venv/bin/python bench/gui_bench.py [--quick] [--rounds 20] [--resets 30] [--cold 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

from orchard import Orchard
from orchard.gui.actions import parse_action
from orchard.gui.browser import Browser
from orchard.gui.browser_env import BrowserEnv, EnvConfig
from orchard.gui.image import browser_image
from orchard.gui.types import CDP_PORT, SITE_HOSTS, SITES_PORT, WebTask

FORWARD_PORT = 9223
PAGE_PORT = 8001
PAGE_URL = f"http://bench.localhost:{PAGE_PORT}/page.html"
SHOP = WebTask(id="shop", ques="", web=f"http://{SITE_HOSTS['shop']}:{SITES_PORT}/")
FORWARDER = f"""
import socket, threading
def pump(a, b):
    try:
        while data := a.recv(65536):
            b.sendall(data)
    except OSError:
        pass
    finally:
        try: b.shutdown(socket.SHUT_WR)
        except OSError: pass
def serve(c):
    u = socket.create_connection(("127.0.0.1", {CDP_PORT}))
    for s in (c, u):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    threading.Thread(target=pump, args=(u, c), daemon=True).start()
    pump(c, u)
srv = socket.create_server(("0.0.0.0", {FORWARD_PORT}))
while True:
    threading.Thread(target=serve, args=(srv.accept()[0],), daemon=True).start()
"""
PAGE = """<!doctype html><title>Bench</title><style>
body { margin: 0; height: 6000px; font: 16px sans-serif }
#btn { position: absolute; left: 100px; top: 100px; width: 200px; height: 60px }
#name { position: absolute; left: 100px; top: 200px; width: 300px; height: 30px }
</style><button id="btn" onclick="this.textContent = 'clicked ' + Date.now()">press</button>
<input id="name" value="old text">"""
# (row name, tool call); grid points are those of #btn and #name at 1280x1000.
STEPS: list[tuple[str, str, dict[str, Any]]] = [
    ("goto_url", "goto_url", {"url": PAGE_URL}),
    ("click", "click", {"x": 156, "y": 130}),
    ("write", "write", {"text": "hello bench", "x": 195, "y": 215}),
    ("scroll", "scroll", {"direction": "down", "amount": 0.5}),
    ("screenshot (observe)", "", {}),
]


def container_of(sandbox_id: str) -> str:
    ids = common.container_ids(f"orchard.sandbox={sandbox_id}")
    if len(ids) != 1:
        raise RuntimeError(f"expected one container for {sandbox_id}, found {ids}")
    return ids[0]


def docker_stats_mib(cid: str) -> float:
    """`docker stats` memory usage (cgroup usage minus inactive page cache), in MiB."""
    out = (
        subprocess.run(
            ["docker", "stats", "--no-stream", "--format", "{{.MemUsage}}", cid],
            capture_output=True,
            text=True,
        )
        .stdout.split("/")[0]
        .strip()
    )
    units = {"KiB": 1 / 1024, "MiB": 1.0, "GiB": 1024.0, "B": 1 / 2**20}
    for unit, scale in units.items():
        if out.endswith(unit):
            return float(out.removesuffix(unit)) * scale
    return float("nan")


def start_direct_peer(
    client: Orchard, env: BrowserEnv, cid: str
) -> tuple[ThreadPoolExecutor, Browser]:
    """A second Playwright (in its own thread) on the env's Chromium, straight over the bridge."""
    sb = env.sandbox
    sb.files.write("/opt/bench/forward.py", FORWARDER)
    sb.process.start(["python3", "/opt/bench/forward.py"], tag="cdp-forward")
    ip = subprocess.run(
        [
            "docker",
            "inspect",
            "-f",
            "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
            cid,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not ip:
        raise RuntimeError("the browser sandbox has no bridge IP (its network must allow egress)")
    thread = ThreadPoolExecutor(max_workers=1)  # Playwright's sync API stays in one thread
    peer = Browser(client, sb, env.config.viewport)

    def connect() -> None:
        deadline = time.monotonic() + 20
        while True:
            try:
                peer.attach(f"http://{ip}:{FORWARD_PORT}")
                break
            except Exception:
                peer.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        peer.new_session()
        peer.begin(PAGE_URL)

    thread.submit(connect).result()
    return thread, peer


def serve_page(client: Orchard, env: BrowserEnv) -> None:
    sb = env.sandbox
    sb.files.write("/srv/bench/page.html", PAGE)
    sb.process.start(f"python3 -m http.server {PAGE_PORT} --bind 127.0.0.1 -d /srv/bench")
    deadline = time.monotonic() + 20
    while client.http.get(sb.port_url(PAGE_PORT, "page.html")).status_code != 200:
        if time.monotonic() > deadline:
            raise RuntimeError("the bench page's server did not start")
        time.sleep(0.1)


def main(cleanup: common.Cleanup) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small samples (under a minute)")
    ap.add_argument("--cold", type=int, default=5, help="cold starts (new env each)")
    ap.add_argument("--resets", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=20, help="rounds of each step, per peer")
    args = ap.parse_args()
    if args.quick:
        args.cold, args.resets, args.rounds = 2, 10, 5
    image = browser_image()
    svc = common.ServiceProcess(cleanup)
    client = Orchard(svc.url)
    cleanup.add("client", client.close)
    out: dict[str, Any] = {"image": image, "quick": args.quick}

    cold: list[float] = []
    for _ in range(args.cold):
        env = BrowserEnv(client, image=image, config=EnvConfig(labels=dict(common.LABELS)))
        try:
            with common.timer(cold):
                env.reset(SHOP)
        finally:
            env.close()

    # egress "all" puts the sandbox on a bridge, where the direct peer can reach it.
    config = EnvConfig(labels=dict(common.LABELS), network={"egress": "all"}, max_steps=10**6)
    env = BrowserEnv(client, image=image, config=config)
    cleanup.add("browser env", env.close)
    env.reset(SHOP)
    resets: list[float] = []
    for _ in range(args.resets):
        with common.timer(resets):
            env.reset(SHOP)

    cid = container_of(env.sandbox.id)
    serve_page(client, env)
    env.reset(WebTask(id="bench", ques="", web=PAGE_URL))
    thread, peer = start_direct_peer(client, env, cid)
    cleanup.add("peer thread", thread.shutdown)
    cleanup.add("direct peer", lambda: thread.submit(peer.close).result())  # runs first

    def peer_step(name: str, args: dict[str, Any]) -> bytes:
        if name:
            peer.perform(parse_action(name, args))
        return peer.observe().screenshot

    ours: dict[str, list[float]] = {row: [] for row, _, _ in STEPS}
    direct: dict[str, list[float]] = {row: [] for row, _, _ in STEPS}
    png_kib: list[float] = []

    def our_step(name: str, args: dict[str, Any]) -> bytes:
        if not name:
            return env.browser.observe().screenshot
        obs = env.step({"name": name, "arguments": args})[0]
        if obs.error:
            raise RuntimeError(f"{name}: {obs.error}")
        return obs.screenshot

    for _ in range(args.rounds):
        for row, name, call_args in STEPS:
            with common.timer(ours[row]):
                png = our_step(name, call_args)
            png_kib.append(len(png) / 1024)
            with common.timer(direct[row]):
                thread.submit(peer_step, name, call_args).result()

    memory = {"cgroup_mib": common.cgroup_mib(cid), "docker_stats_mib": docker_stats_mib(cid)}

    rows = []
    start = {"cold start (create -> first obs)": cold, "reset": resets}
    for label, xs in start.items():
        s = common.summarize(xs)
        rows.append([label, s["p50_ms"], s["p90_ms"], "-", "-", "-"])
        out[label.split(" (")[0].replace(" ", "_")] = s
    out["steps"] = {}
    for row, _, _ in STEPS:
        o, d = common.summarize(ours[row]), common.summarize(direct[row])
        rows.append(
            [
                f"step: {row}",
                o["p50_ms"],
                o["p90_ms"],
                d["p50_ms"],
                d["p90_ms"],
                f"{common.ratio(o['p50_ms'], d['p50_ms']):.2f}x",
            ]
        )
        out["steps"][row] = {"orchard": o, "direct_cdp": d}
    heads = ["measure", "orchard p50 ms", "p90 ms", "direct CDP p50 ms", "p90 ms", "orchard/direct"]
    md = common.table(
        f"Orchard-GUI latency (cold n={len(cold)}, resets n={len(resets)}, steps n={args.rounds})",
        heads,
        rows,
    )
    mem_rows = [
        ["browser sandbox cgroup memory.current", memory["cgroup_mib"]],
        ["browser sandbox docker stats usage", memory["docker_stats_mib"]],
        ["screenshot PNG KiB (median)", statistics.median(png_kib)],
    ]
    md += "\n\n" + common.table("Orchard-GUI memory and sizes", ["measure", "MiB / KiB"], mem_rows)
    out["memory"] = memory
    out["screenshot_png_kib_p50"] = statistics.median(png_kib)
    out["markdown"] = md
    common.write_json("gui_bench", out)
    return 0


if __name__ == "__main__":
    common.run(main)
