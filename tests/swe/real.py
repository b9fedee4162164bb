"""Shipped real rows for the tests of the harness and the adapters (`load_tasks("real")`)."""

from __future__ import annotations

from orchard.swe.images import build_images
from orchard.swe.tasks import Task, real_tasks

# toolz's suite runs in about a second: the cheapest real row to drive end to end.
FAST_REPO = "pypi/toolz"


def real_row(repo: str = FAST_REPO, index: int = 0) -> Task:
    """A shipped row of `repo`, its image built as on a fresh clone (sdist and pinned
    wheels from PyPI or the cache; content-addressed, so built once and reused)."""
    task = [t for t in real_tasks() if t.repo == repo][index]
    build_images([task])
    return task


def gold_command(task: Task) -> str:
    """A bash command that applies the row's gold patch in its repository."""
    return f"cat > /tmp/gold.diff <<'EOF_GOLD'\n{task.patch}EOF_GOLD\ngit apply /tmp/gold.diff"
