"""Training benchmarks: BAR versus fixed-N GRPO on a simulated task pool, and rollout throughput.

1. Simulated pool (no model, no sandbox): tasks with known success rates, drawn like a
   SWE training set (most tasks hard, some easy). For each sampling rule we fill batches
   of groups and report the share of groups with a non-zero advantage, the rollouts
   spent per useful group (one that passes the group filter), and the positive ratio of
   the groups that are trained on.
2. Rollout throughput (real): episodes per minute of the SWE harness on the sample suite
   in Orchard sandboxes, token capture and grading included. The policy replays the
   oracle's recorded replies (a scripted generator), so the figure measures the
   environment side: sandbox start, commands, grading.

    python bench/bar_bench.py [--groups 2000] [--skip-throughput] [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from orchard.train.bar import BARConfig, Episode, fill_batch

# ---------------------------------------------------------------- simulated pool


def task_pool(n: int, seed: int) -> list[float]:
    """Success rates: 55% of tasks near-unsolvable, 15% near-certain, the rest spread out."""
    rng = random.Random(seed)
    rates = []
    for _ in range(n):
        u = rng.random()
        if u < 0.55:
            rates.append(rng.uniform(0.0, 0.05))
        elif u < 0.70:
            rates.append(rng.uniform(0.9, 1.0))
        else:
            rates.append(rng.betavariate(2, 2))
    return rates


def simulate(
    rule: str, cfg: BARConfig, rates: Sequence[float], groups: int, seed: int
) -> dict[str, Any]:
    rng = random.Random(seed)

    def draw() -> Callable[[int], list[Episode[None]]]:
        p = rng.choice(rates)

        def generate(k: int) -> list[Episode[None]]:
            return [
                Episode(1.0 if rng.random() < p else -1.0, rng.randint(200, 8000)) for _ in range(k)
            ]

        return generate

    # all groups drawn, before the filter: what fixed-N GRPO would train on
    batch = fill_batch(draw, cfg, groups, max_tasks=groups * 50)
    drawn = batch.tasks_drawn
    useful = len(batch.groups)
    pos_ratio = statistics.fmean(
        sum(e.positive for e in g.group) / cfg.group_size for g in batch.groups
    )
    return {
        "rule": rule,
        "N": cfg.group_size,
        "M": cfg.max_samples,
        "S": cfg.stride,
        "tasks_drawn": drawn,
        "nonzero_adv_share": round(useful / drawn, 4),
        "rollouts_per_useful_group": round(batch.episodes / max(1, useful), 2),
        "positive_ratio_trained": round(pos_ratio, 4),
        "dropped": batch.dropped,
    }


def simulated(groups: int, seed: int) -> list[dict[str, Any]]:
    rates = task_pool(5000, seed)
    rules = [
        ("fixed N=4", BARConfig(4, 4, 4, (0.0, 1.0))),
        ("fixed N=8", BARConfig(8, 8, 8, (0.0, 1.0))),
        ("BAR N=4 M=8 S=8", BARConfig(4, 8, 8)),
        ("BAR N=4 M=8 S=4", BARConfig(4, 8, 4)),
    ]
    return [simulate(name, cfg, rates, groups, seed + 1) for name, cfg in rules]


# ---------------------------------------------------------------- rollout throughput


class ReplayGenerator:
    """Plays back the oracle's recorded replies as token ids (scripted, log-probs 0)."""

    def __init__(self, tokenizer: Any, replies: Sequence[str]) -> None:
        self.tokenizer, self.replies, self.turn = tokenizer, list(replies), 0

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int) -> Any:
        from orchard.train.rollout import Generation

        text = self.replies[min(self.turn, len(self.replies) - 1)]
        self.turn += 1
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.tokenizer.eos_token_id]
        return Generation(ids, [0.0] * len(ids), "stop")


def throughput(concurrency: Sequence[int]) -> list[dict[str, Any]]:
    from orchard import Orchard
    from orchard.swe.harness import load_config
    from orchard.swe.images import build_images
    from orchard.swe.rollout import SweRolloutRunner
    from orchard.swe.tasks import SAMPLE_DIR, sample_tasks
    from orchard.train.tiny import build_tokenizer
    from orchard.train.tokenize import load_trajectories

    tasks = sample_tasks()
    build_images(tasks)
    tok = build_tokenizer()
    agent_config, _ = load_config()
    replies = {
        t.instance_id: [
            m["content"]
            for m in load_trajectories([SAMPLE_DIR / "trajectories" / f"{t.instance_id}.json"])[
                0
            ].messages
            if m["role"] == "assistant"
        ]
        for t in tasks
    }
    rows = []
    with Orchard() as client:
        for workers in concurrency:
            jobs = [t for t in tasks for _ in range(max(1, workers // len(tasks) + 1))][
                : max(6, workers * 2)
            ]

            def one(task: Any) -> Any:
                runner = SweRolloutRunner(
                    client, tok, ReplayGenerator(tok, replies[task.instance_id]), agent_config
                )
                return runner.run(task)

            start = time.monotonic()
            with ThreadPoolExecutor(workers) as pool:
                episodes = list(pool.map(one, jobs))
            wall = time.monotonic() - start
            resolved = sum(1 for e in episodes if e.payload and e.payload.resolved)
            tokens = sum(len(e.payload.record.completion_ids) for e in episodes if e.payload)
            rows.append(
                {
                    "concurrency": workers,
                    "episodes": len(episodes),
                    "resolved": resolved,
                    "wall_s": round(wall, 2),
                    "episodes_per_min": round(60 * len(episodes) / wall, 1),
                    "mean_episode_s": round(
                        statistics.fmean(e.payload.duration_s for e in episodes if e.payload), 2
                    ),
                    "tokens_captured": tokens,
                }
            )
    return rows


# ---------------------------------------------------------------- main


def markdown(sim: list[dict[str, Any]], thr: list[dict[str, Any]]) -> str:
    head = "| rule | groups with non-zero advantage | rollouts per useful group | positive ratio |"
    lines = [head, "|---|---:|---:|---:|"]
    for r in sim:
        lines.append(
            f"| {r['rule']} | {r['nonzero_adv_share']:.1%} | {r['rollouts_per_useful_group']:.2f} "
            f"| {r['positive_ratio_trained']:.2f} |"
        )
    if thr:
        lines += [
            "",
            "| concurrency | episodes | resolved | wall s | episodes / min | mean episode s |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        for r in thr:
            lines.append(
                f"| {r['concurrency']} | {r['episodes']} | {r['resolved']} | {r['wall_s']} "
                f"| {r['episodes_per_min']} | {r['mean_episode_s']} |"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--groups", type=int, default=2000, help="useful groups to collect per rule")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--concurrency", type=int, nargs="*", default=[1, 4])
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    args = ap.parse_args()
    sim = simulated(args.groups, args.seed)
    thr = [] if args.skip_throughput else throughput(args.concurrency)
    table = markdown(sim, thr)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "bar_bench.json"
    path.write_text(json.dumps({"simulated": sim, "throughput": thr}, indent=2))
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
