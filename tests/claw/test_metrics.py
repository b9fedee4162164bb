"""pass@k / pass^k arithmetic: exact values, the n == k special case, and properties."""

from __future__ import annotations

import itertools
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchard.claw.metrics import pass_at_k, pass_hat_k, summarize, table_header, table_rows


def _brute(n: int, c: int, k: int) -> tuple[Fraction, Fraction]:
    """Both metrics by enumerating every k-subset of n trials (the first c pass)."""
    subsets = list(itertools.combinations(range(n), k))
    anyp = sum(1 for s in subsets if any(i < c for i in s))
    allp = sum(1 for s in subsets if all(i < c for i in s))
    return Fraction(anyp, len(subsets)), Fraction(allp, len(subsets))


def test_known_values() -> None:
    assert pass_at_k(10, 0, 3) == 0.0
    assert pass_at_k(10, 10, 3) == 1.0
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_hat_k(4, 2, 2) == pytest.approx(1 / 6)  # C(2,2)/C(4,2)
    assert pass_hat_k(5, 3, 1) == pytest.approx(0.6)
    assert pass_at_k(5, 3, 1) == pytest.approx(0.6)  # k == 1: both are the pass rate


def test_n_equals_k_is_any_and_all() -> None:
    for n in range(1, 6):
        for c in range(n + 1):
            assert pass_at_k(n, c, n) == (1.0 if c > 0 else 0.0)
            assert pass_hat_k(n, c, n) == (1.0 if c == n else 0.0)


@pytest.mark.parametrize("bad", [(3, 4, 1), (3, 1, 4), (3, 1, 0), (3, -1, 1)])
def test_rejects_impossible_counts(bad: tuple[int, int, int]) -> None:
    with pytest.raises(ValueError):
        pass_at_k(*bad)
    with pytest.raises(ValueError):
        pass_hat_k(*bad)


counts = st.integers(1, 9).flatmap(
    lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))
)


@given(counts)
def test_matches_enumeration(nck: tuple[int, int, int]) -> None:
    n, c, k = nck
    anyp, allp = _brute(n, c, k)
    assert pass_at_k(n, c, k) == pytest.approx(float(anyp))
    assert pass_hat_k(n, c, k) == pytest.approx(float(allp))


@given(counts)
def test_bounds_and_monotonicity(nck: tuple[int, int, int]) -> None:
    n, c, k = nck
    at, hat = pass_at_k(n, c, k), pass_hat_k(n, c, k)
    eps = 1e-12
    assert 0.0 <= hat <= c / n + eps and c / n <= at + eps and at <= 1.0
    if k < n:  # more tries: any-of rises, all-of falls
        assert pass_at_k(n, c, k + 1) >= at - eps
        assert pass_hat_k(n, c, k + 1) <= hat + eps
    if c < n:  # one more passing trial never hurts
        assert pass_at_k(n, c + 1, k) >= at - eps
        assert pass_hat_k(n, c + 1, k) >= hat - eps


def test_summary_per_category() -> None:
    def rec(task: str, cat: str, passed: bool, score: float) -> dict[str, object]:
        return {"task_id": task, "category": cat, "passed": passed, "score": score}

    results = [
        rec("a", "mail", True, 1.0),
        rec("a", "mail", False, 0.5),
        rec("b", "mail", False, 0.0),
        rec("b", "mail", False, 0.25),
        rec("c", "calendar", True, 1.0),
        rec("c", "calendar", True, 0.9),
        rec("d", "calendar", True, 1.0),  # one trial only: no pass@2
    ]
    s = summarize(results, k=2)
    assert s["tasks"] == 4 and s["trials"] == 7 and s["passed"] == 4
    assert s["incomplete_tasks"] == 1
    assert s["pass_at_k"] == pytest.approx((1 + 0 + 1) / 3)
    assert s["pass_hat_k"] == pytest.approx((0 + 0 + 1) / 3)
    assert s["mean_score"] == pytest.approx(4.65 / 7)
    mail = s["categories"]["mail"]
    assert mail["pass_at_k"] == 0.5 and mail["pass_hat_k"] == 0.0 and mail["tasks"] == 2
    rows = table_rows(s)
    assert [r[0] for r in rows] == ["calendar", "mail", "all"]
    assert rows[-1][3] == "0.667" and table_header(2)[3] == "pass@2"
