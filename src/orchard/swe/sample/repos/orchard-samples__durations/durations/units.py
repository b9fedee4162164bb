"""Unit suffixes and their length in seconds."""

UNITS: dict[str, float] = {
    "d": 86400.0,
    "h": 3600.0,
    "m": 60.0,
    "s": 1.0,
    "ms": 0.001,
}
