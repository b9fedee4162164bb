"""Truncation and greedy word wrapping."""


def truncate(text: str, width: int, suffix: str = "...") -> str:
    """Shorten `text` to at most `width` characters, ending with `suffix` when cut."""
    if width < 0:
        raise ValueError("width must be >= 0")
    if len(text) <= width:
        return text
    return text[:width] + suffix


def wrap(text: str, width: int) -> list[str]:
    """Split `text` into lines of at most `width` characters, breaking between words."""
    if width <= 0:
        raise ValueError("width must be > 0")
    lines: list[str] = []
    current = ""
    for word in text.split():
        candidate = f"{current} {word}" if current else word
        if len(candidate) <= width:
            current = candidate
            continue
        if current:
            lines.append(current)
        while len(word) > width:
            lines.append(word[:width])
            word = word[width:]
        current = word
    if current:
        lines.append(current)
    return lines
