"""A bounded LRU cache and a memoizing decorator."""

from lrucache.cache import LRUCache
from lrucache.decorators import memoize

__all__ = ["LRUCache", "memoize"]
