"""Human-readable durations."""

from durations.format import format_duration
from durations.parse import DurationError, parse_duration

__all__ = ["DurationError", "format_duration", "parse_duration"]
