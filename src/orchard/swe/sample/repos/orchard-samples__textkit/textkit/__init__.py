"""Small text helpers: slugs, truncation and wrapping."""

from textkit.slug import slugify
from textkit.wrap import truncate, wrap

__all__ = ["slugify", "truncate", "wrap"]
