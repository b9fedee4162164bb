"""The action space alone: schemas, validation and the text form (no browser needed)."""

from __future__ import annotations

import json

import pytest

from orchard.gui.actions import (
    ACTION_NAMES,
    ELEMENT_ACTIONS,
    TOOLS,
    ActionError,
    parse_action,
    parse_action_text,
)
from orchard.gui.types import Action


def test_every_action_has_a_tool_schema() -> None:
    names = [t["function"]["name"] for t in TOOLS]
    assert names == list(ACTION_NAMES)
    assert set(ACTION_NAMES) >= {
        "click", "write", "press_keys", "scroll", "wait", "done", "goto_url", "go_back",
        "drag", "hover", "new_tab", "switch_tab", "close_tab",
    } | ELEMENT_ACTIONS  # fmt: skip
    for tool in TOOLS:
        fn = tool["function"]
        assert tool["type"] == "function" and len(fn["description"]) > 15
        params = fn["parameters"]
        assert params["type"] == "object" and params["additionalProperties"] is False
        assert set(params["required"]) <= set(params["properties"])
        for p in params["properties"].values():
            assert p["description"]
    json.dumps(TOOLS)  # plain JSON, ready for a chat API


def test_defaults_and_coercion() -> None:
    assert parse_action("click", {"x": 500, "y": "300"}) == Action(
        "click", {"x": 500, "y": 300, "clicks": 1, "button": "left"}
    )
    assert parse_action("scroll", '{"direction": "DOWN"}').args == {
        "direction": "down",
        "amount": 0.5,
    }
    assert parse_action("press_keys", {"keys": "ctrl+a", "hotkey": True}).args == {
        "keys": ["Control", "a"],
        "hotkey": True,
        "presses": 1,
    }
    assert parse_action("press_keys", {"keys": ["enter"]}).args["keys"] == ["Enter"]
    assert parse_action("done", None).args == {"answer": ""}
    assert parse_action("go_back", "").args == {}


@pytest.mark.parametrize(
    ("name", "args", "needle"),
    [
        ("fly", {}, "unknown action 'fly'"),
        ("click", {"x": 5}, "missing required argument `y`"),
        ("click", {"x": "left", "y": 3}, "`x` must be a number"),
        ("click", {"x": 1001, "y": 3}, "out of range [0, 1000]"),
        ("click", {"x": -1, "y": 3}, "out of range"),
        ("click", {"x": 1.5, "y": 3}, "whole number"),
        ("click", {"x": True, "y": 3}, "must be a number"),
        ("click", {"x": 1, "y": 2, "z": 3}, "unknown argument(s) z"),
        ("click", {"x": 1, "y": 2, "button": "side"}, "one of left, right, middle"),
        ("click", "{not json", "not valid JSON"),
        ("click", "[1, 2]", "must be an object"),
        ("write", {"text": "a", "x": 5}, "both `x` and `y`"),
        ("press_keys", {"keys": []}, "non-empty list"),
        ("press_keys", {"keys": ["hyperspace"]}, "unknown key 'hyperspace'"),
        ("scroll", {"direction": "sideways"}, "one of up, down, left, right"),
        ("wait", {"seconds": 60}, "out of range"),
        ("goto_url", {"url": "file:///etc/passwd"}, "must start with http"),
        ("switch_tab", {"index": -1}, "must be >= 0"),
        ("click_element", {}, "missing required argument `id`"),
    ],
)
def test_invalid_actions_say_what_is_wrong(name: str, args: object, needle: str) -> None:
    with pytest.raises(ActionError) as e:
        parse_action(name, args)  # type: ignore[arg-type]
    assert needle in str(e.value)


def test_text_form() -> None:
    assert parse_action_text("click(x=500, y=300)") == parse_action("click", {"x": 500, "y": 300})
    assert parse_action_text("click(500, 300, 2)").args["clicks"] == 2
    assert parse_action_text("write(text='hi there')").args == {"text": "hi there"}
    assert parse_action_text("press_keys(keys=['ctrl', 'a'], hotkey=True);").args["keys"] == [
        "Control",
        "a",
    ]
    assert parse_action_text('done(answer="42")').args == {"answer": "42"}
    for bad, needle in [
        ("click x=5", "cannot read the action"),
        ("os.system('x')", "cannot read the action"),
        ("fly()", "unknown action"),
        ("click(x=__import__('os'), y=1)", "must be literals"),
        ("go_back(1)", "at most 0 arguments"),
        ("click(**{'x': 1})", "name=value"),
    ]:
        with pytest.raises(ActionError) as e:
            parse_action_text(bad)
        assert needle in str(e.value), bad
