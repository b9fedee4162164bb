"""Web task loaders: the shipped offline tasks, WebVoyager, Online-Mind2Web and DeepShop.

The public sets are not shipped (they need internet access to run); users point these
loaders at their own copies. Loaders are liberal in what they accept, and a bad row raises
`TaskLoadError` naming the file and the line (JSONL) or index (JSON list).
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from orchard.gui.checks import CheckError, validate
from orchard.gui.types import WebTask

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
ORCHARD_TASKS = TASKS_DIR / "orchard.jsonl"
SOLUTIONS = TASKS_DIR / "solutions.jsonl"


class TaskLoadError(ValueError):
    """A task file or one of its rows is unusable; the message names the file and row."""


# ---------------------------------------------------------------------- reading rows


def read_rows(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(where, row) pairs from a JSONL file, a JSON list, or a JSON object holding a list
    under `tasks`/`data`; `where` is `file:line N` or `file[index]` for error messages."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise TaskLoadError(f"{path}: cannot read: {e}") from None
    doc = _whole_document(text)
    if doc is not None:
        rows = [(f"{path}[{i}]", row) for i, row in enumerate(doc)]
    elif text.lstrip().startswith("["):
        raise TaskLoadError(f"{path}: not a valid JSON list of tasks")
    else:
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append((f"{path}:line {n}", json.loads(line)))
            except json.JSONDecodeError as e:
                raise TaskLoadError(f"{path}:line {n}: not valid JSON: {e}") from None
    for where, row in rows:
        if not isinstance(row, dict):
            raise TaskLoadError(f"{where}: a task is a JSON object, not {type(row).__name__}")
    return rows


def _whole_document(text: str) -> list[Any] | None:
    """The task list when the file is one JSON list (or `{"tasks": [...]}`), else None."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return None
    if isinstance(doc, dict):
        doc = next((doc[k] for k in ("tasks", "data") if isinstance(doc.get(k), list)), None)
    return doc if isinstance(doc, list) else None


def _pick(row: dict[str, Any], where: str, *names: str, required: bool = True) -> str:
    for name in names:
        value = row.get(name)
        if value is not None and str(value).strip():
            return str(value).strip()
    if required:
        raise TaskLoadError(f"{where}: missing {' / '.join(repr(n) for n in names)}")
    return ""


def _url(web: str) -> str:
    """Mind2Web lists bare sites (`amazon.com`); a browser needs a scheme."""
    return web if "://" in web else "https://" + web.lstrip("/")


def _host(url: str) -> str:
    return urlsplit(url).hostname or ""


def _unique(tasks: list[WebTask], path: Path) -> list[WebTask]:
    repeated = sorted(i for i, n in Counter(t.id for t in tasks).items() if n > 1)
    if repeated:
        raise TaskLoadError(f"{path}: duplicate task id(s) {', '.join(map(repr, repeated))}")
    return tasks


# ---------------------------------------------------------------------- formats


def load_webvoyager(path: Path) -> list[WebTask]:
    """WebVoyager JSONL: `web_name`, `id`, `ques`, `web` (reference answers are separate)."""
    tasks = []
    for where, row in read_rows(path):
        web = _url(_pick(row, where, "web"))
        tasks.append(
            WebTask(
                id=_pick(row, where, "id"),
                ques=_pick(row, where, "ques"),
                web=web,
                web_name=_pick(row, where, "web_name", required=False) or _host(web),
                source="webvoyager",
                category=_pick(row, where, "web_name", required=False),
            )
        )
    return _unique(tasks, Path(path))


def load_mind2web(path: Path) -> list[WebTask]:
    """Online-Mind2Web: `task_id`, `confirmed_task`, `website`, `reference_length`, `level`."""
    tasks = []
    for where, row in read_rows(path):
        web = _url(_pick(row, where, "website", "web", "url"))
        length = row.get("reference_length")
        if length is not None and not (isinstance(length, int) and length > 0):
            raise TaskLoadError(f"{where}: reference_length must be a positive integer")
        tasks.append(
            WebTask(
                id=_pick(row, where, "task_id", "id"),
                ques=_pick(row, where, "confirmed_task", "task", "ques"),
                web=web,
                web_name=_host(web),
                source="mind2web",
                category=_pick(row, where, "level", required=False),
            )
        )
    return _unique(tasks, Path(path))


# DeepShop keeps its constraints in several shapes over versions; all become key points.
_CONSTRAINT_KEYS = {
    "attribute": "attribute",
    "attributes": "attribute",
    "filter": "filter",
    "filters": "filter",
    "sort": "sort",
    "sorting": "sort",
    "constraints": "constraint",
}


def _constraint_points(kind: str, value: Any, where: str) -> list[str]:
    if value is None or value == "" or value == [] or value == {}:
        return []
    if isinstance(value, str | int | float) and not isinstance(value, bool):
        return [f"{kind}: {value}"]
    if isinstance(value, list):
        return [p for v in value for p in _constraint_points(kind, v, where)]
    if isinstance(value, dict):
        return [f"{kind}: {k} = {v}" for k, v in value.items() if v not in (None, "")]
    raise TaskLoadError(f"{where}: cannot read the {kind} constraint {value!r}")


def load_deepshop(path: Path) -> list[WebTask]:
    """DeepShop: `id`/`task_id`, `ques`/`query`, `web`/`website`, and attribute/filter/sort
    constraints (string, list or object each), which become `key_points`."""
    tasks = []
    for where, row in read_rows(path):
        web = _url(_pick(row, where, "web", "website", "url"))
        points: list[str] = []
        for key, kind in _CONSTRAINT_KEYS.items():
            points += _constraint_points(kind, row.get(key), where)
        tasks.append(
            WebTask(
                id=_pick(row, where, "id", "task_id"),
                ques=_pick(row, where, "ques", "query", "task", "instruction"),
                web=web,
                web_name=_pick(row, where, "web_name", required=False) or _host(web),
                source="deepshop",
                category=_pick(row, where, "category", "difficulty", required=False),
                key_points=points,
            )
        )
    return _unique(tasks, Path(path))


def load_orchard(path: Path = ORCHARD_TASKS) -> list[WebTask]:
    """Offline tasks: WebVoyager-style rows plus `category`, `check`, `reference_answer`,
    `max_steps`. Every check is validated here, so a typo fails at load time."""
    tasks = []
    for where, row in read_rows(path):
        unknown = set(row) - set(WebTask.__dataclass_fields__)
        if unknown:
            raise TaskLoadError(f"{where}: unknown field(s) {sorted(unknown)}")
        for name in ("id", "ques", "web"):
            _pick(row, where, name)
        if row.get("check") is not None:
            try:
                validate(row["check"])
            except CheckError as e:
                raise TaskLoadError(f"{where}: {e}") from None
        try:
            task = WebTask.from_dict({"source": "orchard", **row})
        except TypeError as e:
            raise TaskLoadError(f"{where}: {e}") from None
        tasks.append(task)
    return _unique(tasks, Path(path))


LOADERS: dict[str, Callable[[Path], list[WebTask]]] = {
    "orchard": load_orchard,
    "webvoyager": load_webvoyager,
    "mind2web": load_mind2web,
    "deepshop": load_deepshop,
}


def detect_source(rows: Iterable[dict[str, Any]]) -> str:
    """Guess a file's format from its first row's fields."""
    first = next(iter(rows), {})
    if "check" in first or first.get("source") == "orchard":
        return "orchard"
    if "confirmed_task" in first:
        return "mind2web"
    if "query" in first or any(k in first for k in _CONSTRAINT_KEYS):
        return "deepshop"
    return "webvoyager"


def load_tasks(path: Path, source: str | None = None) -> list[WebTask]:
    """Load a task file in any known format (`source` forces one, else it is detected)."""
    if source is None:
        source = detect_source(row for _, row in read_rows(path))
    if source not in LOADERS:
        raise TaskLoadError(f"unknown task source {source!r}; known: {sorted(LOADERS)}")
    return LOADERS[source](Path(path))


def sample_tasks(n: int | None = None, *, seed: int = 0, site: str | None = None) -> list[WebTask]:
    """The shipped offline tasks (all, or `n` drawn reproducibly, spread over categories);
    `site` keeps those starting on one site (`shop`, `wiki`, `mail`)."""
    tasks = load_orchard()
    if site is not None:
        tasks = [t for t in tasks if t.web_name == site]
    if n is None or n >= len(tasks):
        return tasks
    rng = random.Random(seed)
    by_cat: dict[str, list[WebTask]] = {}
    for t in tasks:
        by_cat.setdefault(t.category, []).append(t)
    for group in by_cat.values():
        rng.shuffle(group)
    picked: list[WebTask] = []
    while len(picked) < n:  # round-robin over categories, so a sample covers them all
        for cat in sorted(by_cat):
            if by_cat[cat] and len(picked) < n:
                picked.append(by_cat[cat].pop())
    return picked


def select_tasks(
    tasks: str, ids: Sequence[str] | None = None, categories: Sequence[str] | None = None
) -> list[WebTask]:
    """`sample` (the shipped offline tasks) or a task file, narrowed to `ids` (an unknown one
    is a ValueError) and `categories`. A file that cannot be read raises as `load_tasks` does."""
    chosen = sample_tasks() if tasks == "sample" else load_tasks(Path(tasks))
    if ids:
        known = {t.id for t in chosen}
        missing = [i for i in ids if i not in known]
        if missing:
            raise ValueError(f"no task {', '.join(missing)} in {tasks}")
        chosen = [t for t in chosen if t.id in set(ids)]
    if categories:
        chosen = [t for t in chosen if t.category in categories]
    return chosen


def load_solutions(path: Path = SOLUTIONS) -> dict[str, list[dict[str, Any]]]:
    """Reference solutions of the shipped tasks: task id -> actions (`{"name", "args"}`)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for where, row in read_rows(path):
        actions = row.get("actions")
        if not isinstance(row.get("id"), str) or not isinstance(actions, list):
            raise TaskLoadError(f"{where}: a solution is {{'id': str, 'actions': [...]}}")
        out[row["id"]] = actions
    return out
