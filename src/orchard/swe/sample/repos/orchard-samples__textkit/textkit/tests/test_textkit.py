import pytest

from textkit import slugify, truncate, wrap


def test_slugify_basic() -> None:
    assert slugify("Hello, World!") == "hello-world"


def test_slugify_accents() -> None:
    assert slugify("Crème brûlée", sep="_") == "creme_brulee"


def test_truncate_short_text_unchanged() -> None:
    assert truncate("short", 10) == "short"


def test_truncate_negative_width() -> None:
    with pytest.raises(ValueError):
        truncate("abc", -1)


def test_wrap_breaks_between_words() -> None:
    assert wrap("the quick brown fox", 10) == ["the quick", "brown fox"]


def test_wrap_splits_long_words() -> None:
    assert wrap("abcdefghij", 4) == ["abcd", "efgh", "ij"]
