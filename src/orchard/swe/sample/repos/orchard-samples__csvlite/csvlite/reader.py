"""Parse CSV lines into lists of fields."""

from collections.abc import Iterable


class CSVError(ValueError):
    """The input is not valid CSV."""


def parse_line(line: str, delimiter: str = ",") -> list[str]:
    """Split one CSV record into its fields, honouring double-quoted fields."""
    fields: list[str] = []
    field = ""
    in_quotes = False
    i = 0
    while i < len(line):
        ch = line[i]
        if in_quotes:
            if ch == '"':
                in_quotes = False
            else:
                field += ch
        elif ch == '"':
            in_quotes = True
        elif ch == delimiter:
            fields.append(field)
            field = ""
        else:
            field += ch
        i += 1
    if in_quotes:
        raise CSVError(f"unterminated quoted field in {line!r}")
    fields.append(field)
    return fields


def read_rows(lines: Iterable[str], delimiter: str = ",") -> list[list[str]]:
    """Parse every non-empty line."""
    return [parse_line(line.rstrip("\r\n"), delimiter) for line in lines if line.strip()]
