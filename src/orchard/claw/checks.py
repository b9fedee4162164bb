"""The check language of Claw specs: paths into JSON values and the matchers applied there.

`parse_path("messages[folder=sent][-1].to")` reads a path (keys, indexes, filters);
`resolve(value, path)` follows it (or gives `MISSING`); `match(matcher, value)` says whether
a value matches and why. `validate_matcher` rejects a malformed matcher when a spec loads,
so a typo fails there, not mid-grading. docs/claw.md ("Checks") lists every form.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

AUDIT_FIELDS = ("seq", "ts", "service", "op", "args", "status", "ok", "fault", "result")


class SpecError(ValueError):
    """A malformed spec or check; the message names the spec id and item id."""


# --- paths -----------------------------------------------------------------------------------


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


MISSING: Any = _Missing()

_TOKEN = re.compile(r"\.?([A-Za-z_][\w-]*)|\[([^\]]*)\]")
_FILTER = re.compile(r"^\s*([A-Za-z_][\w.-]*)\s*(!=|~=|=)\s*(.*?)\s*$")


@dataclass(frozen=True)
class _Step:
    kind: str  # "key" | "index" | "filter"
    key: str = ""
    index: int = 0
    op: str = ""
    value: str = ""


def parse_path(path: str) -> list[_Step]:
    """`messages[folder=sent][-1].to` → key, filter, index, key. Raises ValueError if malformed.

    `["/docs/a.md"]` is a key that is not a plain name (a path, an address).
    Filters: `[k=v]` (equal, or a member of a list field), `[k!=v]`, `[k~=v]` (case-insensitive
    substring, or a substring of a member); `k` may itself be dotted (`[from.email=...]`).
    """
    if not path or not path.strip():
        raise ValueError("empty path")
    steps: list[_Step] = []
    pos = 0
    while pos < len(path):
        m = _TOKEN.match(path, pos)
        if m is None or (m.group(0).startswith(".") and pos == 0):
            raise ValueError(f"bad path {path!r} at position {pos}: {path[pos:]!r}")
        pos = m.end()
        if m.group(1) is not None:
            steps.append(_Step("key", key=m.group(1)))
            continue
        inner = m.group(2).strip()
        quoted = re.fullmatch(r"\"([^\"]*)\"|'([^']*)'", inner)
        if quoted is not None:
            steps.append(_Step("key", key=quoted.group(1) or quoted.group(2) or ""))
            continue
        if re.fullmatch(r"-?\d+", inner):
            steps.append(_Step("index", index=int(inner)))
            continue
        f = _FILTER.match(inner)
        if f is None:
            raise ValueError(
                f"bad selector [{inner}] in path {path!r} (use [n], ['key'], [k=v], [k!=v], [k~=v])"
            )
        parse_path(f.group(1))
        steps.append(_Step("filter", key=f.group(1), op=f.group(2), value=f.group(3)))
    return steps


def _scalar_text(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return json.dumps(v)
    return str(v)


def _filter_holds(elem: Any, step: _Step) -> bool:
    v = resolve(elem, step.key)
    if v is MISSING:
        return step.op == "!="
    members = v if isinstance(v, list) else [v]
    texts = [_scalar_text(x) for x in members]
    if step.op == "~=":
        return any(step.value.lower() in t.lower() for t in texts)
    hit = step.value in texts
    return not hit if step.op == "!=" else hit


def resolve(value: Any, path: str | list[_Step]) -> Any:
    """The value at `path`, or MISSING. A key applied to a list maps over its elements."""
    steps = parse_path(path) if isinstance(path, str) else path
    for step in steps:
        if value is MISSING:
            return MISSING
        if step.kind == "key":
            if isinstance(value, Mapping):
                value = value.get(step.key, MISSING)
            elif isinstance(value, list):
                value = [e[step.key] for e in value if isinstance(e, Mapping) and step.key in e]
            else:
                return MISSING
        elif step.kind == "index":
            if not isinstance(value, list) or not -len(value) <= step.index < len(value):
                return MISSING
            value = value[step.index]
        else:
            if not isinstance(value, list):
                return MISSING
            value = [e for e in value if _filter_holds(e, step)]
    return value


# --- matchers --------------------------------------------------------------------------------

_Matcher = Callable[[Any, Any], tuple[bool, str]]


def _fold(v: Any) -> Any:
    return v.casefold() if isinstance(v, str) else v


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 120 else text[:117] + "..."


def _contains(value: Any, needle: Any) -> bool:
    if isinstance(value, str):
        return isinstance(needle, str) and needle.casefold() in value.casefold()
    if isinstance(value, list):
        return any(_fold(x) == _fold(needle) for x in value)
    return False


def _compare(op: str) -> _Matcher:
    fns: dict[str, Callable[[Any, Any], bool]] = {
        "gt": lambda a, b: a > b,
        "ge": lambda a, b: a >= b,
        "lt": lambda a, b: a < b,
        "le": lambda a, b: a <= b,
    }

    def m(value: Any, bound: Any) -> tuple[bool, str]:
        numeric = all(
            isinstance(x, int | float) and not isinstance(x, bool) for x in (value, bound)
        )
        if not numeric and not (isinstance(value, str) and isinstance(bound, str)):
            return False, f"{_show(value)} is not comparable with {_show(bound)}"
        return fns[op](value, bound), f"{_show(value)} {op} {_show(bound)}"

    return m


def _m_eq(value: Any, x: Any) -> tuple[bool, str]:
    return value == x, f"{_show(value)} == {_show(x)}"


def _m_ne(value: Any, x: Any) -> tuple[bool, str]:
    return value != x, f"{_show(value)} != {_show(x)}"


def _m_contains(value: Any, x: Any) -> tuple[bool, str]:
    return _contains(value, x), f"{_show(value)} contains {_show(x)}"


def _m_icontains_all(value: Any, xs: Any) -> tuple[bool, str]:
    missing = [x for x in xs if not _contains(value, x)]
    return not missing, f"{_show(value)} lacks {missing!r}" if missing else "all present"


def _m_regex(value: Any, x: Any) -> tuple[bool, str]:
    if not isinstance(value, str):
        return False, f"{_show(value)} is not a string"
    return re.search(x, value) is not None, f"{_show(value)} ~ /{x}/"


def _m_in(value: Any, xs: Any) -> tuple[bool, str]:
    return any(_fold(value) == _fold(x) for x in xs), f"{_show(value)} in {_show(xs)}"


def _m_len(value: Any, sub: Any) -> tuple[bool, str]:
    if not isinstance(value, str | list | dict):
        return False, f"{_show(value)} has no length"
    ok, why = match(sub, len(value))
    return ok, f"len {why}"


def _m_exists(value: Any, want: Any) -> tuple[bool, str]:
    there = value is not MISSING
    return there == want, "exists" if there else "missing"


def _m_any(value: Any, sub: Any) -> tuple[bool, str]:
    if not isinstance(value, list):
        return False, f"{_show(value)} is not a list"
    ok = any(match(sub, e)[0] for e in value)
    return ok, f"{'some' if ok else 'no'} element of {_show(value)} matches"


def _m_all(value: Any, sub: Any) -> tuple[bool, str]:
    if not isinstance(value, list):
        return False, f"{_show(value)} is not a list"
    bad = [e for e in value if not match(sub, e)[0]]
    return not bad, f"elements not matching: {_show(bad)}" if bad else "every element matches"


def _m_not(value: Any, sub: Any) -> tuple[bool, str]:
    ok, why = match(sub, value)
    return not ok, f"not ({why})"


def _m_and(value: Any, subs: Any) -> tuple[bool, str]:
    for sub in subs:
        ok, why = match(sub, value)
        if not ok:
            return False, why
    return True, "all hold"


def _m_or(value: Any, subs: Any) -> tuple[bool, str]:
    whys = []
    for sub in subs:
        ok, why = match(sub, value)
        if ok:
            return True, why
        whys.append(why)
    return False, " and ".join(whys)


MATCHERS: dict[str, _Matcher] = {
    "eq": _m_eq,
    "ne": _m_ne,
    "contains": _m_contains,
    "icontains_all": _m_icontains_all,
    "regex": _m_regex,
    "in": _m_in,
    "gt": _compare("gt"),
    "ge": _compare("ge"),
    "lt": _compare("lt"),
    "le": _compare("le"),
    "len": _m_len,
    "exists": _m_exists,
    "any": _m_any,
    "all": _m_all,
    "not": _m_not,
    "and": _m_and,
    "or": _m_or,
}
_MISSING_OK = {"exists", "not", "and", "or"}  # the ones that can hold on a missing value


def match(matcher: Any, value: Any) -> tuple[bool, str]:
    """Whether `value` matches `matcher`, and why (for the grade report).

    A non-object matcher is a literal compared for equality; an object's keys are operators
    that must all hold (`{"ge": 1, "le": 3}`).
    """
    if not isinstance(matcher, Mapping):
        if value is MISSING:
            return False, "missing"
        return _m_eq(value, matcher)
    for op, arg in matcher.items():
        if value is MISSING and op not in _MISSING_OK:
            return False, "missing"
        ok, why = MATCHERS[op](value, arg)
        if not ok:
            return False, why
    return True, "matches"


def validate_matcher(matcher: Any) -> None:
    """Raise ValueError if `matcher` is malformed (unknown operator, wrong operand type)."""
    if not isinstance(matcher, Mapping):
        return
    if not matcher:
        raise ValueError("empty matcher {} (use {'eq': {}} to compare with an empty object)")
    for op, arg in matcher.items():
        if op not in MATCHERS:
            raise ValueError(
                f"unknown matcher {op!r} (known: {', '.join(MATCHERS)}; "
                "use {'eq': {...}} to compare with an object)"
            )
        if op in ("len", "any", "all", "not"):
            validate_matcher(arg)
        elif op in ("and", "or"):
            if not isinstance(arg, list) or not arg:
                raise ValueError(f"{op!r} takes a non-empty list of matchers")
            for sub in arg:
                validate_matcher(sub)
        elif op == "icontains_all":
            if not isinstance(arg, list) or not arg or not all(isinstance(x, str) for x in arg):
                raise ValueError("'icontains_all' takes a non-empty list of strings")
        elif op == "in":
            if not isinstance(arg, list):
                raise ValueError("'in' takes a list")
        elif op == "regex":
            if not isinstance(arg, str):
                raise ValueError("'regex' takes a string")
            try:
                re.compile(arg)
            except re.error as e:
                raise ValueError(f"bad regex {arg!r}: {e}") from e
        elif op in ("gt", "ge", "lt", "le"):
            if isinstance(arg, bool) or not isinstance(arg, int | float | str):
                raise ValueError(f"{op!r} takes a number or a string")
        elif op == "exists":
            if not isinstance(arg, bool):
                raise ValueError("'exists' takes true or false")
        elif op == "contains" and isinstance(arg, dict | list):
            raise ValueError("'contains' takes a scalar (a substring or a list member)")
