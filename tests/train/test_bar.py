"""BAR, the group filter and GRPO advantages against synthetic reward sequences."""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Awaitable, Callable, Sequence

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from orchard.train.bar import (
    BARConfig,
    Episode,
    Outcome,
    RewardConfig,
    bar_rollout,
    bar_rollout_async,
    choose,
    fill_batch,
    fill_batch_async,
    group_advantages,
    group_drop_reason,
    positive_counts,
    split_sorted,
)

E = Episode[int]


def ep(
    reward: float | None, length: int = 10, outcome: Outcome = Outcome.SUBMITTED, i: int = 0
) -> E:
    return Episode(reward, length, outcome, i)


def feeder(seq: Sequence[E]) -> tuple[Callable[[int], list[E]], list[int]]:
    """generate(k) handing out `seq` in order; records the stride sizes asked for."""
    calls: list[int] = []

    def generate(k: int) -> list[E]:
        start = sum(calls)
        calls.append(k)
        return list(seq[start : start + k])

    return generate, calls


def rewards_seq(*rs: float | None) -> list[E]:
    return [ep(r, length=10 + i, i=i) for i, r in enumerate(rs)]


# ---------------------------------------------------------------- examples


def test_positive_counts_closest_to_ideal_first() -> None:
    assert positive_counts(4, (0.25, 0.75)) == [2, 1, 3]
    assert positive_counts(4, (0.0, 1.0)) == [2, 1, 3, 0, 4]
    # ideal round(2.5) = 2; counts ceil(1.25)..floor(3.75)
    assert positive_counts(5, (0.25, 0.75)) == [2, 3]
    assert positive_counts(3, (0.5, 0.5)) == []  # 1.5 positives: no integer fits


def test_balanced_group_from_one_stride() -> None:
    gen, calls = feeder(rewards_seq(1, -1, -1, -1, 1, 1, -1, -1))
    res = bar_rollout(gen, BARConfig())
    assert calls == [8] and res.rule == "band" and res.generated == 8
    assert [e.reward for e in res.group] == [1, 1, -1, -1]
    assert [e.payload for e in res.group] == [0, 4, 1, 2]  # shortest first within each list


def test_sorting_completed_first_then_shortest() -> None:
    a = ep(1, 50, Outcome.LIMIT, 0)
    b = ep(1, 90, Outcome.SUBMITTED, 1)
    c = ep(1, 20, Outcome.SUBMITTED, 2)
    d = ep(-1, 5, Outcome.LIMIT, 3)
    e = ep(None, 1, Outcome.ABORTED, 4)
    f = ep(1, 1, Outcome.TIME_LIMIT, 5)
    pos, neg, back = split_sorted([a, b, c, d, e, f])
    assert pos == [c, b, a] and neg == [d] and back == [e, f]


def test_early_stop_after_the_stride_that_balances() -> None:
    gen, calls = feeder(rewards_seq(-1, -1, 1, -1, 1, 1, 1, 1))
    res = bar_rollout(gen, BARConfig(stride=2))
    assert calls == [2, 2] and res.generated == 4 and res.strides == 2
    assert res.rule == "band" and res.n_positive == 1


def test_relaxed_when_every_sample_fails() -> None:
    gen, calls = feeder(rewards_seq(*[-1] * 8))
    res = bar_rollout(gen, BARConfig(stride=3))
    assert calls == [3, 3, 2] and res.rule == "relaxed" and res.n_positive == 0
    assert group_drop_reason(res.group) == "zero_std"


def test_fallback_when_too_few_scored_samples() -> None:
    seq = [ep(None, 3, Outcome.ABORTED, i) for i in range(6)] + rewards_seq(1, -1)
    res = bar_rollout(feeder(seq)[0], BARConfig())
    assert res.rule == "fallback"
    assert [e.reward for e in res.group] == [1, -1, None, None]
    assert group_drop_reason(res.group) == "aborted"


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        BARConfig(band=(0.8, 0.2))
    with pytest.raises(ValueError):
        BARConfig(group_size=9, max_samples=8)


# ---------------------------------------------------------------- properties

outcomes = st.sampled_from(list(Outcome))
episodes = st.builds(
    lambda r, n, o: (r, n, o),
    st.one_of(st.none(), st.sampled_from([-1.0, 0.0, 0.5, 1.0])),
    st.integers(1, 100),
    outcomes,
)


@st.composite
def cases(draw: st.DrawFn) -> tuple[BARConfig, list[E]]:
    n = draw(st.integers(1, 6))
    m = draw(st.integers(n, 12))
    s = draw(st.integers(1, 12))
    lo = draw(st.sampled_from([0.0, 0.25, 0.3, 0.5]))
    hi = draw(st.sampled_from([h for h in (0.5, 0.6, 0.75, 1.0) if h >= lo]))
    raw = draw(st.lists(episodes, min_size=m, max_size=m))
    return BARConfig(n, m, s, (lo, hi)), [Episode(r, ln, o, i) for i, (r, ln, o) in enumerate(raw)]


@settings(max_examples=400, deadline=None)
@given(cases())
def test_bar_invariants(case: tuple[BARConfig, list[E]]) -> None:
    cfg, seq = case
    gen, calls = feeder(seq)
    res = bar_rollout(gen, cfg)
    n, (lo, hi) = cfg.group_size, cfg.band
    samples = seq[: res.generated]
    # group size, distinct members drawn from what was generated, budget respected
    assert len(res.group) == n
    assert len({id(e) for e in res.group}) == n and all(e in samples for e in res.group)
    assert res.generated == sum(calls) <= cfg.max_samples and res.strides == len(calls)
    assert all(k == min(cfg.stride, cfg.max_samples - sum(calls[:i])) for i, k in enumerate(calls))
    # early stop: no earlier stride boundary could already form a band group
    ends = [sum(calls[: i + 1]) for i in range(len(calls))]
    assert all(choose(seq[:end], n, cfg.band) is None for end in ends[:-1])
    pos, neg, back = split_sorted(samples)
    k = res.n_positive
    if res.rule == "band":
        assert math.ceil(lo * n - 1e-9) <= k <= math.floor(hi * n + 1e-9)
        # the closest feasible count to the ideal was taken
        feasible = [c for c in positive_counts(n, cfg.band) if c <= len(pos) and n - c <= len(neg)]
        assert k == feasible[0]
    else:
        assert res.generated == cfg.max_samples
        assert choose(samples, n, cfg.band) is None
    if res.rule == "relaxed":
        assert not any(e.backfill for e in res.group)
    if res.rule == "fallback":
        assert len(pos) + len(neg) < n
        assert res.group == (pos + neg + back)[:n]
    if res.rule in ("band", "relaxed"):
        # the best of each list: top-k positives and top-(n-k) negatives in sorted order
        assert res.group == pos[:k] + neg[: n - k]


@settings(max_examples=100, deadline=None)
@given(cases())
def test_async_matches_sync(case: tuple[BARConfig, list[E]]) -> None:
    cfg, seq = case
    sync = bar_rollout(feeder(seq)[0], cfg)
    gen, _ = feeder(seq)

    async def agen(k: int) -> list[E]:
        return gen(k)

    res = asyncio.run(bar_rollout_async(agen, cfg))
    assert (res.group, res.generated, res.rule) == (sync.group, sync.generated, sync.rule)


# ---------------------------------------------------------------- filter and advantages


def test_group_filter_reasons() -> None:
    assert group_drop_reason(rewards_seq(1, -1, -1, 1)) is None
    assert group_drop_reason([*rewards_seq(1, -1, -1), ep(None, 1, Outcome.ABORTED)]) == "aborted"
    assert group_drop_reason(rewards_seq(1, 1, 1, 1)) == "zero_std"
    assert group_drop_reason(rewards_seq(-1, 0, -1, -1)) == "no_positive"
    assert group_drop_reason(rewards_seq(0.5, 0.5 + 1e-7, 0.5, 0.5)) == "zero_std"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-5, 5, allow_nan=False), min_size=2, max_size=16), st.booleans())
def test_advantages_match_trl(rewards: list[float], scale: bool) -> None:
    adv = group_advantages(rewards, scale=scale)
    t = torch.tensor(rewards, dtype=torch.float64)
    want = t - t.mean()
    if scale:
        want = want / (t.std() + 1e-4)  # TRL: Bessel-corrected group std + 1e-4
    assert adv == pytest.approx(want.tolist(), abs=1e-9)
    assert sum(adv) == pytest.approx(0.0, abs=1e-6)


def test_reward_config() -> None:
    assert RewardConfig()(True) == 1.0 and RewardConfig()(False) == -1.0
    assert RewardConfig(resolved=2.0, unresolved=0.0)(False) == 0.0


def _pool(rates: list[float], seed: int) -> Callable[[], Callable[[int], list[E]] | None]:
    rng = random.Random(seed)
    order = iter(range(10_000))

    def draw() -> Callable[[int], list[E]] | None:
        p = rates[next(order) % len(rates)]
        return lambda k: [
            ep(1.0 if rng.random() < p else -1.0, rng.randint(1, 99)) for _ in range(k)
        ]

    return draw


def test_fill_batch_draws_until_full() -> None:
    batch = fill_batch(_pool([0.0, 1.0, 0.5, 0.3], seed=1), BARConfig(), n_groups=6)
    assert len(batch.groups) == 6
    assert all(group_drop_reason(g.group) is None for g in batch.groups)
    assert batch.tasks_drawn == 6 + sum(batch.dropped.values())
    assert batch.dropped.get("zero_std", 0) >= 1  # the 0% and 100% tasks
    assert batch.episodes == sum(8 for _ in range(batch.tasks_drawn))


def test_fill_batch_bounded_and_async() -> None:
    short = fill_batch(_pool([0.0], seed=2), BARConfig(), n_groups=2, max_tasks=5)
    assert short.groups == [] and short.tasks_drawn == 5 and short.dropped == {"zero_std": 5}

    def adraw() -> Callable[[int], Awaitable[list[E]]] | None:
        inner = sync_draw()
        if inner is None:
            return None

        async def gen(k: int) -> list[E]:
            return inner(k)

        return gen

    sync_draw = _pool([0.5], seed=3)
    res = asyncio.run(fill_batch_async(adraw, BARConfig(), n_groups=3, concurrency=4))
    assert len(res.groups) == 3 and all(group_drop_reason(g.group) is None for g in res.groups)
