"""The success-check language and the `state` judge (pure: no Docker, no browser)."""

from __future__ import annotations

from typing import Any

import pytest

from orchard.gui.checks import CheckError, StateJudge, evaluate, numbers_in, resolve, validate
from orchard.gui.types import JudgeInput, WebTask

STATE: dict[str, Any] = {
    "shop": {
        "cart": [
            {"product_id": "p-017", "qty": 2, "options": {"colour": "black"}},
            {"product_id": "p-003", "qty": 1, "options": {"colour": "red", "size": "42"}},
        ],
        "orders": [
            {"id": "O-1001", "items": [{"product_id": "p-040", "qty": 2}], "total": 46.64},
            {
                "id": "O-1002",
                "items": [{"product_id": "p-037", "qty": 1}, {"product_id": "p-040", "qty": 1}],
                "total": 59.48,
                "shipping": {"name": "Sam Rivera", "method": "express"},
            },
        ],
        "last_search": None,
    },
    "mail": {"messages": [{"id": "m-01", "starred": True}, {"id": "m-02", "starred": False}]},
}


def ok(check: dict[str, Any], answer: str | None = None) -> bool:
    return evaluate(check, STATE, answer)[0]


def test_paths_index_wildcard_and_filter() -> None:
    assert resolve(STATE, "shop.cart[-1].options.size") == "42"
    assert resolve(STATE, "shop.cart[*].product_id") == ["p-017", "p-003"]
    assert resolve(STATE, "shop.orders[*].items[*].product_id") == ["p-040", "p-037", "p-040"]
    assert resolve(STATE, "shop.cart[?product_id=p-003][0].qty") == 1
    assert resolve(STATE, "shop.cart[?product_id!=p-003][*].qty") == [2]
    assert resolve(STATE, "mail.messages[?starred=true][*].id") == ["m-01"]


def test_state_operators() -> None:
    assert ok({"state": "shop.cart", "len": 2})
    assert ok({"state": "shop.cart", "len": {"gte": 1, "lt": 3}})
    assert not ok({"state": "shop.cart", "len": 3})
    assert ok({"state": "shop.orders[-1].items[*].product_id", "contains": "p-037"})
    assert ok({"state": "shop.cart[*].product_id", "contains_all": ["p-003", "p-017"]})
    assert ok({"state": "shop.cart[*].product_id", "not_contains": "p-999"})
    assert ok({"state": "shop.cart[0].options", "eq": {"colour": "black"}})
    assert ok({"state": "shop.cart[*].qty", "eq": [2, 1]})
    assert not ok({"state": "shop.cart[*].qty", "eq": [1, 2]})
    assert ok({"state": "shop.orders[-1].shipping.name", "ieq": "sam  RIVERA"})
    assert ok({"state": "shop.orders[-1].shipping.name", "contains": "rivera"})
    assert ok({"state": "shop.orders[-1].shipping.method", "in": ["express", "standard"]})
    assert ok({"state": "shop.orders[-1].total", "gt": 59, "lte": 59.48})
    assert ok({"state": "shop.orders[-1].total", "approx": 59.5, "tol": 0.05})
    assert not ok({"state": "shop.orders[-1].total", "approx": 59.5})
    assert ok({"state": "shop.orders[-1].shipping.method", "matches": "^exp"})
    assert ok({"state": "shop.orders[-1].shipping.method", "ne": "standard"})
    assert ok({"state": "shop.last_search", "eq": None})


def test_missing_paths_fail_with_a_reason_unless_exists_false() -> None:
    good, reason = evaluate({"state": "shop.orders[5].total", "eq": 1}, STATE, None)
    assert not good and "orders[5]" in reason and "no such item" in reason
    good, reason = evaluate({"state": "shop.order", "len": 1}, STATE, None)
    assert not good and "keys: cart, last_search, orders" in reason
    assert ok({"state": "shop.coupon", "exists": False})
    assert not ok({"state": "shop.cart", "exists": False})
    assert ok({"state": "shop.cart", "exists": True})


def test_answer_matchers() -> None:
    assert ok({"answer": {"exact": "port aldrin"}}, "Port-Aldrin.")
    assert not ok({"answer": {"exact": "port aldrin"}}, "It is Port Aldrin")
    assert ok({"answer": {"contains": "Tomas Hale"}}, "It was tomas hale, in 1871")
    assert ok({"answer": {"contains": ["hale", "1871"]}}, "Tomas Hale in 1871")
    assert not ok({"answer": {"contains": "38"}}, "380 metres")  # whole words only
    assert ok({"answer": {"one_of": ["MRC", "Mereth crown"]}}, "mereth crown")
    assert ok({"answer": {"number": 18900}}, "About 18,900 people")
    assert ok({"answer": {"number": 149, "tol": 0.01}}, "$149.00")
    assert ok({"answer": {"number": 100, "rel_tol": 0.05}}, "roughly 96")
    assert not ok({"answer": {"number": 1889}}, "1888")
    assert ok({"answer": {"regex": r"0?7[:.]45"}}, "at 07:45")
    assert ok({"answer": {"contains": "Lysa", "not_contains": ["Kessa"]}}, "Lysa")
    assert not ok({"answer": {"contains": "Lysa", "not_contains": ["Kessa"]}}, "Lysa or Kessa")
    good, reason = evaluate({"answer": {"number": 1}}, STATE, None)
    assert not good and reason == "no answer was given"
    assert numbers_in("$1,889.50, -3 and .5") == [1889.5, -3.0, 0.5]


def test_combinators() -> None:
    yes = {"state": "shop.cart", "len": 2}
    no = {"answer": {"exact": "x"}}
    assert ok({"all": [yes, {"not": no}]}, "y")
    assert not ok({"all": [yes, no]}, "y")
    assert ok({"any": [no, yes]}, "y")
    good, reason = evaluate({"any": [no, no]}, STATE, "y")
    assert not good and reason.startswith("none of:")


@pytest.mark.parametrize(
    ("check", "message"),
    [
        ({}, "non-empty object"),
        ({"all": []}, "non-empty list"),
        ({"all": [{"state": "shop.cart", "len": 1}], "any": []}, "alone"),
        ({"bogus": 1}, "unknown check"),
        ({"state": "shop..cart", "len": 1}, "bad segment"),
        ({"state": "shop.cart[x]", "len": 1}, "bad selector [x]"),
        ({"state": "shop.cart", "equals": 1}, "unknown operator"),
        ({"state": "shop.cart"}, "at least one operator"),
        ({"state": "shop.total", "gt": "5"}, "takes a number"),
        ({"state": "shop.total", "tol": 1}, "'tol' goes with 'approx'"),
        ({"state": "shop.cart", "len": "2"}, "'len' takes"),
        ({"state": "shop.cart", "in": "p-1"}, "takes a list"),
        ({"state": "shop.q", "matches": "("}, "bad regular expression"),
        ({"answer": "Paris"}, "one object of matchers"),
        ({"answer": {"fuzzy": "x"}}, "unknown answer matcher"),
        ({"answer": {"tol": 1}}, "needs a matcher"),
        ({"answer": {"number": "12"}}, "takes a number"),
        ({"answer": {"one_of": []}}, "non-empty list"),
    ],
)
def test_malformed_checks_raise_naming_where(check: dict[str, Any], message: str) -> None:
    with pytest.raises(CheckError, match=message.replace("[", r"\[").replace("(", r"\(")):
        validate({"all": [{"answer": {"exact": "x"}}, check]})
    with pytest.raises(CheckError, match=r"check\.all\[1\]"):
        validate({"all": [{"answer": {"exact": "x"}}, check]})


def test_evaluate_needs_state_only_for_state_checks() -> None:
    with pytest.raises(CheckError, match="no state"):
        evaluate({"state": "shop.cart", "len": 0}, None, None)
    assert evaluate({"answer": {"number": 3}}, None, "3") == (True, "answer '3' matches")


def _input(check: dict[str, Any] | None, state: dict[str, Any] | None, answer: str | None) -> Any:
    task = WebTask(id="t-1", ques="q", web="http://shop.localhost:8000/", check=check)
    return JudgeInput(task=task, actions=[], answer=answer, screenshots=[], state=state)


def test_state_judge_scores_and_refuses_to_guess() -> None:
    judge = StateJudge()
    assert judge.name == "state"
    check = {"all": [{"state": "shop.cart", "len": 2}, {"answer": {"number": 7}}]}
    v = judge(_input(check, STATE, "7 items"))
    assert (v.success, v.score, v.judge) == (True, 1.0, "state")
    v = judge(_input(check, STATE, "8"))
    assert (v.success, v.score) == (False, 0.0) and "no number within" in v.reason
    # No score, with the reason, where a plain False would be a lie.
    for inp, why in [
        (_input(None, STATE, "7"), "has no check"),
        (_input(check, None, "7"), "no site state"),
        (_input({"state": "shop.cart", "size": 2}, STATE, "7"), "unknown operator"),
    ]:
        v = judge(inp)
        assert v.success is None and v.score is None and not v.scored and why in v.reason
    # An answer-only check needs no state.
    assert judge(_input({"answer": {"number": 7}}, None, "7")).success is True
