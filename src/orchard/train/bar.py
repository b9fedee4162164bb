"""Balanced Adaptive Rollout (BAR), the GRPO group filter and group-normalised advantages.

Pure functions over plain data, so every branch can be tested without a model.

BAR, per task: generate samples in strides until a group of `group_size` (N) with a
positive ratio inside the band can be formed, at most `max_samples` (M) in all. After
each stride the samples are split into positive (reward > 0), negative, and backfill
(aborted, no reward, or cut by the time limit); each list is sorted completed-first,
then shortest-first. With band [lo, hi], ideal = round((lo + hi) / 2 * N), and the
positive counts ceil(lo*N)..floor(hi*N) are tried in order of closeness to the ideal
(ties: fewer positives first); the first count both lists can supply is the group.
When the budget is spent without one, the band is relaxed to [0, 1]; failing that,
the group is the first N of positives + negatives + backfill, in that order.
"""

from __future__ import annotations

import asyncio
import math
import statistics
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Generic, Literal, TypeVar

P = TypeVar("P")


class Outcome(StrEnum):
    """How an episode ended."""

    SUBMITTED = "submitted"  # the agent submitted: a completed episode
    LIMIT = "limit"  # step/token/cost limit; still graded
    TIME_LIMIT = "time_limit"  # wall-clock limit: backfill
    ABORTED = "aborted"  # infrastructure or harness failure: backfill


@dataclass(frozen=True)
class Episode(Generic[P]):
    """One sampled rollout as BAR sees it; `payload` carries the tokens for training."""

    reward: float | None
    length: int  # tokens (or turns): shorter is preferred
    outcome: Outcome = Outcome.SUBMITTED
    payload: P | None = None

    @property
    def completed(self) -> bool:
        return self.outcome is Outcome.SUBMITTED

    @property
    def backfill(self) -> bool:
        return self.reward is None or self.outcome in (Outcome.ABORTED, Outcome.TIME_LIMIT)

    @property
    def positive(self) -> bool:
        return not self.backfill and self.reward is not None and self.reward > 0


@dataclass(frozen=True)
class BARConfig:
    group_size: int = 4  # N
    max_samples: int = 8  # M
    stride: int = 8  # S, generated concurrently
    band: tuple[float, float] = (0.25, 0.75)

    def __post_init__(self) -> None:
        lo, hi = self.band
        if not (0.0 <= lo <= hi <= 1.0):
            raise ValueError(f"band must satisfy 0 <= lo <= hi <= 1, got {self.band}")
        if not (1 <= self.group_size <= self.max_samples) or self.stride < 1:
            raise ValueError("need 1 <= group_size <= max_samples and stride >= 1")


Rule = Literal["band", "relaxed", "fallback"]


@dataclass
class BARResult(Generic[P]):
    group: list[Episode[P]]
    generated: int  # samples spent on this task
    strides: int
    rule: Rule
    samples: list[Episode[P]] = field(repr=False, default_factory=list)

    @property
    def n_positive(self) -> int:
        return sum(e.positive for e in self.group)


def _order(e: Episode[P]) -> tuple[bool, int]:
    return (not e.completed, e.length)


def split_sorted(
    samples: Sequence[Episode[P]],
) -> tuple[list[Episode[P]], list[Episode[P]], list[Episode[P]]]:
    """(positive, negative, backfill), each completed-first then shortest-first (stable)."""
    pos = sorted((e for e in samples if e.positive), key=_order)
    back = sorted((e for e in samples if e.backfill), key=_order)
    neg = sorted((e for e in samples if not e.positive and not e.backfill), key=_order)
    return pos, neg, back


def positive_counts(n: int, band: tuple[float, float]) -> list[int]:
    """Positive counts allowed by `band` for a group of `n`, closest to the ideal first."""
    lo, hi = band
    ideal = round((lo + hi) / 2 * n)
    first, last = math.ceil(lo * n - 1e-9), math.floor(hi * n + 1e-9)
    return sorted(range(first, last + 1), key=lambda k: (abs(k - ideal), k))


def choose(
    samples: Sequence[Episode[P]], n: int, band: tuple[float, float]
) -> list[Episode[P]] | None:
    """The first feasible balanced group inside `band`, or None."""
    pos, neg, _ = split_sorted(samples)
    for k in positive_counts(n, band):
        if k <= len(pos) and n - k <= len(neg):
            return pos[:k] + neg[: n - k]
    return None


def select_group(
    samples: Sequence[Episode[P]], cfg: BARConfig, *, budget_spent: bool
) -> tuple[list[Episode[P]], Rule] | None:
    """BAR's decision after a stride: a group and the rule that formed it, or None (go on)."""
    group = choose(samples, cfg.group_size, cfg.band)
    if group is not None:
        return group, "band"
    if not budget_spent:
        return None
    group = choose(samples, cfg.group_size, (0.0, 1.0))
    if group is not None:
        return group, "relaxed"
    pos, neg, back = split_sorted(samples)
    return (pos + neg + back)[: cfg.group_size], "fallback"


def next_stride(cfg: BARConfig, generated: int) -> int:
    return min(cfg.stride, cfg.max_samples - generated)


def bar_rollout(generate: Callable[[int], Sequence[Episode[P]]], cfg: BARConfig) -> BARResult[P]:
    """Run BAR for one task; `generate(k)` returns k new episodes (run concurrently)."""
    samples: list[Episode[P]] = []
    strides = 0
    while True:
        k = next_stride(cfg, len(samples))
        new = list(generate(k))
        if len(new) != k:
            raise ValueError(f"generate({k}) returned {len(new)} episodes")
        samples.extend(new)
        strides += 1
        picked = select_group(samples, cfg, budget_spent=len(samples) >= cfg.max_samples)
        if picked is not None:
            return BARResult(picked[0], len(samples), strides, picked[1], samples)


async def bar_rollout_async(
    generate: Callable[[int], Awaitable[Sequence[Episode[P]]]], cfg: BARConfig
) -> BARResult[P]:
    """`bar_rollout` for an async generator of episodes."""
    samples: list[Episode[P]] = []
    strides = 0
    while True:
        k = next_stride(cfg, len(samples))
        new = list(await generate(k))
        if len(new) != k:
            raise ValueError(f"generate({k}) returned {len(new)} episodes")
        samples.extend(new)
        strides += 1
        picked = select_group(samples, cfg, budget_spent=len(samples) >= cfg.max_samples)
        if picked is not None:
            return BARResult(picked[0], len(samples), strides, picked[1], samples)


# ---------------------------------------------------------------- group filter


def group_drop_reason(group: Sequence[Episode[P]], min_std: float = 1e-6) -> str | None:
    """Why a group teaches nothing (None when it is kept): aborted, zero_std, no_positive."""
    if any(e.backfill for e in group):
        return "aborted"
    rewards = [e.reward for e in group if e.reward is not None]
    if len(rewards) < 2 or statistics.pstdev(rewards) <= min_std:
        return "zero_std"
    if not any(e.positive for e in group):
        return "no_positive"
    return None


@dataclass
class BatchResult(Generic[P]):
    groups: list[BARResult[P]]
    dropped: dict[str, int]
    tasks_drawn: int
    episodes: int  # all rollouts spent, kept or not


def fill_batch(
    draw: Callable[[], Callable[[int], Sequence[Episode[P]]] | None],
    cfg: BARConfig,
    n_groups: int,
    *,
    max_tasks: int | None = None,
    min_std: float = 1e-6,
) -> BatchResult[P]:
    """Draw tasks and run BAR until `n_groups` groups pass the filter.

    `draw()` returns the next task's episode generator, or None when the pool is empty;
    `max_tasks` bounds the draws (the batch may then come back short).
    """
    kept: list[BARResult[P]] = []
    dropped: dict[str, int] = {}
    drawn = episodes = 0
    while len(kept) < n_groups and (max_tasks is None or drawn < max_tasks):
        generate = draw()
        if generate is None:
            break
        drawn += 1
        res = bar_rollout(generate, cfg)
        episodes += res.generated
        reason = group_drop_reason(res.group, min_std)
        if reason is None:
            kept.append(res)
        else:
            dropped[reason] = dropped.get(reason, 0) + 1
    return BatchResult(kept, dropped, drawn, episodes)


async def fill_batch_async(
    draw: Callable[[], Callable[[int], Awaitable[Sequence[Episode[P]]]] | None],
    cfg: BARConfig,
    n_groups: int,
    *,
    max_tasks: int | None = None,
    min_std: float = 1e-6,
    concurrency: int = 1,
) -> BatchResult[P]:
    """`fill_batch` running up to `concurrency` tasks at once (extra groups are discarded)."""
    kept: list[BARResult[P]] = []
    dropped: dict[str, int] = {}
    drawn = episodes = 0
    exhausted = False
    while len(kept) < n_groups and not exhausted:
        wave = []
        for _ in range(max(1, min(concurrency, n_groups - len(kept)))):
            if max_tasks is not None and drawn >= max_tasks:
                break
            generate = draw()
            if generate is None:
                exhausted = True
                break
            drawn += 1
            wave.append(bar_rollout_async(generate, cfg))
        if not wave:
            break
        for res in await asyncio.gather(*wave):
            episodes += res.generated
            reason = group_drop_reason(res.group, min_std)
            if reason is not None:
                dropped[reason] = dropped.get(reason, 0) + 1
            elif len(kept) < n_groups:
                kept.append(res)
    return BatchResult(kept, dropped, drawn, episodes)


# ---------------------------------------------------------------- rewards and advantages


@dataclass(frozen=True)
class RewardConfig:
    resolved: float = 1.0
    unresolved: float = -1.0

    def __call__(self, resolved: bool) -> float:
        return self.resolved if resolved else self.unresolved


def group_advantages(
    rewards: Sequence[float], *, scale: bool = True, eps: float = 1e-4
) -> list[float]:
    """GRPO: reward minus the group mean, divided by the group's (sample) std when `scale`.

    Matches TRL's `scale_rewards="group"` (Bessel-corrected std, `eps` added); with
    `scale=False` it is the unscaled variant (`scale_rewards="none"`).
    """
    if not rewards:
        return []
    mean = statistics.fmean(rewards)
    centred = [r - mean for r in rewards]
    if not scale:
        return centred
    std = statistics.stdev(rewards) if len(rewards) > 1 else 0.0
    return [c / (std + eps) for c in centred]
