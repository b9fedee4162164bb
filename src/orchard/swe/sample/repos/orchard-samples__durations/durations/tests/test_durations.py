import pytest

from durations import DurationError, format_duration, parse_duration


def test_parse_hours_minutes() -> None:
    assert parse_duration("1h30m") == 5400


def test_parse_fraction_and_spaces() -> None:
    assert parse_duration("1.5s") == 1.5
    assert parse_duration("2d 4h") == 2 * 86400 + 4 * 3600


def test_parse_rejects_garbage() -> None:
    with pytest.raises(DurationError):
        parse_duration("10 parsecs")


def test_format_round_numbers() -> None:
    assert format_duration(5400) == "1h30m"
    assert format_duration(0) == "0s"


def test_format_millis() -> None:
    assert format_duration(1.25) == "1s250ms"
