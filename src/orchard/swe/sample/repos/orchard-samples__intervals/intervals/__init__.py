"""Closed numeric intervals."""

from intervals.core import Interval, merge
from intervals.ops import covers, overlaps, total_length

__all__ = ["Interval", "covers", "merge", "overlaps", "total_length"]
