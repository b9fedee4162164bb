"""The Interval type and merging."""

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Interval:
    """The closed interval [start, end]."""

    start: float
    end: float

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise ValueError(f"end {self.end} is before start {self.start}")

    @property
    def length(self) -> float:
        return self.end - self.start


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Union of `intervals` as a sorted list of disjoint intervals (touching ones join)."""
    merged: list[Interval] = []
    for iv in intervals:
        if merged and iv.start <= merged[-1].end:
            last = merged[-1]
            merged[-1] = Interval(last.start, max(last.end, iv.end))
        else:
            merged.append(iv)
    return merged
