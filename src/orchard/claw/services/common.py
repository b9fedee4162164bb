"""Shared bits of the mock services: tool errors, argument validation against catalog.json's
schemas (also used by the host for the sandbox tools), deterministic ids, a simulated clock."""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Iterable
from typing import Any

DEFAULT_NOW = "2026-03-04T10:00"
Item = dict[str, Any]
TYPES: dict[str, type | tuple[type, ...]] = {
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "array": list,
    "object": dict,
}


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


def check(value: Any, schema: Item, where: str) -> None:
    """Validate `value` against the small JSON-schema subset catalog.json uses."""
    kind: str = schema.get("type", "")
    ok = isinstance(value, TYPES[kind]) if kind else True
    if ok and kind in ("integer", "number") and isinstance(value, bool):
        ok = False
    if not ok:
        raise ToolError(f"argument '{where}' must be {'an' if kind[0] in 'aeio' else 'a'} {kind}")
    if "enum" in schema and value not in schema["enum"]:
        raise ToolError(f"argument '{where}' must be one of {', '.join(map(str, schema['enum']))}")
    if kind == "string" and len(value) < schema.get("minLength", 0):
        raise ToolError(f"argument '{where}' must not be empty")
    if kind in ("integer", "number") and not (
        schema.get("minimum", value) <= value <= schema.get("maximum", value)
    ):
        raise ToolError(
            f"argument '{where}' must be between {schema.get('minimum', '-inf')}"
            f" and {schema.get('maximum', 'inf')}"
        )
    if kind == "array":
        if len(value) < schema.get("minItems", 0):
            raise ToolError(f"argument '{where}' needs at least {schema['minItems']} item(s)")
        for n, item in enumerate(value):
            check(item, schema.get("items", {}), f"{where}[{n}]")
    if kind == "object" and "properties" in schema:
        props = schema["properties"]
        for key in schema.get("required", []):
            if key not in value:
                raise ToolError(f"missing required argument '{key}'")
        for key, item in value.items():
            if key not in props:
                raise ToolError(
                    f"unknown argument '{key}' (expected: {', '.join(props) or 'none'})"
                )
            check(item, props[key], key)


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
