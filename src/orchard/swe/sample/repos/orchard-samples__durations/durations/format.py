"""Format seconds as a compact duration string."""


def format_duration(seconds: float) -> str:
    """`5400` -> `"1h30m"`; zero parts are left out; sub-second remainders as ms."""
    if seconds < 0:
        raise ValueError("negative duration")
    whole = int(seconds)
    millis = round((seconds - whole) * 1000)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, whole = divmod(whole, size)
        if count:
            parts.append(f"{count}{unit}")
    if millis:
        parts.append(f"{millis}ms")
    return "".join(parts) or "0s"
