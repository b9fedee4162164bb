import pytest

from csvlite import format_row, parse_line, read_rows, write_rows
from csvlite.reader import CSVError


def test_parse_plain_fields() -> None:
    assert parse_line("a,b,c") == ["a", "b", "c"]


def test_parse_quoted_delimiter() -> None:
    assert parse_line('"a,b",c') == ["a,b", "c"]


def test_parse_empty_fields() -> None:
    assert parse_line(",x,") == ["", "x", ""]


def test_unterminated_quote() -> None:
    with pytest.raises(CSVError):
        parse_line('"abc')


def test_format_quotes_when_needed() -> None:
    assert format_row(["a", "b,c", 3]) == 'a,"b,c",3'


def test_read_rows_skips_blank_lines() -> None:
    assert read_rows(["a,b\n", "\n", "c,d\r\n"]) == [["a", "b"], ["c", "d"]]


def test_write_rows() -> None:
    assert write_rows([["x", 1], ["y", 2]]) == "x,1\ny,2\n"
