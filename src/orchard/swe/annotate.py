"""Per-turn test records for SWE trajectories, which `orchard.train.credit.RuleJudge` reads.

A trajectory from a run that did not re-run the tests after each edit carries no
`extra.tests`; `annotate_tests` adds them by replaying its commands in a sandbox of the task
and grading the working tree after every command that changed it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchard.swe.grading import Prediction, grade
from orchard.swe.harness import FormatError, SandboxEnv, parse_action
from orchard.swe.prepare import Preparer
from orchard.swe.tasks import Task
from orchard.train.tokenize import Trajectory, detect_mode

if TYPE_CHECKING:
    from orchard.env.sdk import Orchard


def annotate_tests(
    traj: Trajectory, task: Task, client: Orchard, *, command_timeout_s: float = 60
) -> Trajectory:
    """Replay `traj`'s commands in a fresh sandbox of `task`; after every command that changed
    the working tree, grade the diff so far and record which tests pass (`extra.tests`).

    This is what `RuleJudge` reads. Each grading runs in its own sandbox (as SWE-bench
    does), so the replay's working tree never sees the test patch.
    """
    mode = detect_mode(traj.messages)
    messages = [dict(m) for m in traj.messages]
    # A task with a set-up is set up once: the replay and every grading are copies of it.
    with (
        Preparer(client) as preparer,
        preparer.start(task, labels={"train": "replay"}) as sb,
    ):
        env = SandboxEnv(sb, task.workdir)
        last = env.diff()
        for i in traj.assistant_indices:
            try:
                command = parse_action(messages[i], mode)
            except FormatError:
                continue
            env.execute(command, command_timeout_s)
            diff = env.diff()
            if diff == last:
                continue
            last = diff
            pred = Prediction(task.instance_id, diff)
            report = grade(client, task, pred, preparer=preparer).tests_status
            passed = [
                t
                for k in ("FAIL_TO_PASS", "PASS_TO_PASS")
                for t in report.get(k, {}).get("success", [])
            ]
            failed = [
                t
                for k in ("FAIL_TO_PASS", "PASS_TO_PASS")
                for t in report.get(k, {}).get("failure", [])
            ]
            messages[i]["extra"] = {
                **(messages[i].get("extra") or {}),
                "tests": {"passed": passed, "failed": failed},
            }
    meta = {**traj.metadata, "FAIL_TO_PASS": task.FAIL_TO_PASS, "PASS_TO_PASS": task.PASS_TO_PASS}
    return Trajectory(messages, traj.tools, meta)
