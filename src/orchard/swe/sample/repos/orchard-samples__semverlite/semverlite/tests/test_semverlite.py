import pytest

from semverlite import Version, parse, satisfies


def test_parse_full() -> None:
    v = parse("1.2.3-beta.1+build.5")
    assert v == Version(1, 2, 3, ("beta", "1"), "build.5")
    assert str(v) == "1.2.3-beta.1+build.5"


def test_parse_rejects_leading_zero() -> None:
    with pytest.raises(ValueError):
        parse("01.2.3")


def test_order_numeric_parts() -> None:
    assert parse("1.9.0") < parse("1.10.0")


def test_build_metadata_ignored_in_equality() -> None:
    assert parse("1.0.0+a") == parse("1.0.0+b")


def test_satisfies_range() -> None:
    assert satisfies("1.4.2", ">=1.2.0 <2.0.0")
    assert not satisfies("2.0.0", ">=1.2.0 <2.0.0")
