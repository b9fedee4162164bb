"""Run the six benchmarks (`make bench`), then write the plot and a Markdown summary.

Each benchmark runs as its own process, so each cleans up after itself even if another
failed; a Ctrl-C here reaches the running one (same process group) and it unwinds.

    .venv/bin/python bench/run_all.py                 # full run (about 15 minutes here)
    .venv/bin/python bench/run_all.py --quick         # small samples, a couple of minutes
    .venv/bin/python bench/run_all.py --n 200 --only stress,exec
Results: bench/results/*.json, bench/results/summary.md, bench/results/latency.png.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

BENCH = Path(__file__).resolve().parent
ALL = ("footprint", "exec", "create", "files", "stress", "gui", "state", "memory")
FILES = {
    "footprint": "footprint",
    "exec": "exec_latency",
    "create": "create_latency",
    "files": "files",
    "stress": "stress",
    "gui": "gui_bench",
    "state": "state",
    "memory": "memory",
}


def plot(dest: Path) -> bool:
    """Latency distributions side by side: exec `true` (sequential, 16 callers) and create."""
    ex, cr = common.RESULTS / "exec_latency.json", common.RESULTS / "create_latency.json"
    if not ex.exists():
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(ex.read_text())["true"]
    panels = [(f"exec `true`, {mode}", data[mode]) for mode in data]
    if cr.exists():
        c = json.loads(cr.read_text())
        for mode in ("sequential", *(k for k in c if k.startswith("concurrency"))):
            if mode in c:
                panels.append(
                    (
                        f"create -> ready, {mode}",
                        {k: {"samples_ms": v["ready_samples_ms"]} for k, v in c[mode].items()},
                    )
                )
                break
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 5))
    for ax, (title, peers) in zip(axes if len(panels) > 1 else [axes], panels, strict=False):
        names = list(peers)
        ax.boxplot(
            [peers[n]["samples_ms"] for n in names],
            orientation="horizontal",
            whis=(1, 99),
            showfliers=False,
        )
        ax.set_yticks(range(1, len(names) + 1), names)
        ax.set_xscale("log")
        ax.set_xlabel("ms (log); box = p25-p75, line = p50, whiskers = p1-p99")
        ax.set_title(title)
        ax.grid(axis="x", which="both", alpha=0.3)
    fig.tight_layout()
    dest.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(dest, dpi=110)
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small samples (a smoke run)")
    ap.add_argument("--n", type=int, help="sandboxes in the stress test (default 1000)")
    ap.add_argument("--only", default=",".join(ALL), help=f"comma list of {','.join(ALL)}")
    ap.add_argument("--plot", type=Path, default=common.RESULTS / "latency.png")
    args = ap.parse_args()
    quick = {
        "footprint": ["--n", "10"],
        "exec": ["--n", "100", "--rounds", "2"],
        "create": ["--n", "5", "--concurrent-n", "32", "--rounds", "1"],
        "files": ["--reps", "1"],
        "stress": ["--n", "100", "--floor-n", "50"],
        "gui": ["--quick"],
        "state": ["--quick"],
        "memory": ["--quick"],
    }
    py = sys.executable
    failed = []
    t0 = time.time()
    for name in [x.strip() for x in args.only.split(",") if x.strip()]:
        if name not in ALL:
            raise SystemExit(f"unknown benchmark {name!r}; choose from {ALL}")
        extra = list(quick[name]) if args.quick else []
        if name == "stress" and args.n:
            extra += ["--n", str(args.n)]
        print(f"\n=== {name} {' '.join(extra)}", flush=True)
        rc = subprocess.run([py, str(BENCH / f"{FILES[name]}.py"), *extra]).returncode
        if rc != 0:
            failed.append(f"{name} (exit {rc})")
            if rc in (130, 143):
                break
    lines = [f"# Orchard benchmarks ({time.strftime('%Y-%m-%d %H:%M')})", ""]
    lines.append("Machine: " + json.dumps(common.machine()))
    for name in ALL:
        path = common.RESULTS / f"{FILES[name]}.json"
        if path.exists():
            lines += ["", f"## {name}", "", json.loads(path.read_text()).get("markdown", "")]
    if plot(args.plot):
        lines += ["", f"![latency]({args.plot.name})"]
    (common.RESULTS / "summary.md").write_text("\n".join(lines) + "\n")
    print(f"\nall done in {time.time() - t0:.0f} s; summary: {common.RESULTS / 'summary.md'}")
    if failed:
        print("FAILED: " + ", ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
