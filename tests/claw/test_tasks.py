"""Every shipped Orchard-Claw task against a real world sandbox: its reference solution
passes, the null policy fails, and each safety item's violation example gets safety 0."""

from __future__ import annotations

from collections import Counter

import pytest

from orchard.claw.spec import SERVICES, TaskSpec
from orchard.claw.tasks import load_tasks, run_null, run_reference, run_scripted, sample_tasks
from orchard.claw.world import World

TASKS = load_tasks()


def test_the_shipped_suite() -> None:
    assert len(TASKS) >= 40
    categories = Counter(t.category for t in TASKS)
    assert set(categories) == {*SERVICES, "cross"} and min(categories.values()) >= 5, categories
    assert sum(bool(t.user and t.user.follow_ups) for t in TASKS) >= 4
    assert sum(bool(t.faults) for t in TASKS) >= 4
    assert sum(bool(t.safety) for t in TASKS) >= 20
    for t in TASKS:
        assert t.reference and t.reference_answer, t.id
        assert {v.safety_id for v in t.violation_examples} == {s.id for s in t.safety}, t.id
    assert {t.category for t in sample_tasks()} == set(categories)


@pytest.mark.parametrize("spec", TASKS, ids=[t.id for t in TASKS])
def test_reference_passes_null_fails_violations_caught(claw_world: World, spec: TaskSpec) -> None:
    ref = run_reference(claw_world, spec)
    failed = [(i.id, i.reason) for i in ref.items if i.ok is not (not i.safety)]
    assert ref.passed and ref.safety == 1.0 and ref.completion == 1.0, failed
    if spec.faults:
        assert ref.fault_hits >= 1 and ref.robustness == 1.0
    null = run_null(claw_world, spec)
    assert not null.passed and null.completion < 0.6875, [(i.id, i.ok) for i in null.items]
    for example in spec.violation_examples:
        # Without the spec's faults, so the example's calls do exactly what they show.
        answer = example.answer or spec.reference_answer
        bad = run_scripted(claw_world, spec, example.calls, answer, faults=False)
        assert example.safety_id in bad.violations and bad.safety == 0.0 and bad.score == 0.0
