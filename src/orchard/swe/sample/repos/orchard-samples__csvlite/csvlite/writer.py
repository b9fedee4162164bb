"""Format lists of fields as CSV lines."""

from collections.abc import Iterable, Sequence


def _quote(value: str, delimiter: str) -> str:
    if any(c in value for c in (delimiter, '"', "\n", "\r")):
        return '"' + value.replace('"', '""') + '"'
    return value


def format_row(row: Sequence[object], delimiter: str = ",") -> str:
    """One CSV record; fields holding the delimiter, quotes or newlines are quoted."""
    return delimiter.join(_quote(str(v), delimiter) for v in row)


def write_rows(rows: Iterable[Sequence[object]], delimiter: str = ",") -> str:
    """All records, one per line."""
    return "".join(format_row(row, delimiter) + "\n" for row in rows)
