"""mini-swe-agent's own DefaultAgent and DeterministicModel on OrchardEnvironment."""

from __future__ import annotations

import uuid
from pathlib import Path

import yaml
from minisweagent.agents.default import DefaultAgent
from minisweagent.config import builtin_config_dir
from minisweagent.environments import get_environment
from minisweagent.models.test_models import DeterministicModel, make_output

from orchard import Orchard
from orchard.swe.grading import Prediction, grade
from orchard.swe.tasks import Task


def test_one_task_with_the_deterministic_model(
    swe_client: Orchard, swe_tasks: list[Task], tmp_path: Path
) -> None:
    t = next(t for t in swe_tasks if t.repo.endswith("semverlite"))
    # mini-swe-agent's own SWE-bench config, with only the environment class switched.
    config = yaml.safe_load((builtin_config_dir / "benchmarks" / "swebench.yaml").read_text())
    env_config = {
        **config["environment"],
        "environment_class": "orchard.swe.minisweagent_env.OrchardEnvironment",
        "image": t.image,
        "orchard_url": f"unix://{swe_client.target.uds}",
        "run_args": ["--rm"],  # a Docker-only setting: ignored
        "labels": {"swe": "mini-swe-agent", "test-run": uuid.uuid4().hex},
    }
    env = get_environment(env_config)
    commands = [
        "cat semverlite/version.py | head -5",
        f"git apply <<'EOF'\n{t.patch}EOF",
        "git diff -- semverlite > patch.txt",
        "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat patch.txt",
    ]
    model = DeterministicModel(  # type: ignore[no-untyped-call]  # mini-swe-agent: no annotations
        outputs=[make_output(f"step {i}", [{"command": c}]) for i, c in enumerate(commands)],
        observation_template=config["model"]["observation_template"],
    )
    settings = {**config["agent"], "cost_limit": 0, "output_path": tmp_path / "t.json"}
    agent = DefaultAgent(model, env, **settings)
    try:
        info = agent.run(t.problem_statement)
        sandbox_id = env.sandbox.id  # type: ignore[attr-defined]
        assert swe_client.sandboxes.get(sandbox_id).info.labels["swe"] == "mini-swe-agent"
    finally:
        env.cleanup()  # type: ignore[attr-defined]
    assert info["exit_status"] == "Submitted"
    assert info["submission"] == t.patch
    # Each command ran in /testbed (the config's cwd) and its output came back.
    observations = [m for m in agent.messages if m["role"] == "user"][1:]
    assert '"""The Version type."""' in observations[0]["content"]
    assert swe_client.sandboxes.list(labels=env_config["labels"]) == []
    r = grade(swe_client, t, Prediction(t.instance_id, info["submission"], "deterministic"))
    assert r.verify_status == "RESOLVED_FULL"
