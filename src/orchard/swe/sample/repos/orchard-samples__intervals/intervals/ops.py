"""Queries over collections of intervals."""

from collections.abc import Iterable

from intervals.core import Interval, merge


def overlaps(a: Interval, b: Interval) -> bool:
    """True if the two closed intervals share at least one point."""
    return a.start <= b.end and b.start <= a.end


def total_length(intervals: Iterable[Interval]) -> float:
    """Length of the union, counting overlapping parts once."""
    return sum(iv.length for iv in merge(intervals))


def covers(intervals: Iterable[Interval], point: float) -> bool:
    """True if `point` lies in any of the intervals."""
    return any(iv.start <= point <= iv.end for iv in intervals)
