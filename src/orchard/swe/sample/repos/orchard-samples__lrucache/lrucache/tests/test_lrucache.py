import pytest

from lrucache import LRUCache, memoize


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError):
        LRUCache(0)


def test_put_and_get() -> None:
    cache: LRUCache[str, int] = LRUCache(2)
    cache.put("a", 1)
    assert cache.get("a") == 1
    assert cache.get("missing", -1) == -1
    assert (cache.hits, cache.misses) == (1, 1)


def test_evicts_oldest_insert() -> None:
    cache: LRUCache[str, int] = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("c", 3)
    assert "a" not in cache
    assert cache.keys() == ["b", "c"]


def test_memoize_calls_once() -> None:
    calls: list[int] = []

    @memoize(capacity=4)
    def square(x: int) -> int:
        calls.append(x)
        return x * x

    assert square(3) == 9
    assert square(3) == 9
    assert calls == [3]
