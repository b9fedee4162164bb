"""Task loaders (WebVoyager, Online-Mind2Web, DeepShop, offline) and the shipped tasks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchard.gui.checks import validate
from orchard.gui.tasks import (
    TaskLoadError,
    load_deepshop,
    load_mind2web,
    load_orchard,
    load_solutions,
    load_tasks,
    load_webvoyager,
    sample_tasks,
)
from orchard.gui.types import SITE_HOSTS, SITES_PORT


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_webvoyager_jsonl(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "wv.jsonl",
        [
            {
                "web_name": "Allrecipes",
                "id": "Allrecipes--0",
                "ques": "Find a recipe",
                "web": "https://www.allrecipes.com/",
            },
            {
                "web_name": "GitHub",
                "id": "GitHub--3",
                "ques": "Find a repo",
                "web": "https://github.com/",
            },
        ],
    )
    tasks = load_webvoyager(path)
    assert [t.id for t in tasks] == ["Allrecipes--0", "GitHub--3"]
    assert tasks[0].source == "webvoyager" and tasks[0].web_name == "Allrecipes"
    assert tasks[0].check is None and load_tasks(path)[1].ques == "Find a repo"


def test_webvoyager_bad_rows_name_the_line(tmp_path: Path) -> None:
    good = {"web_name": "A", "id": "A--0", "ques": "q", "web": "https://a.example/"}
    path = tmp_path / "wv.jsonl"
    path.write_text(json.dumps(good) + "\n\n" + json.dumps({**good, "id": "A--1", "ques": ""}))
    with pytest.raises(TaskLoadError, match=r"wv\.jsonl:line 3: missing 'ques'"):
        load_webvoyager(path)
    path.write_text(json.dumps(good) + "\n{not json\n")
    with pytest.raises(TaskLoadError, match=r"wv\.jsonl:line 2: not valid JSON"):
        load_webvoyager(path)
    write_jsonl(path, [good, good])
    with pytest.raises(TaskLoadError, match="duplicate task id\\(s\\) 'A--0'"):
        load_webvoyager(path)
    write_jsonl(path, [good, ["a", "list"]])
    with pytest.raises(TaskLoadError, match=r"line 2: a task is a JSON object"):
        load_webvoyager(path)
    with pytest.raises(TaskLoadError, match="cannot read"):
        load_webvoyager(tmp_path / "absent.jsonl")


def test_online_mind2web_json_list(tmp_path: Path) -> None:
    rows: list[dict[str, Any]] = [
        {
            "task_id": "abc123",
            "confirmed_task": "Find the cheapest flight",
            "website": "https://www.kayak.com/",
            "reference_length": 8,
            "level": "medium",
        },
        {
            "task_id": "def456",
            "confirmed_task": "Open the docs",
            "website": "docs.python.org",
            "reference_length": 3,
            "level": "easy",
        },
    ]
    path = tmp_path / "Online_Mind2Web.json"
    path.write_text(json.dumps(rows, indent=1))
    tasks = load_mind2web(path)
    assert [(t.id, t.category, t.source) for t in tasks] == [
        ("abc123", "medium", "mind2web"),
        ("def456", "easy", "mind2web"),
    ]
    assert tasks[1].web == "https://docs.python.org" and tasks[1].web_name == "docs.python.org"
    assert [t.id for t in load_tasks(path)] == ["abc123", "def456"]
    path.write_text(json.dumps([rows[0], {**rows[1], "confirmed_task": None}]))
    with pytest.raises(
        TaskLoadError, match=r"Online_Mind2Web\.json\[1\]: missing 'confirmed_task'"
    ):
        load_mind2web(path)
    path.write_text(json.dumps([{**rows[0], "reference_length": "long"}]))
    with pytest.raises(TaskLoadError, match=r"\[0\]: reference_length must be a positive integer"):
        load_mind2web(path)
    path.write_text(json.dumps(rows)[:-1])
    with pytest.raises(TaskLoadError, match="not a valid JSON list of tasks"):
        load_mind2web(path)
    path.write_text(json.dumps({"tasks": rows[:1]}))
    assert [t.id for t in load_mind2web(path)] == ["abc123"]


def test_deepshop_constraints_become_key_points(tmp_path: Path) -> None:
    rows: list[dict[str, Any]] = [
        {
            "id": "ds-1",
            "ques": "Buy red running shoes under $60, cheapest first",
            "web": "https://www.amazon.com/",
            "attribute": {"colour": "red", "type": "running"},
            "filter": ["price < 60"],
            "sort": "price ascending",
            "category": "fashion",
        },
        {
            "task_id": "ds-2",
            "query": "Find a 4-star coffee grinder",
            "website": "amazon.com",
            "attributes": None,
            "filters": {"rating": ">= 4"},
            "sorting": "",
        },
    ]
    path = write_jsonl(tmp_path / "deepshop.jsonl", rows)
    tasks = load_tasks(path)  # detected as DeepShop
    assert [t.source for t in tasks] == ["deepshop", "deepshop"]
    assert tasks[0].key_points == [
        "attribute: colour = red",
        "attribute: type = running",
        "filter: price < 60",
        "sort: price ascending",
    ]
    assert tasks[0].category == "fashion"
    assert (tasks[1].id, tasks[1].ques, tasks[1].web) == (
        "ds-2",
        "Find a 4-star coffee grinder",
        "https://amazon.com",
    )
    assert tasks[1].key_points == ["filter: rating = >= 4"]
    write_jsonl(path, [rows[0], {"id": "ds-3", "ques": "q"}])
    with pytest.raises(TaskLoadError, match=r"line 2: missing 'web' / 'website' / 'url'"):
        load_deepshop(path)
    write_jsonl(path, [{**rows[0], "filter": [True]}])
    with pytest.raises(TaskLoadError, match=r"line 1: cannot read the filter constraint True"):
        load_deepshop(path)


def test_orchard_rows_are_validated(tmp_path: Path) -> None:
    row = {
        "id": "x",
        "ques": "q",
        "web": "http://shop.localhost:8000/",
        "check": {"state": "shop.cart", "len": 1},
    }
    path = write_jsonl(tmp_path / "mine.jsonl", [row])
    assert load_tasks(path)[0].check == row["check"]
    write_jsonl(path, [row, {**row, "id": "y", "check": {"state": "shop.cart", "size": 1}}])
    with pytest.raises(TaskLoadError, match=r"line 2: check: unknown operator"):
        load_orchard(path)
    write_jsonl(path, [{**row, "answer": "42"}])
    with pytest.raises(TaskLoadError, match=r"line 1: unknown field\(s\) \['answer'\]"):
        load_orchard(path)
    with pytest.raises(TaskLoadError, match="unknown task source"):
        load_tasks(path, source="webarena")


def test_shipped_tasks() -> None:
    tasks = load_orchard()
    assert len(tasks) >= 30
    assert len({t.id for t in tasks}) == len(tasks)
    hosts = {f"http://{h}:{SITES_PORT}/": site for site, h in SITE_HOSTS.items()}
    per_site: dict[str, int] = {}
    for t in tasks:
        assert t.source == "orchard" and t.check is not None and t.ques
        validate(t.check)
        assert hosts[t.web] == t.web_name, t.id
        per_site[t.web_name] = per_site.get(t.web_name, 0) + 1
    assert set(per_site) == {"shop", "wiki", "mail"} and min(per_site.values()) >= 8
    shop_constrained = [t for t in tasks if t.category in ("shop-filter", "shop-sort")]
    assert len(shop_constrained) >= 8
    # Every task has a reference solution ending in `done`, mostly by URL.
    solutions = load_solutions()
    assert set(solutions) == {t.id for t in tasks}
    for tid, actions in solutions.items():
        assert actions[-1]["name"] == "done", tid
        assert {a["name"] for a in actions} <= {"goto_url", "done"}, tid


def test_sample_tasks_is_reproducible_and_spread() -> None:
    everything = sample_tasks()
    assert len(everything) == len(load_orchard())
    a, b = sample_tasks(8, seed=3), sample_tasks(8, seed=3)
    assert [t.id for t in a] == [t.id for t in b] and len({t.id for t in a}) == 8
    assert len({t.category for t in a}) == 8  # one per category before repeating any
    assert {t.web_name for t in sample_tasks(site="wiki")} == {"wiki"}
