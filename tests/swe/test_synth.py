"""`orchard swe synth` end to end on a real PyPI project (docs/swe.md, "Synthesized tasks").

more-itertools 11.2.1: its sdist ships `tests/` (stdlib unittest, no test dependencies).
The sdist is downloaded once into the project cache (keyed by name+version) and reused.
Bounded: two modifiers, a few candidates, two kept tasks, two sandboxes at a time. Real
docker sandboxes through the embedded service; the image, sandboxes and snapshots the test
made are gone at the end.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchard import Orchard
from orchard.env import images as env_images
from orchard.swe import layers
from orchard.swe.grading import Prediction, grade
from orchard.swe.prepare import Preparer
from orchard.swe.synth import image, rows, source
from orchard.swe.synth.pipeline import Counts, state_path, synthesize
from orchard.swe.tasks import load_tasks, real_tasks
from tests.swe.conftest import embedded_client

SPEC = "more-itertools==11.2.1"
MODIFIERS = ["func_pm_remove_cond", "func_pm_op_change"]
LABELS = {"swe": "synth-test"}


@pytest.fixture(scope="module")
def project() -> source.Project:
    return source.fetch(SPEC)


@pytest.fixture(scope="module")
def client(
    docker_ready: None, agent_binary: Path, pytestconfig: pytest.Config
) -> Iterator[Orchard]:
    with embedded_client(pytestconfig, agent_binary, "orch-synth-", "docker") as c:
        yield c
        assert c.snapshots.list() == []  # the prepared snapshot and the gradings' are gone
        assert c.sandboxes.list(labels={"swe": "synth"}) == []
        assert c.sandboxes.list(labels=LABELS) == []


@pytest.fixture(scope="module")
def synthesized(
    client: Orchard, project: source.Project, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, Counts, str]]:
    tag, _ = image.image_tag(project.root, project.slug, layers.base_image())
    made = not env_images.image_exists(tag)
    out = tmp_path_factory.mktemp("synth") / "tasks.jsonl"
    try:
        counts = synthesize(
            client, SPEC, out, n=2, modifiers=MODIFIERS, seed=0, jobs=2, max_candidates=6
        )
        yield out, counts, tag
    finally:
        if made:
            image.remove_image(tag)
            assert not env_images.image_exists(tag)
        names = subprocess.run(
            ["docker", "ps", "-aq", "--filter", "name=orchard-swe-build-"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.split()
        assert names == []  # no build container left


def test_rows_are_valid_tasks(synthesized: tuple[Path, Counts, str]) -> None:
    out, counts, tag = synthesized
    assert counts.kept == 2, counts.summary()
    assert counts.tried >= 2 and counts.candidates >= counts.tried
    assert sum(counts.dropped.values()) == counts.tried - counts.kept
    tasks = load_tasks(out)  # what `orchard swe run --tasks` reads
    assert len(tasks) == 2 and len({t.instance_id for t in tasks}) == 2
    for t in tasks:
        assert t.instance_id.startswith("more-itertools__11.2.1.")
        assert t.repo == "pypi/more-itertools" and t.image == tag and t.version == "11.2.1"
        assert t.FAIL_TO_PASS and t.PASS_TO_PASS
        assert not set(t.FAIL_TO_PASS) & set(t.PASS_TO_PASS)
        assert len(t.base_commit) == 40 and t.base_commit in t.eval_script
        assert t.patch.startswith("diff --git a/more_itertools/") and t.setup_script
        assert t.model_extra and t.model_extra["synth"]["strategy"] in MODIFIERS
        assert t.model_extra["synth"]["seed"] == 0
        # No statement leaks its patch: no changed line, no diff header.
        assert rows.leaks(t.problem_statement, t.patch) == []
        assert "diff --git" not in t.problem_statement and "@@" not in t.problem_statement
        assert t.FAIL_TO_PASS[0] in t.problem_statement


def test_every_kept_row_was_graded(synthesized: tuple[Path, Counts, str]) -> None:
    """Each kept row passed the harness's grading (gold resolves, empty does not) in the run."""
    out, _, _ = synthesized
    recs = [json.loads(x) for x in state_path(out).read_text().splitlines()[1:]]
    kept = {r["id"] for r in recs if r["status"] == "kept"}
    assert {t.instance_id.rsplit(".", 1)[-1] for t in load_tasks(out)} == kept


def test_shipped_row_gold_resolves_and_empty_fails(
    client: Orchard, synthesized: tuple[Path, Counts, str]
) -> None:
    """A shipped more-itertools row, its image built from the sdist (as on a fresh clone),
    graded by the harness in copies of its prepared set-up."""
    task = next(t for t in real_tasks() if t.repo == "pypi/more-itertools")
    made = not env_images.image_exists(task.image)
    built = image.ensure_images([task])
    try:
        assert built == {task.image: synthesized[2]}  # the same content-addressed build
        with Preparer(client) as prep:
            gold = grade(
                client, task, Prediction(task.instance_id, task.patch), preparer=prep, labels=LABELS
            )
            empty = grade(
                client, task, Prediction(task.instance_id, ""), preparer=prep, labels=LABELS
            )
            with prep.start(task, labels=LABELS) as sb:  # the set-up is reproducible
                head = sb.exec("git rev-parse HEAD && git log --oneline | wc -l", cwd=task.workdir)
                status = sb.exec("git status --porcelain", cwd=task.workdir).stdout
    finally:
        if made and task.image != synthesized[2]:
            subprocess.run(["docker", "rmi", task.image], capture_output=True, check=False)
    assert head.stdout.split() == [task.base_commit, "1"] and status == ""  # no trace of a diff
    assert gold.verify_status == "RESOLVED_FULL" and gold.resolved, gold.to_dict()
    assert empty.verify_status == "EMPTY_PATCH" and not empty.resolved
    failed = empty.tests_status["FAIL_TO_PASS"]["failure"]
    assert sorted(failed) == sorted(task.FAIL_TO_PASS)  # the bug is there before the fix


def test_second_run_resumes(
    client: Orchard, project: source.Project, synthesized: tuple[Path, Counts, str]
) -> None:
    out, first, _ = synthesized
    rows_before, state_before = out.read_text(), state_path(out).read_text()
    again = synthesize(
        client, SPEC, out, n=2, modifiers=MODIFIERS, seed=0, jobs=2, max_candidates=6
    )
    assert again.tried == 0 and again.kept == 2  # nothing validated again
    assert out.read_text() == rows_before and state_path(out).read_text() == state_before
    baseline = json.loads(state_before.splitlines()[0])
    assert baseline["kind"] == "baseline" and baseline["passing"]
    assert again.baseline_s == first.baseline_s  # the baseline was read, not run again


GOLD = (
    "diff --git a/pkg/mod.py b/pkg/mod.py\n--- a/pkg/mod.py\n+++ b/pkg/mod.py\n"
    "@@ -1,2 +1,3 @@\n def f(x):\n+    x = normalise_input(x)\n     return x\n"
)
LOG = "FAILED tests/test_mod.py::test_f - AssertionError: 3 != 4\n"


def test_statement_from_a_model_never_holds_the_patch() -> None:
    """Over real HTTP to a fake OpenAI-compatible server: a symptom-only answer is kept; one
    quoting a changed line, or a diff, or a failing model gives the template instead."""
    from orchard.llm.client import OpenAIModel
    from orchard.swe.synth import statement
    from tests.swe.fake_openai import FakeOpenAIServer, Reply

    bug = GOLD.replace("+    x = normalise", "-    x = normalise")
    issue = "f() returns 3 for 4\n\nCalling `f(4)` gives 3; expected 4.\n"
    replies = [
        Reply(content=issue),
        Reply(content="Fix: add `x = normalise_input(x)` at the top of f."),
        Reply(content="Try this:\n" + GOLD),
        Reply(status=400),
    ]
    with FakeOpenAIServer(replies) as srv:
        model = OpenAIModel(srv.base_url, max_retries=0, backoff_s=0.01)
        got = [
            statement.write("pkg", "1.0", ["tests/test_mod.py::test_f"], LOG, GOLD, bug, model)
            for _ in range(4)
        ]
    assert got[0] == (issue, "model")
    template = statement.write("pkg", "1.0", ["tests/test_mod.py::test_f"], LOG, GOLD, bug, None)
    assert template[1] == "template" and "AssertionError: 3 != 4" in template[0]
    assert got[1:] == [template] * 3
    assert rows.leaks(got[1][0], GOLD) == [] and "normalise_input" not in template[0]
