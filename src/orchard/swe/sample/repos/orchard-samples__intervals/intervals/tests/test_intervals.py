import pytest

from intervals import Interval, covers, merge, overlaps


def test_invalid_interval() -> None:
    with pytest.raises(ValueError):
        Interval(3, 1)


def test_merge_sorted_overlapping() -> None:
    assert merge([Interval(1, 3), Interval(2, 5), Interval(7, 8)]) == [
        Interval(1, 5),
        Interval(7, 8),
    ]


def test_merge_touching() -> None:
    assert merge([Interval(1, 2), Interval(2, 4)]) == [Interval(1, 4)]


def test_overlaps() -> None:
    assert overlaps(Interval(0, 1), Interval(1, 2))
    assert not overlaps(Interval(0, 1), Interval(1.5, 2))


def test_covers() -> None:
    assert covers([Interval(0, 1), Interval(5, 6)], 5.5)
    assert not covers([Interval(0, 1)], 2)
