"""memoize: cache a function's results in an LRUCache."""

import functools
from collections.abc import Callable, Hashable
from typing import TypeVar, cast

from lrucache.cache import LRUCache

R = TypeVar("R")
_MISSING = object()


def memoize(capacity: int = 128) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Remember up to `capacity` results, keyed by the positional arguments."""

    def decorate(fn: Callable[..., R]) -> Callable[..., R]:
        cache: LRUCache[tuple[Hashable, ...], object] = LRUCache(capacity)

        @functools.wraps(fn)
        def wrapper(*args: Hashable) -> R:
            hit = cache.get(args, _MISSING)
            if hit is not _MISSING:
                return cast(R, hit)
            result = fn(*args)
            cache.put(args, result)
            return result

        wrapper.cache = cache  # type: ignore[attr-defined]
        return wrapper

    return decorate
