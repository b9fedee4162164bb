"""pass@k, pass^k, mean score and per-category tables over trials of graded tasks.

With n trials of a task of which c passed, the unbiased estimators are

    pass@k = 1 - C(n-c, k) / C(n, k)   the chance that at least one of k trials passes
    pass^k = C(c, k) / C(n, k)         the chance that k trials (drawn without replacement)
                                       all pass

both averaged over tasks. When n == k they reduce to "any of the k trials passed" and "all
k trials passed", which is how Claw-Eval reports them; running n > k trials only lowers
the variance of the estimate.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from math import comb
from typing import Any


def _check(n: int, c: int, k: int) -> None:
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")


def pass_at_k(n: int, c: int, k: int) -> float:
    """The probability that at least one of k trials out of n (c passing) passes."""
    _check(n, c, k)
    return 1.0 - comb(n - c, k) / comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """pass^k: the probability that all k trials drawn from n (c passing) pass."""
    _check(n, c, k)
    return comb(c, k) / comb(n, k)


@dataclass
class TaskTally:
    """The trials of one task: how many ran, how many passed, their scores."""

    task_id: str
    category: str
    passes: list[bool]
    scores: list[float]

    @property
    def n(self) -> int:
        return len(self.passes)

    @property
    def c(self) -> int:
        return sum(self.passes)


def tally(results: Iterable[Mapping[str, Any]]) -> list[TaskTally]:
    """Group trial records (`task_id`, `category`, `passed`, `score`) by task."""
    by_task: dict[str, TaskTally] = {}
    for r in results:
        t = by_task.setdefault(r["task_id"], TaskTally(r["task_id"], r["category"], [], []))
        t.passes.append(bool(r["passed"]))
        t.scores.append(float(r["score"]))
    return sorted(by_task.values(), key=lambda t: t.task_id)


def _aggregate(tasks: list[TaskTally], k: int) -> dict[str, Any]:
    """Means over tasks; a task with fewer than k trials has no pass@k and is left out."""
    full = [t for t in tasks if t.n >= k]
    scores = [s for t in tasks for s in t.scores]
    return {
        "tasks": len(tasks),
        "trials": sum(t.n for t in tasks),
        "passed": sum(t.c for t in tasks),
        "pass_at_k": _mean(pass_at_k(t.n, t.c, k) for t in full),
        "pass_hat_k": _mean(pass_hat_k(t.n, t.c, k) for t in full),
        "pass_rate": _mean(t.c / t.n for t in tasks),
        "mean_score": _mean(scores),
        "incomplete_tasks": len(tasks) - len(full),
    }


def _mean(values: Iterable[float]) -> float | None:
    vals = list(values)
    return round(sum(vals) / len(vals), 6) if vals else None


def summarize(results: Iterable[Mapping[str, Any]], k: int) -> dict[str, Any]:
    """Overall and per-category pass@k, pass^k, pass rate and mean score."""
    tasks = tally(results)
    cats: dict[str, list[TaskTally]] = defaultdict(list)
    for t in tasks:
        cats[t.category].append(t)
    return {
        "k": k,
        **_aggregate(tasks, k),
        "categories": {c: _aggregate(ts, k) for c, ts in sorted(cats.items())},
    }


def table_rows(summary: Mapping[str, Any]) -> list[list[str]]:
    """One row per category and a total row, formatted for a rich table or plain text."""

    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    def row(name: str, s: Mapping[str, Any]) -> list[str]:
        return [
            name,
            str(s["tasks"]),
            str(s["trials"]),
            fmt(s["pass_at_k"]),
            fmt(s["pass_hat_k"]),
            fmt(s["mean_score"]),
        ]

    rows = [row(c, s) for c, s in summary["categories"].items()]
    return [*rows, row("all", summary)]


def table_header(k: int) -> list[str]:
    return ["category", "tasks", "trials", f"pass@{k}", f"pass^{k}", "mean score"]
