"""File transfer: Orchard's SDK beside `docker cp`, both ways, on the same image.

Payloads: 1 MB and 100 MB of random bytes (one file), and a folder of 10,000 small files
(a tar stream both ways: `upload_dir` / `download_dir`; `docker cp` also moves a tar).
Each transfer is repeated and the median reported; peers alternate on every repetition.
For Orchard it also reports the CPU time of the two Python hops (the SDK's process and
the service's), which the 2-core machine's other load disturbs far less than wall time.

    .venv/bin/python bench/files.py [--reps 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

from orchard import Orchard


def make_payloads(tmp: Path) -> dict[str, Path]:
    one, hundred, folder = tmp / "1mb.bin", tmp / "100mb.bin", tmp / "small"
    one.write_bytes(os.urandom(1_000_000))
    with hundred.open("wb") as f:
        for _ in range(100):
            f.write(os.urandom(1_000_000))
    for i in range(10_000):
        d = folder / f"d{i // 100:03d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i:05d}.txt").write_bytes(os.urandom(64).hex().encode())
    return {"1 MB file": one, "100 MB file": hundred, "10,000 small files": folder}


def cpu_s(pid: int | None = None) -> float:
    """CPU seconds (user + system) of this process, or of `pid` from /proc."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def count_files(path: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(path))


def main(cleanup: common.Cleanup) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    image = common.bench_image()
    tmp = Path(tempfile.mkdtemp(prefix="orchard-files-"))
    cleanup.add("payloads", lambda: shutil.rmtree(tmp, ignore_errors=True))
    payloads = make_payloads(tmp)
    svc = common.ServiceProcess(cleanup)
    client = Orchard(svc.url)
    cleanup.add("client", client.close)
    sb = client.sandboxes.create(image, labels=common.LABELS)
    cid = common.docker_run(image)

    def fresh(name: str) -> Path:
        p = tmp / "out" / name
        shutil.rmtree(p, ignore_errors=True)
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def orchard_up(name: str, src: Path) -> None:
        if src.is_dir():
            sb.files.upload_dir(src, f"/tmp/o-{name}")
        else:
            with src.open("rb") as f:
                sb.files.write(f"/tmp/o-{name}", f)

    def orchard_down(name: str, src: Path) -> None:
        dst = fresh(f"o-{name}")
        if src.is_dir():
            sb.files.download_dir(f"/tmp/o-{name}", dst)
            assert count_files(dst) == 10_000
        else:
            data = sb.files.read(f"/tmp/o-{name}")
            assert len(data) == src.stat().st_size
            dst.write_bytes(data)

    def cp_up(name: str, src: Path) -> None:
        subprocess.run(
            ["docker", "cp", str(src), f"{cid}:/tmp/d-{name}"], check=True, capture_output=True
        )

    def cp_down(name: str, src: Path) -> None:
        dst = fresh(f"d-{name}")
        subprocess.run(
            ["docker", "cp", f"{cid}:/tmp/d-{name}", str(dst)], check=True, capture_output=True
        )
        if src.is_dir():
            assert count_files(dst) == 10_000
        else:
            assert dst.stat().st_size == src.stat().st_size

    peers: dict[str, tuple[Callable[[str, Path], None], Callable[[str, Path], None]]] = {
        "orchard SDK": (orchard_up, orchard_down),
        "docker cp": (cp_up, cp_down),
    }
    out: dict[str, Any] = {"image": image, "reps": args.reps}
    rows = []
    for label, src in payloads.items():
        key = label.split()[0].replace(",", "")
        times: dict[tuple[str, str], list[float]] = {}
        cpu: dict[tuple[str, str], list[float]] = {}
        for rep in range(args.reps):
            for peer, (up, down) in peers.items():
                for way, fn in (("upload", up), ("download", down)):
                    c0, s0 = cpu_s(), cpu_s(svc.proc.pid)
                    t0 = time.perf_counter()
                    fn(f"{key}-{rep}", src)
                    times.setdefault((peer, way), []).append(time.perf_counter() - t0)
                    if peer == "orchard SDK":
                        cpu.setdefault(("sdk", way), []).append(cpu_s() - c0)
                        cpu.setdefault(("service", way), []).append(cpu_s(svc.proc.pid) - s0)
        for way in ("upload", "download"):
            o = statistics.median(times[("orchard SDK", way)]) * 1000
            d = statistics.median(times[("docker cp", way)]) * 1000
            sdk_cpu = statistics.median(cpu[("sdk", way)]) * 1000
            svc_cpu = statistics.median(cpu[("service", way)]) * 1000
            rows.append([f"{label} {way}", o, d, f"{d / o:.2f}x", sdk_cpu, svc_cpu])
            out.setdefault(label, {})[way] = {
                "orchard_ms": o,
                "docker_cp_ms": d,
                "sdk_cpu_ms": sdk_cpu,
                "service_cpu_ms": svc_cpu,
            }
        # Keep the sandbox's disk small between payloads.
        sb.exec("rm -rf /tmp/o-*")
        subprocess.run(["docker", "exec", cid, "sh", "-c", "rm -rf /tmp/d-*"], check=True)
    out["markdown"] = common.table(
        f"file transfer (median of {args.reps})",
        [
            "transfer",
            "orchard ms",
            "docker cp ms",
            "docker cp / orchard",
            "SDK CPU ms",
            "service CPU ms",
        ],
        rows,
    )
    common.write_json("files", out)
    return 0


if __name__ == "__main__":
    common.run(main)
