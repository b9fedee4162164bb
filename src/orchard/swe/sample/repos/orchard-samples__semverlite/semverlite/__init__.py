"""Semantic versions: parsing, ordering and simple range matching."""

from semverlite.ranges import satisfies
from semverlite.version import Version, parse

__all__ = ["Version", "parse", "satisfies"]
