"""Shared helpers for the benchmarks: stats, tables, JSON, the service process, images, cleanup.

Every benchmark runs `main()` under `run()`, which turns SIGTERM into SystemExit so the
`finally` blocks (and the Cleanup stack) run on Ctrl-C and on `kill` alike. Everything a
benchmark creates carries its run id: plain containers the label `orchard.bench=<id>`,
sandboxes the service's own temp state folder (`orchard.state_dir` label), and both are
removed on the way out even if a step in between failed.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
PY = sys.executable
RUN_ID = uuid.uuid4().hex[:10]
BENCH_LABEL = "orchard.bench"
# Sandbox labels (the orchard.* keys are the service's own); containers get BENCH_LABEL.
LABELS = {"bench": RUN_ID}
# The Debian image the tests use; the bench image adds SWE-ReX to it under /opt/swerex.
BASE_PACKAGES = ("python3", "git", "python3-pytest", "ca-certificates")
SWEREX_SITE = "/opt/swerex"


# ---------------------------------------------------------------- stats and output


def pct(xs: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1) of an unsorted sample."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * len(s) + 0.5) - 1))]


def summarize(seconds: Sequence[float]) -> dict[str, float]:
    ms = [x * 1000 for x in seconds]
    if not ms:
        return {"n": 0, "p50_ms": float("nan"), "p90_ms": float("nan"), "p99_ms": float("nan")}
    return {
        "n": len(ms),
        "p50_ms": pct(ms, 0.5),
        "p90_ms": pct(ms, 0.9),
        "p99_ms": pct(ms, 0.99),
        "mean_ms": statistics.fmean(ms),
    }


def fmt(v: Any) -> str:
    if isinstance(v, float):
        if v != v:
            return "-"
        return f"{v:.2f}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


def table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Print an aligned text table; return the same table as Markdown (for the docs)."""
    cells = [[fmt(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    print(f"\n{title}")
    for line in [list(headers), *cells]:
        print(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(line, widths, strict=True))
            )
        )
    md = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join(["---"] + ["---:"] * (len(headers) - 1)) + "|",
    ]
    md += ["| " + " | ".join(r) + " |" for r in cells]
    return "\n".join(md)


def write_json(name: str, data: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    data = {
        "run_id": RUN_ID,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(),
        **data,
    }
    path.write_text(json.dumps(data, indent=2))
    print(f"\nwrote {path}")
    return path


def machine() -> dict[str, Any]:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    docker_v = subprocess.run(
        ["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True
    ).stdout.strip()
    return {
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "mem_gib": round(_meminfo()["MemTotal"] / 2**20, 1),
        "kernel": platform.release(),
        "docker": docker_v,
        "python": platform.python_version(),
    }


# ---------------------------------------------------------------- memory


def _meminfo() -> dict[str, int]:
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        k, _, v = line.partition(":")
        out[k] = int(v.split()[0])  # KiB
    return out


def host_used_mib() -> float:
    m = _meminfo()
    return (m["MemTotal"] - m["MemAvailable"]) / 1024


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def rss_of(name: str) -> tuple[int, float]:
    """(count, total RSS MiB) of host processes whose comm is `name`."""
    n, total = 0, 0.0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if (d / "comm").read_text().strip() == name:
                n += 1
                total += rss_mib(int(d.name))
    return n, total


def container_ids(label: str) -> list[str]:
    return subprocess.run(
        ["docker", "ps", "-q", "--no-trunc", "--filter", f"label={label}"],
        capture_output=True,
        text=True,
    ).stdout.split()


def cgroup_mib(cid: str) -> float:
    """Memory charged to a container's cgroup (its processes, page cache, kernel objects)."""
    for path in (
        f"/sys/fs/cgroup/memory/docker/{cid}/memory.usage_in_bytes",  # v1, cgroupfs
        f"/sys/fs/cgroup/memory/system.slice/docker-{cid}.scope/memory.usage_in_bytes",
        f"/sys/fs/cgroup/docker/{cid}/memory.current",  # v2
        f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/memory.current",
    ):
        with contextlib.suppress(OSError):
            return int(Path(path).read_text()) / 2**20
    return float("nan")


def mean_cgroup_mib(label: str) -> tuple[int, float]:
    """(containers, mean cgroup MiB) over the running containers carrying `label`."""
    xs = [cgroup_mib(c) for c in container_ids(label)]
    xs = [x for x in xs if x == x]
    return len(xs), (sum(xs) / len(xs) if xs else float("nan"))


class PeakMemory:
    """Samples the host's used memory in a thread; `.peak_mib` is the highest seen."""

    def __init__(self, interval_s: float = 0.2) -> None:
        self.interval_s = interval_s
        self.peak_mib = host_used_mib()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak_mib = max(self.peak_mib, host_used_mib())

    def __enter__(self) -> PeakMemory:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()


# ---------------------------------------------------------------- cleanup


class Cleanup:
    """LIFO stack of undo actions; each runs even if an earlier one raised."""

    def __init__(self) -> None:
        self._actions: list[tuple[str, Callable[[], Any]]] = []

    def add(self, what: str, fn: Callable[[], Any]) -> None:
        self._actions.append((what, fn))

    def run(self) -> None:
        while self._actions:
            what, fn = self._actions.pop()
            try:
                fn()
            except Exception as e:  # keep going: the rest must still be undone
                print(f"cleanup: {what} failed: {e}", file=sys.stderr)


def remove_containers(label: str) -> int:
    ids = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label={label}"], capture_output=True, text=True
    ).stdout.split()
    for i in range(0, len(ids), 100):
        subprocess.run(["docker", "rm", "-f", *ids[i : i + 100]], capture_output=True)
    return len(ids)


def run(main: Callable[[Cleanup], int]) -> None:
    """Run a benchmark: SIGTERM/SIGINT unwind through `finally`; bench containers always go."""

    def _term(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _term)
    cleanup = Cleanup()
    cleanup.add("bench containers", lambda: remove_containers(f"{BENCH_LABEL}={RUN_ID}"))
    rc = 1
    try:
        rc = main(cleanup)
    except KeyboardInterrupt:
        print("\ninterrupted; cleaning up", file=sys.stderr)
        rc = 130
    finally:
        # A second Ctrl-C during cleanup must not leave containers behind.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        cleanup.run()
    raise SystemExit(rc)


# ---------------------------------------------------------------- images and containers


def agent_binary() -> Path:
    path = Path(os.environ.get("ORCHARD_AGENT_BINARY", ROOT / "build" / "orchard-agent"))
    if not path.is_file():
        raise SystemExit(f"agent binary {path} missing: run `make agent`")
    return path


def bench_image() -> str:
    """The Debian test image plus SWE-ReX (pip-installed offline from downloaded wheels).

    Every peer runs on this one image, so image size and libc never differ between them.
    """
    from orchard.env import images

    base = images.debian_python_image(BASE_PACKAGES)
    import swerex  # the client's version is the server's: same wheels

    version = getattr(swerex, "__version__", "")
    tag = f"orchard-bench/swerex:{base.split(':')[1][-8:]}-{version or 'x'}"
    if images.image_exists(tag):
        return tag
    print(f"building {tag} (SWE-ReX {version} into {base})", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="orchard-swerex-") as d:
        wheels, site = Path(d) / "wheels", Path(d) / "site"
        # Wheels for the image's CPython (3.11, x86_64 glibc): downloaded on the host, which
        # may reach the package index; the image itself never does.
        pip = [PY, "-m", "pip", "--disable-pip-version-check", "-q"]
        subprocess.run(
            [
                *pip,
                "download",
                f"swe-rex=={version}",
                "-d",
                str(wheels),
                "--only-binary=:all:",
                "--python-version",
                "3.11",
                "--platform",
                "manylinux2014_x86_64",
                "--platform",
                "manylinux_2_28_x86_64",
            ],
            check=True,
            capture_output=True,
        )
        subprocess.run(
            [
                *pip,
                "install",
                "--no-index",
                "--find-links",
                str(wheels),
                "--target",
                str(site),
                "--python-version",
                "3.11",
                "--only-binary=:all:",
                f"swe-rex=={version}",
            ],
            check=True,
            capture_output=True,
        )
        name = f"orchard-bench-build-{RUN_ID}"
        subprocess.run(
            [
                "docker",
                "run",
                "--name",
                name,
                "--label",
                f"{BENCH_LABEL}={RUN_ID}",
                "-v",
                f"{site}:/mnt/site:ro",
                base,
                "cp",
                "-a",
                "/mnt/site",
                SWEREX_SITE,
            ],
            check=True,
            capture_output=True,
        )
        try:
            subprocess.run(
                [
                    "docker",
                    "commit",
                    "-c",
                    f"ENV PYTHONPATH={SWEREX_SITE}",
                    "-c",
                    'CMD ["python3"]',
                    name,
                    tag,
                ],
                check=True,
                capture_output=True,
            )
        finally:
            subprocess.run(["docker", "rm", "-f", name], capture_output=True)
    return tag


def docker_run(image: str, *args: str, network: str = "none") -> str:
    """Start a plain labelled container (`sleep infinity` unless args say otherwise)."""
    cmd = ["docker", "run", "-d", "--label", f"{BENCH_LABEL}={RUN_ID}", "--network", network]
    out = subprocess.run(
        [*cmd, image, *(args or ("sleep", "infinity"))], capture_output=True, text=True
    )
    if out.returncode != 0:
        raise RuntimeError(f"docker run failed: {out.stderr.strip()}")
    return out.stdout.strip()


# ---------------------------------------------------------------- the service


class ServiceProcess:
    """`orchard serve` on a Unix socket in its own process, with its own temp state folder.

    Its own process so its resident memory can be read alone; its own state folder so the
    sandboxes of this run can be found (label `orchard.state_dir`) and removed afterwards.
    """

    def __init__(self, cleanup: Cleanup) -> None:
        self.dir = Path(
            tempfile.mkdtemp(prefix="ob-")
        ).resolve()  # short: socket paths must stay < 108
        self.socket = self.dir / "orchard.sock"
        self.url = f"unix://{self.socket}"
        env = {
            **os.environ,
            "ORCHARD_STATE_DIR": str(self.dir / "state"),
            "ORCHARD_AGENT_BINARY": str(agent_binary()),
        }
        env.pop("ORCHARD_API_KEYS", None)
        cleanup.add("service state", lambda: shutil.rmtree(self.dir, ignore_errors=True))
        cleanup.add("sandboxes", self._remove_sandboxes)
        # ORCHARD_BENCH_PROFILE=FILE: the service runs under cProfile and dumps its stats
        # there when it stops (bench/profiled_serve.py), for `python -m pstats FILE`.
        profile = os.environ.get("ORCHARD_BENCH_PROFILE")
        entry = [str(ROOT / "bench" / "profiled_serve.py"), profile] if profile else []
        cli = [
            PY,
            *(entry or ["-m", "orchard.cli"]),
            "serve",
            "--uds",
            str(self.socket),
            "--log-level",
            "warning",
        ]
        self.proc = subprocess.Popen(cli, env=env)
        cleanup.add("service", self.stop)
        deadline = time.monotonic() + 60
        while not self._answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"orchard serve did not start (exit {self.proc.poll()})")
            time.sleep(0.05)

    def _answers(self) -> bool:
        if not self.socket.exists():
            return False
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as s:
            s.connect(str(self.socket))
            return True
        return False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def _remove_sandboxes(self) -> None:
        n = remove_containers(f"orchard.state_dir={self.dir / 'state'}")
        if n:
            print(f"cleanup: removed {n} sandbox containers", file=sys.stderr)


@contextlib.contextmanager
def timer(out: list[float]) -> Iterator[None]:
    t0 = time.perf_counter()
    yield
    out.append(time.perf_counter() - t0)


def ratio(peer: float, ours: float) -> float:
    return peer / ours if ours else float("nan")


@contextlib.contextmanager
def perf_window(name: str) -> Iterator[None]:
    """With ORCHARD_BENCH_PERF=DIR, the whole host's CPU profile of this block only
    (`perf record -a -g` into DIR/NAME.data; read it with `perf report -i`), so a
    benchmark's set-up (image builds, the service's start) stays out of it."""
    folder = os.environ.get("ORCHARD_BENCH_PERF")
    if not folder or shutil.which("perf") is None:
        yield
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    out = Path(folder) / f"{name}.data"
    for i in range(2, 100):  # a later block of the same name (the next backend's) keeps both
        if not out.exists():
            break
        out = Path(folder) / f"{name}-{i}.data"
    proc = subprocess.Popen(
        ["perf", "record", "-a", "-g", "-F", "499", "-o", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(0.5)  # perf has opened its events
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
        print(f"perf: {out}", file=sys.stderr)
