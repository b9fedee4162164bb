"""Shared bits of the mock services: tool errors, deterministic ids and a simulated clock."""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Iterable
from typing import Any

DEFAULT_NOW = "2026-03-04T10:00"
Item = dict[str, Any]


class ToolError(Exception):
    """A failure the model caused (bad id, bad value): answered 4xx with `message`."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def not_found(kind: str, key: str) -> ToolError:
    return ToolError(f"no {kind} with id '{key}'", 404)


def next_id(prefix: str, items: Iterable[Item]) -> str:
    """The next id after the highest `<prefix>-NNN` in `items`, so ids never repeat."""
    numbers = [0]
    for item in items:
        head, _, tail = str(item.get("id", "")).rpartition("-")
        if head == prefix and tail.isdigit():
            numbers.append(int(tail))
    return f"{prefix}-{max(numbers) + 1:03d}"


def find(items: Iterable[Item], key: str, kind: str) -> Item:
    for item in items:
        if item.get("id") == key:
            return item
    raise not_found(kind, key)


def parse_time(value: Any, arg: str) -> dt.datetime:
    """A date or date-time string as a datetime; the error names the argument."""
    try:
        parsed = dt.datetime.fromisoformat(value)
    except (TypeError, ValueError):
        raise ToolError(
            f"argument '{arg}': {value!r} is not a date-time like 2026-03-03T14:00"
        ) from None
    return parsed.replace(tzinfo=None, second=0, microsecond=0)


def fmt_time(value: dt.datetime) -> str:
    return value.strftime("%Y-%m-%dT%H:%M")


def contains(haystacks: Iterable[Any], needle: str) -> bool:
    needle = needle.lower()
    return any(needle in str(h).lower() for h in haystacks if h is not None)


class Service:
    """Base of every service: a deep copy of its fixture, a clock, and the state snapshot.

    A subclass's tool methods are named like the tools (`mail_send_message`) and take the
    tool's arguments as keywords, already checked against catalog.json.
    """

    name = ""

    def __init__(self, fixture: Item) -> None:
        self.data: Item = copy.deepcopy(fixture)
        self._now = parse_time(self.data.get("now", DEFAULT_NOW), "now")

    def tick(self) -> str:
        """The simulated time of a change: starts at the fixture's `now`, a minute per change."""
        stamp = fmt_time(self._now)
        self._now += dt.timedelta(minutes=1)
        return stamp

    def state(self) -> Item:
        return copy.deepcopy(self.data)
