"""Exec latency of a trivial command: Orchard (sync SDK, async SDK, raw HTTP) beside its peers.

Peers, in the same run on the same image: `docker exec` (CLI), the Engine API's exec
(docker-py `exec_run`) and SWE-ReX (its server in a container, driven by its own
`RemoteRuntime.execute`). Commands: `true` (argv) and `echo hi` (through /bin/sh).
Sequential calls are interleaved one per peer in a shuffled order, and the concurrent
runs (16 callers) alternate peers in rounds, so the machine's drift hits all alike.

    .venv/bin/python bench/exec_latency.py [--n 500] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import random
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
import docker

from orchard import AsyncOrchard, Orchard

COMMANDS = {"true": (["true"], "true"), "echo hi": (["sh", "-c", "echo hi"], "echo hi")}
Sync = Callable[[str], None]


@dataclass
class Peer:
    name: str
    sync: Sync | None = None  # one call, blocking (thread-safe)
    coro: Callable[[str], Awaitable[None]] | None = None  # one call, on the bench loop
    samples: dict[str, list[float]] = field(default_factory=dict)


class UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("orchard")
        self.unix_path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(self.unix_path)
        self.sock = s


class Bench:
    def __init__(self, cleanup: common.Cleanup, image: str) -> None:
        self.loop = asyncio.new_event_loop()
        cleanup.add("event loop", self.loop.close)
        self.svc = common.ServiceProcess(cleanup)
        self.client = Orchard(self.svc.url)
        cleanup.add("sync client", self.client.close)
        self.sb = self.client.sandboxes.create(image, labels=common.LABELS)
        self.aclient = AsyncOrchard(self.svc.url)
        cleanup.add("async client", lambda: self.loop.run_until_complete(self.aclient.close()))
        self.asb = self.loop.run_until_complete(self.aclient.sandboxes.get(self.sb.id))
        self.local = threading.local()
        self.dclient = docker.from_env(max_pool_size=64)
        cleanup.add("docker client", self.dclient.close)
        self.cid = common.docker_run(image)
        self.container = self.dclient.containers.get(self.cid)
        self.swerex = self._start_swerex(image)
        cleanup.add("swe-rex client", lambda: None)

    # -- SWE-ReX: its server in a container on the default bridge, its own async client
    def _start_swerex(self, image: str) -> Any:
        from swerex.runtime.remote import RemoteRuntime

        token = secrets.token_hex(16)
        cid = common.docker_run(
            image,
            *("python3", "-m", "swerex.server", "--host", "0.0.0.0", "--port", "8000"),
            *("--auth-token", token),
            network="bridge",
        )
        ip = self.dclient.api.inspect_container(cid)["NetworkSettings"]["IPAddress"]
        rt = RemoteRuntime(host=f"http://{ip}", port=8000, auth_token=token, timeout=30)
        deadline = time.monotonic() + 60
        while not self.loop.run_until_complete(rt.is_alive()).is_alive:
            if time.monotonic() > deadline:
                logs = subprocess.run(["docker", "logs", cid], capture_output=True, text=True)
                raise RuntimeError(f"SWE-ReX server did not come up: {logs.stderr[-2000:]}")
            time.sleep(0.2)
        return rt

    # -- one call per peer
    def orchard_sync(self, cmd: str) -> None:
        r = self.sb.exec(COMMANDS[cmd][1] if cmd != "true" else ["true"])
        assert r.exit_code == 0, r

    async def orchard_async(self, cmd: str) -> None:
        r = await self.asb.exec(COMMANDS[cmd][1] if cmd != "true" else ["true"])
        assert r.exit_code == 0, r

    def raw_http(self, cmd: str) -> None:
        body = json.dumps({"cmd": COMMANDS[cmd][0] if cmd == "true" else COMMANDS[cmd][1]})
        for attempt in (0, 1):
            conn = getattr(self.local, "conn", None)
            if conn is None:
                conn = self.local.conn = UnixHTTP(str(self.svc.socket))
            try:
                conn.request(
                    "POST",
                    f"/v1/sandboxes/{self.sb.id}/exec",
                    body,
                    {"Content-Type": "application/json"},
                )
                resp = conn.getresponse()
                data = resp.read()
                break
            except (ConnectionError, http.client.HTTPException):
                # The server closes a keep-alive connection idle for 5 s (between phases).
                conn.close()
                self.local.conn = None
                if attempt:
                    raise
        assert resp.status == 200 and b'"exit_code":0' in data, data

    def docker_cli(self, cmd: str) -> None:
        subprocess.run(
            ["docker", "exec", self.cid, *COMMANDS[cmd][0]], check=True, stdout=subprocess.DEVNULL
        )

    def docker_api(self, cmd: str) -> None:
        r = self.container.exec_run(COMMANDS[cmd][0])
        assert r.exit_code == 0, r

    async def swerex_exec(self, cmd: str) -> None:
        from swerex.runtime.abstract import Command

        argv, line = COMMANDS[cmd]
        c = (
            Command(command=argv, shell=False)
            if cmd == "true"
            else Command(command=line, shell=True)
        )
        r = await self.swerex.execute(c)
        assert r.exit_code == 0, r

    def peers(self) -> list[Peer]:
        return [
            Peer("orchard sync SDK", sync=self.orchard_sync),
            Peer("orchard async SDK", coro=self.orchard_async),
            Peer("orchard raw HTTP", sync=self.raw_http),
            Peer("docker exec (CLI)", sync=self.docker_cli),
            Peer("docker API exec_run", sync=self.docker_api),
            Peer("SWE-ReX execute", coro=self.swerex_exec),
        ]

    def check_outputs(self) -> None:
        assert self.sb.exec("echo hi").stdout == "hi\n"
        assert self.container.exec_run(["sh", "-c", "echo hi"]).output == b"hi\n"
        from swerex.runtime.abstract import Command

        out = self.loop.run_until_complete(
            self.swerex.execute(Command(command="echo hi", shell=True))
        )
        assert out.stdout == "hi\n", out

    # -- timing
    def one(self, peer: Peer, cmd: str) -> float:
        if peer.sync is not None:
            t0 = time.perf_counter()
            peer.sync(cmd)
            return time.perf_counter() - t0
        assert peer.coro is not None
        coro = peer.coro

        async def timed() -> float:
            t0 = time.perf_counter()
            await coro(cmd)
            return time.perf_counter() - t0

        return self.loop.run_until_complete(timed())

    def concurrent(self, peer: Peer, cmd: str, n: int, conc: int) -> tuple[list[float], float]:
        """n calls by `conc` callers; returns per-call latencies and the wall time."""
        per = [n // conc + (1 if i < n % conc else 0) for i in range(conc)]
        out: list[float] = []
        t0 = time.perf_counter()
        if peer.sync is not None:
            fn = peer.sync

            def worker(k: int) -> list[float]:
                xs = []
                for _ in range(k):
                    s = time.perf_counter()
                    fn(cmd)
                    xs.append(time.perf_counter() - s)
                return xs

            with ThreadPoolExecutor(conc) as pool:
                for xs in pool.map(worker, per):
                    out += xs
        else:
            assert peer.coro is not None
            coro = peer.coro

            async def aworker(k: int) -> list[float]:
                xs = []
                for _ in range(k):
                    s = time.perf_counter()
                    await coro(cmd)
                    xs.append(time.perf_counter() - s)
                return xs

            async def all_workers() -> list[list[float]]:
                return await asyncio.gather(*(aworker(k) for k in per))

            for xs in self.loop.run_until_complete(all_workers()):
                out += xs
        return out, time.perf_counter() - t0


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def main(cleanup: common.Cleanup) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--n", type=_positive, default=500, help="calls per peer, command and mode")
    ap.add_argument("--concurrency", type=_positive, default=16, help="callers at once (>= 1)")
    ap.add_argument(
        "--rounds", type=_positive, default=5, help="alternations in the concurrent runs"
    )
    args = ap.parse_args()
    image = common.bench_image()
    b = Bench(cleanup, image)
    b.check_outputs()
    peers = b.peers()
    warm = 20
    results: dict[str, Any] = {"image": image, "n": args.n, "concurrency": args.concurrency}
    md: list[str] = []
    for cmd in COMMANDS:
        for p in peers:
            for _ in range(warm):
                b.one(p, cmd)
        seq: dict[str, list[float]] = {p.name: [] for p in peers}
        t0 = time.perf_counter()
        for _ in range(args.n):
            order = peers[:]
            random.shuffle(order)
            for p in order:
                seq[p.name].append(b.one(p, cmd))
        print(f"[{cmd}] sequential: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        conc: dict[str, list[float]] = {p.name: [] for p in peers}
        wall: dict[str, float] = {p.name: 0.0 for p in peers}
        per_round = max(args.concurrency, args.n // args.rounds)
        t0 = time.perf_counter()
        for _ in range(args.rounds):
            for p in peers:
                xs, w = b.concurrent(p, cmd, per_round, args.concurrency)
                conc[p.name] += xs
                wall[p.name] += w
        print(f"[{cmd}] concurrent: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        for mode, data in (("sequential", seq), (f"concurrency {args.concurrency}", conc)):
            rows = []
            base = common.summarize(data[peers[0].name])
            for p in peers:
                s = common.summarize(data[p.name])
                if mode != "sequential":
                    s["per_s"] = len(data[p.name]) / wall[p.name]
                s["ratio_p50"] = common.ratio(s["p50_ms"], base["p50_ms"])
                rows.append((p.name, s))
                results.setdefault(cmd, {}).setdefault(mode, {})[p.name] = {
                    **s,
                    "samples_ms": [round(x * 1000, 4) for x in data[p.name]],
                }
            heads = ["peer", "p50 ms", "p90 ms", "p99 ms", "mean ms", "p50 / orchard sync"]
            cells = [
                [
                    name,
                    s["p50_ms"],
                    s["p90_ms"],
                    s["p99_ms"],
                    s["mean_ms"],
                    f"{s['ratio_p50']:.2f}x",
                ]
                for name, s in rows
            ]
            if mode != "sequential":
                heads.append("calls/s")
                for c, (_, s) in zip(cells, rows, strict=False):
                    c.append(s["per_s"])
            md.append(f"**`{cmd}`, {mode}** (n={len(data[peers[0].name])})\n\n")
            md[-1] += common.table(f"exec `{cmd}` — {mode}", heads, cells)
    results["markdown"] = "\n\n".join(md)
    common.write_json("exec_latency", results)
    return 0


if __name__ == "__main__":
    common.run(main)
