"""A tiny CSV reader and writer."""

from csvlite.reader import parse_line, read_rows
from csvlite.writer import format_row, write_rows

__all__ = ["format_row", "parse_line", "read_rows", "write_rows"]
