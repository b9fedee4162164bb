"""Parse strings like "1h30m" or "1.5s" into seconds."""

import re

from durations.units import UNITS


class DurationError(ValueError):
    """The text is not a duration."""


_PART = re.compile(r"(\d+(?:\.\d+)?)(" + "|".join(UNITS) + r")")


def parse_duration(text: str) -> float:
    """Total seconds of a sequence of <number><unit> parts (units: d, h, m, s, ms)."""
    compact = text.replace(" ", "").lower()
    if not compact:
        raise DurationError("empty duration")
    total = 0.0
    pos = 0
    for match in _PART.finditer(compact):
        if match.start() != pos:
            raise DurationError(f"unexpected text at {pos} in {text!r}")
        total += float(match[1]) * UNITS[match[2]]
        pos = match.end()
    if pos != len(compact):
        raise DurationError(f"unexpected text at {pos} in {text!r}")
    return total
