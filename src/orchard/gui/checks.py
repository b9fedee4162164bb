"""Deterministic success checks for the offline sites, and the `state` judge built on them.

A check is a small JSON rule (docs/gui.md, "Success checks"):

    {"all": [{"state": "shop.orders[-1].items[*].product_id", "contains": "p-017"},
             {"answer": {"number": 1889}}]}

- `{"all": [...]}`, `{"any": [...]}`, `{"not": check}` combine checks.
- `{"state": PATH, OP: value, ...}` reads the sites' hidden state; every OP must hold.
- `{"answer": {MATCHER: value, ...}}` matches the agent's `done` answer; every MATCHER must hold.

Malformed checks raise `CheckError` (naming where), so a typo never grades as a plain failure.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchard.gui.types import JudgeInput, Verdict


class CheckError(ValueError):
    """The check itself is malformed, or cannot be evaluated (e.g. no state to read)."""


# ---------------------------------------------------------------------- paths

_SEGMENT = re.compile(r"([A-Za-z0-9_-]+)((?:\[[^\]]*\])*)")
_BRACKET = re.compile(r"\[([^\]]*)\]")
_INDEX = re.compile(r"-?\d+")
_FILTER = re.compile(r"\?([A-Za-z0-9_-]+)(!?=)(.*)")


@dataclass(frozen=True)
class _Step:
    kind: str  # "key", "index", "all" or "filter"
    key: str = ""
    index: int = 0
    value: str = ""
    negate: bool = False


def parse_path(path: str) -> list[_Step]:
    """`shop.cart[?product_id=p-017][0].qty` -> steps; raises CheckError on bad syntax."""
    if not isinstance(path, str) or not path:
        raise CheckError(f"a state path must be a non-empty string, not {path!r}")
    steps: list[_Step] = []
    for part in path.split("."):
        m = _SEGMENT.fullmatch(part)
        if m is None:
            raise CheckError(f"bad segment {part!r} in state path {path!r}")
        steps.append(_Step("key", key=m.group(1)))
        for inner in _BRACKET.findall(m.group(2)):
            if inner == "*":
                steps.append(_Step("all"))
            elif _INDEX.fullmatch(inner):
                steps.append(_Step("index", index=int(inner)))
            elif f := _FILTER.fullmatch(inner):
                steps.append(
                    _Step("filter", key=f.group(1), value=f.group(3), negate=f.group(2) == "!=")
                )
            else:
                raise CheckError(
                    f"bad selector [{inner}] in state path {path!r}: use [N], [-N], [*] "
                    "or [?key=value]"
                )
    return steps


class _Missing(Exception):
    """The path does not lead anywhere in this state (a failed condition, not a bad check)."""


def _scalar_text(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def resolve(state: Any, path: str) -> Any:
    """The value at `path`. After `[*]` or a filter the result is the list of all matches,
    and later `.key` steps map over it; `[N]` after them picks the N-th match."""
    value, multi = state, False
    where = ""
    for step in parse_path(path):
        if step.kind == "key":
            where += ("." if where else "") + step.key
            if multi:
                value = [v[step.key] for v in value if isinstance(v, dict) and step.key in v]
            elif isinstance(value, dict) and step.key in value:
                value = value[step.key]
            else:
                keys = sorted(value) if isinstance(value, dict) else None
                hint = f" (keys: {', '.join(keys)})" if keys is not None else ""
                raise _Missing(f"{where}: no such key{hint}")
        elif step.kind == "index":
            where += f"[{step.index}]"
            if not isinstance(value, list) or not -len(value) <= step.index < len(value):
                n = len(value) if isinstance(value, list) else "not a list"
                raise _Missing(f"{where}: no such item ({n})")
            value, multi = value[step.index], False
        else:
            where += "[*]" if step.kind == "all" else f"[?{step.key}={step.value}]"
            items = _flatten(value) if multi else value
            if not isinstance(items, list):
                raise _Missing(f"{where}: not a list")
            if step.kind == "filter":
                items = [
                    v
                    for v in items
                    if isinstance(v, dict)
                    and step.key in v
                    and (_scalar_text(v[step.key]) == step.value) != step.negate
                ]
            value, multi = items, True
    return value


def _flatten(values: list[Any]) -> list[Any]:
    out: list[Any] = []
    for v in values:  # lists are spliced in; matches that are not lists stay as they are
        if isinstance(v, list):
            out.extend(v)
        else:
            out.append(v)
    return out


# ---------------------------------------------------------------------- comparisons


def normalize(text: Any) -> str:
    """Case-, width- and punctuation-insensitive text: `"  Port-Aldrin!"` -> `port aldrin`."""
    s = unicodedata.normalize("NFKC", str(text)).casefold()
    s = re.sub(r"[^\w]+", " ", s)
    return " ".join(s.split())


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def numbers_in(text: str) -> list[float]:
    """Every number written in `text`: `"$1,889.50 and 3"` -> [1889.5, 3.0]."""
    out = []
    for m in _NUMBER.findall(text):
        try:
            out.append(float(m.replace(",", "")))
        except ValueError:
            continue
    return out


def _num(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int | float):
        return float(v)
    if isinstance(v, str):
        found = numbers_in(v)
        return found[0] if len(found) == 1 else None
    return None


def _same(actual: Any, expected: Any) -> bool:
    """Equality for `contains`: text ignores case and punctuation, dicts match as subsets."""
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(
            k in actual and _same(actual[k], v) for k, v in expected.items()
        )
    if isinstance(expected, str) and isinstance(actual, str):
        return normalize(actual) == normalize(expected)
    a, e = _num(actual), _num(expected)
    if a is not None and e is not None and not isinstance(actual, str):
        return math.isclose(a, e, abs_tol=1e-9)
    return bool(actual == expected)


def _contains(actual: Any, expected: Any) -> bool:
    if isinstance(actual, list):
        return any(_same(a, expected) for a in actual)
    if isinstance(actual, str):
        return normalize(expected) in normalize(actual)
    if isinstance(actual, dict) and isinstance(expected, str):
        return expected in actual
    return False


def _numeric(op: str) -> Callable[[Any, Any], bool]:
    cmp: dict[str, Callable[[float, float], bool]] = {
        "gt": lambda a, e: a > e,
        "gte": lambda a, e: a >= e,
        "lt": lambda a, e: a < e,
        "lte": lambda a, e: a <= e,
    }

    def test(actual: Any, expected: Any) -> bool:
        a = _num(actual)
        return a is not None and cmp[op](a, float(expected))

    return test


def _len(actual: Any, expected: Any) -> bool:
    if not isinstance(actual, list | str | dict):
        return False
    n = len(actual)
    if isinstance(expected, int):
        return n == expected
    return all(STATE_OPS[op](n, v) for op, v in expected.items())


def _approx(actual: Any, expected: Any, tol: float) -> bool:
    a = _num(actual)
    return a is not None and abs(a - float(expected)) <= tol


STATE_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "eq": lambda a, e: _same(a, e) if not isinstance(e, list) else a == e,
    "ne": lambda a, e: not _same(a, e),
    "ieq": lambda a, e: isinstance(a, str) and normalize(a) == normalize(e),
    "contains": _contains,
    "contains_all": lambda a, e: all(_contains(a, x) for x in e),
    "not_contains": lambda a, e: not _contains(a, e),
    "in": lambda a, e: any(_same(a, x) for x in e),
    "len": _len,
    "gt": _numeric("gt"),
    "gte": _numeric("gte"),
    "lt": _numeric("lt"),
    "lte": _numeric("lte"),
    "matches": lambda a, e: isinstance(a, str) and re.search(e, a, re.IGNORECASE) is not None,
}
# Operators that take extra keys or no comparison at all.
_STATE_EXTRA = {"approx", "tol", "exists"}
_NUMERIC_OPS = {"gt", "gte", "lt", "lte", "approx", "tol"}
ANSWER_MATCHERS = {
    "exact",
    "contains",
    "one_of",
    "number",
    "tol",
    "rel_tol",
    "regex",
    "not_contains",
}


# ---------------------------------------------------------------------- validation


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def validate(check: Any, where: str = "check") -> None:
    """Raise CheckError (naming where) unless `check` is a well-formed check."""
    if not isinstance(check, dict) or not check:
        raise CheckError(f"{where}: a check is a non-empty object, not {check!r}")
    if "all" in check or "any" in check:
        kind = "all" if "all" in check else "any"
        if len(check) != 1 or not isinstance(check[kind], list) or not check[kind]:
            raise CheckError(f"{where}: {kind!r} takes a non-empty list of checks, alone")
        for i, sub in enumerate(check[kind]):
            validate(sub, f"{where}.{kind}[{i}]")
    elif "not" in check:
        if len(check) != 1:
            raise CheckError(f"{where}: 'not' takes one check, alone")
        validate(check["not"], f"{where}.not")
    elif "state" in check:
        _validate_state(check, where)
    elif "answer" in check:
        _validate_answer(check, where)
    else:
        raise CheckError(
            f"{where}: unknown check {sorted(check)}; use all, any, not, state or answer"
        )


def _validate_state(check: dict[str, Any], where: str) -> None:
    try:
        parse_path(check["state"])
    except CheckError as e:
        raise CheckError(f"{where}: {e}") from None
    ops = set(check) - {"state"}
    unknown = ops - set(STATE_OPS) - _STATE_EXTRA
    if unknown:
        raise CheckError(
            f"{where}: unknown operator(s) {sorted(unknown)}; known: "
            f"{sorted(set(STATE_OPS) | {'approx', 'exists'})}"
        )
    if "tol" in ops and "approx" not in ops:
        raise CheckError(f"{where}: 'tol' goes with 'approx'")
    if not ops:
        raise CheckError(f"{where}: a state check needs at least one operator")
    for op in ops & _NUMERIC_OPS:
        if not _is_number(check[op]):
            raise CheckError(f"{where}: {op!r} takes a number, not {check[op]!r}")
    for op in ops & {"contains_all", "in"}:
        if not isinstance(check[op], list):
            raise CheckError(f"{where}: {op!r} takes a list, not {check[op]!r}")
    if "exists" in ops and not isinstance(check["exists"], bool):
        raise CheckError(f"{where}: 'exists' takes true or false")
    if "len" in ops:
        n = check["len"]
        ok = (isinstance(n, int) and not isinstance(n, bool)) or (
            isinstance(n, dict)
            and n
            and set(n) <= {"gt", "gte", "lt", "lte"}
            and all(_is_number(v) for v in n.values())
        )
        if not ok:
            raise CheckError(f"{where}: 'len' takes an integer or e.g. {{'gte': 1}}, not {n!r}")
    for op in ops & {"matches", "ieq"}:
        if not isinstance(check[op], str):
            raise CheckError(f"{where}: {op!r} takes a string")
    if "matches" in ops:
        _compile(check["matches"], where)


def _compile(pattern: str, where: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern, re.IGNORECASE)
    except re.error as e:
        raise CheckError(f"{where}: bad regular expression {pattern!r}: {e}") from None


def _validate_answer(check: dict[str, Any], where: str) -> None:
    spec = check["answer"]
    if len(check) != 1 or not isinstance(spec, dict) or not spec:
        raise CheckError(f"{where}: 'answer' takes one object of matchers, alone")
    unknown = set(spec) - ANSWER_MATCHERS
    if unknown:
        raise CheckError(
            f"{where}: unknown answer matcher(s) {sorted(unknown)}; known: "
            f"{sorted(ANSWER_MATCHERS - {'tol', 'rel_tol'})}"
        )
    if not set(spec) - {"tol", "rel_tol"}:
        raise CheckError(f"{where}: an answer check needs a matcher")
    for key in ("number", "tol", "rel_tol"):
        if key in spec and not _is_number(spec[key]):
            raise CheckError(f"{where}: answer {key!r} takes a number, not {spec[key]!r}")
    if ("tol" in spec or "rel_tol" in spec) and "number" not in spec:
        raise CheckError(f"{where}: 'tol'/'rel_tol' go with 'number'")
    for key in ("exact", "regex"):
        if key in spec and not isinstance(spec[key], str):
            raise CheckError(f"{where}: answer {key!r} takes a string")
    for key in ("contains", "not_contains"):
        v = spec.get(key, "")
        if not (isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v))):
            raise CheckError(f"{where}: answer {key!r} takes a string or a list of strings")
    if "one_of" in spec and not (
        isinstance(spec["one_of"], list)
        and spec["one_of"]
        and all(isinstance(x, str) for x in spec["one_of"])
    ):
        raise CheckError(f"{where}: answer 'one_of' takes a non-empty list of strings")
    if "regex" in spec:
        _compile(spec["regex"], where)


def uses_state(check: dict[str, Any]) -> bool:
    """True if any part of the (valid) check reads the sites' state."""
    if "state" in check:
        return True
    subs = check.get("all") or check.get("any") or ([check["not"]] if "not" in check else [])
    return any(uses_state(c) for c in subs)


# ---------------------------------------------------------------------- evaluation


def evaluate(
    check: dict[str, Any], state: dict[str, Any] | None, answer: str | None
) -> tuple[bool, str]:
    """(success, reason). Raises CheckError when the check is malformed or needs missing state."""
    validate(check)
    if state is None and uses_state(check):
        raise CheckError("the check reads the sites' state, but no state was given")
    return _eval(check, state or {}, answer)


def _eval(check: dict[str, Any], state: dict[str, Any], answer: str | None) -> tuple[bool, str]:
    if "all" in check:
        results = [_eval(c, state, answer) for c in check["all"]]
        failed = [r for ok, r in results if not ok]
        if failed:
            return False, "; ".join(failed)
        return True, "; ".join(r for _, r in results)
    if "any" in check:
        results = [_eval(c, state, answer) for c in check["any"]]
        passed = [r for ok, r in results if ok]
        if passed:
            return True, passed[0]
        return False, "none of: " + " | ".join(r for _, r in results)
    if "not" in check:
        ok, reason = _eval(check["not"], state, answer)
        return not ok, ("NOT " if ok else "not ") + f"({reason})"
    if "state" in check:
        return _eval_state(check, state)
    return _eval_answer(check["answer"], answer)


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 120 else text[:117] + "..."


def _eval_state(check: dict[str, Any], state: dict[str, Any]) -> tuple[bool, str]:
    path = check["state"]
    try:
        value = resolve(state, path)
    except _Missing as e:
        if check.get("exists") is False:
            return True, f"{path} does not exist"
        return False, f"{path}: missing ({e})"
    if check.get("exists") is False:
        return False, f"{path} exists ({_show(value)})"
    for op, expected in check.items():
        if op in ("state", "exists", "tol"):
            continue
        if op == "approx":
            ok = _approx(value, expected, float(check.get("tol", 0.01)))
        else:
            ok = STATE_OPS[op](value, expected)
        if not ok:
            return False, f"{path} = {_show(value)}, expected {op} {_show(expected)}"
    return True, f"{path} = {_show(value)} ok"


def _eval_answer(spec: dict[str, Any], answer: str | None) -> tuple[bool, str]:
    if answer is None or not answer.strip():
        return False, "no answer was given"
    got = normalize(answer)
    shown = _show(answer)
    if "exact" in spec and got != normalize(spec["exact"]):
        return False, f"answer {shown} is not {spec['exact']!r}"
    if "one_of" in spec and got not in {normalize(x) for x in spec["one_of"]}:
        return False, f"answer {shown} is none of {spec['one_of']!r}"
    for key, want in (("contains", True), ("not_contains", False)):
        if key in spec:
            needles = [spec[key]] if isinstance(spec[key], str) else spec[key]
            for needle in needles:
                if (f" {normalize(needle)} " in f" {got} ") != want:
                    return False, f"answer {shown} {'lacks' if want else 'has'} {needle!r}"
    if "regex" in spec and not re.search(spec["regex"], answer, re.IGNORECASE):
        return False, f"answer {shown} does not match /{spec['regex']}/"
    if "number" in spec:
        target = float(spec["number"])
        tol = max(float(spec.get("tol", 0)), abs(target) * float(spec.get("rel_tol", 0)), 1e-9)
        found = numbers_in(answer)
        if not any(abs(x - target) <= tol for x in found):
            return False, f"answer {shown} has no number within {tol:g} of {target:g}"
    return True, f"answer {shown} matches"


class StateJudge:
    """The deterministic judge: the task's `check` on the sites' state and the answer.

    No check, no state for a check that reads state, or a malformed check give
    `success=None` (no score) with the reason, never a silent failure.
    """

    name = "state"

    def __call__(self, inp: JudgeInput) -> Verdict:
        return self.judge(inp)

    def judge(self, inp: JudgeInput) -> Verdict:
        check = inp.task.check
        if check is None:
            return Verdict(None, self.name, reason=f"task {inp.task.id} has no check")
        try:
            validate(check)
            if inp.state is None and uses_state(check):
                return Verdict(None, self.name, reason="no site state was captured")
            ok, reason = evaluate(check, inp.state, inp.answer)
        except CheckError as e:
            return Verdict(None, self.name, reason=f"bad check in task {inp.task.id}: {e}")
        return Verdict(ok, self.name, score=1.0 if ok else 0.0, reason=reason)
