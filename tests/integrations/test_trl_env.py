"""TRL's GRPO `environment_factory` on Orchard: TRL's own tool loop drives real sandboxes.

The GRPO step uses the tiny model, first taught (plain supervised steps, seconds) to answer
the SWE sample task `intervals-1` with one `bash` tool call that fixes it, then a short
reply. Sampled at temperature 0.7 it calls the tool in some rollouts: TRL parses the call,
runs it in the rollout's sandbox through the environment's `bash` method, and
`orchard_reward` grades the repository's diff with the task's tests.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchard import Orchard
from orchard.claw.tasks import select_tasks
from orchard.integrations.trl import OrchardEnvironments, orchard_reward, use_qwen_tool_parser
from orchard.integrations.trl_envs import ClawEnvironment, SweEnvironment
from orchard.swe.tasks import Task
from orchard.train.tiny import build_tokenizer
from orchard.train.tokenize import Trajectory
from tests.integrations.conftest import leftover
from tests.train.tiny_grpo import intervals_task, one_torch_thread, teach

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    yield from one_torch_thread()


FIX = "sed -i 's/for iv in intervals:/for iv in sorted(intervals):/' intervals/core.py"


@pytest.fixture(scope="module")
def client(docker_ready: None) -> Iterator[Orchard]:
    with Orchard() as c:  # in-process service (ORCHARD_AGENT_BINARY from conftest)
        yield c


def tools_of(env: Any) -> list[str]:
    return sorted(
        n
        for n, _ in inspect.getmembers(type(env), predicate=inspect.isfunction)
        if not n.startswith("_") and n not in ("reset", "get_reward")
    )


@pytest.fixture(scope="module")
def swe_task(docker_ready: None) -> Task:
    task: Task = intervals_task()
    return task


def taught_model(tokenizer: Any, envs: OrchardEnvironments, task: Task) -> Any:
    """The tiny model after a few supervised steps on the episode TRL will render."""
    from transformers.utils.chat_template_utils import get_json_schema

    probe = envs()
    assert isinstance(probe, SweEnvironment)
    row = envs.dataset()[0]
    call = {"type": "function", "function": {"name": "bash", "arguments": {"command": FIX}}}
    messages = [
        *row["prompt"][:-1],
        {"role": "user", "content": probe._task_text(task)},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {
            "role": "tool",
            "name": "bash",
            "content": "<returncode>0</returncode>\n<output>\n</output>",
        },
        {"role": "assistant", "content": "Fixed."},
    ]
    tools = [get_json_schema(probe.bash)]
    return teach(tokenizer, Trajectory(messages, tools=tools), steps=100, lr=3e-3)


def test_grpo_step_through_the_environment_factory(
    swe_task: Task, client: Orchard, tmp_path: Path, no_leaks: Callable[[str], Any]
) -> None:
    from trl.trainer.grpo_config import GRPOConfig
    from trl.trainer.grpo_trainer import GRPOTrainer

    tokenizer = use_qwen_tool_parser(build_tokenizer())
    with no_leaks("trl"), OrchardEnvironments("swe", [swe_task], client=client) as envs:
        model = taught_model(tokenizer, envs, swe_task)
        args = GRPOConfig(
            output_dir=str(tmp_path / "out"), num_generations=2, per_device_train_batch_size=2,
            max_steps=1, max_completion_length=160, temperature=0.7, learning_rate=1e-5,
            beta=0.0, logging_steps=1, save_strategy="no", report_to="none", seed=0,
            max_tool_calling_iterations=2, bf16=False,
        )  # fmt: skip
        trainer = GRPOTrainer(
            model=model, reward_funcs=orchard_reward, args=args, train_dataset=envs.dataset(),
            processing_class=tokenizer, environment_factory=envs, callbacks=[envs.callback()],
        )  # fmt: skip
        assert tools_of(envs.environments[0]) == ["bash"]
        trainer.train()
        assert trainer.state.global_step == 1
        [logged] = [h for h in trainer.state.log_history if "reward" in h]
        assert logged["tools/call_frequency"] > 0  # TRL parsed the policy's bash calls
        assert logged["tools/failure_frequency"] == 0
        # graded by the task's tests on the diff the calls left: at least one rollout fixed it
        assert -1.0 < logged["reward"] <= 1.0, logged
        # the callback closed the factory when training ended: nothing is left
        assert envs.environments == [] and envs.close() == 0


def test_swe_environment_on_a_shipped_real_row(
    client: Orchard, no_leaks: Callable[[str], Any]
) -> None:
    """A row synthesized from a real PyPI project (`"real"`): reset sets its bug up, the
    row's own tests grade the diff the tool calls left."""
    from tests.swe.real import gold_command, real_row

    task = real_row()
    ids = [task.instance_id]
    with no_leaks("trl"), OrchardEnvironments("swe", "real", ids=ids, client=client) as envs:
        env = envs()
        assert isinstance(env, SweEnvironment)
        assert task.problem_statement.strip()[:60] in env.reset(**envs.dataset()[0])
        reply = [{"role": "assistant", "content": "Done."}]
        assert orchard_reward([reply], [env]) == [-1.0]  # the bug is there
        assert "<returncode>0</returncode>" in env.bash(command=gold_command(task))
        assert orchard_reward([reply], [env]) == [1.0]


def test_claw_environment_tools_and_reward(client: Orchard, no_leaks: Callable[[str], Any]) -> None:
    """Claw: the task's service tools are methods; the rubric grades the world it changed."""
    [spec] = select_tasks(None, ["todo-complete-vpn"])
    with no_leaks("trl"), OrchardEnvironments("claw", [spec], client=client) as envs:
        env: Any = envs()  # the task's service tools are attached as methods, per task
        assert "todo_complete" in tools_of(env) and "mail_send" not in tools_of(env)
        row = envs.dataset()[0]
        assert env.reset(**row) == spec.request
        assert '"t-006"' in env.todo_list(status="open")
        reply = [{"role": "assistant", "content": spec.reference_answer}]
        assert orchard_reward([reply], [env]) == [-1.0]  # nothing done yet
        env.todo_complete(id="t-006")
        assert orchard_reward([reply], [env]) == [1.0]
        assert "error" in env.todo_complete(id="t-nope")  # a tool error goes back as text
        env.reset(**row)  # the world is reset to the task's seed, not recreated
        assert orchard_reward([reply], [env]) == [-1.0]
        env._world.result().sandbox.delete()  # a world gone under the run: no reward
        assert orchard_reward([reply], [env]) == [None]


def test_unknown_task_and_family_are_clear_errors(client: Orchard) -> None:
    with pytest.raises(ValueError, match="no TRL environment for family"):
        OrchardEnvironments("nope", [object()], client=client)  # type: ignore[arg-type]
    [spec] = select_tasks(None, ["todo-complete-vpn"])
    with (
        OrchardEnvironments("claw", [spec], client=client) as envs,
        pytest.raises(KeyError, match="no task 'missing'"),
    ):
        envs().reset(instance_id="missing")
    with pytest.raises(RuntimeError, match="closed"):
        envs()
    with pytest.raises(ValueError, match="claw_reward must be pass or score"):
        OrchardEnvironments("claw", [spec], client=client, claw_reward="dense")


def test_gui_environment_text_mode(client: Orchard, no_leaks: Callable[[str], Any]) -> None:
    """GUI: the browser actions are methods, the page comes back as text, the judge grades."""
    from orchard.gui.image import browser_image
    from orchard.gui.tasks import select_tasks as gui_tasks

    browser_image()  # built offline once, reused by tag (the GUI tests use the same)
    [task] = gui_tasks("sample", ["wiki-lighthouse-year"])
    with no_leaks("trl"), OrchardEnvironments("gui", [task], client=client) as envs:
        env: Any = envs()  # the browser tools are attached as methods
        assert {"click", "goto_url", "done"} <= set(tools_of(env))
        text = env.reset(**envs.dataset()[0])
        assert task.ques in text and "Accessibility tree:" in text
        page = env.goto_url(url="http://wiki.localhost:8000/wiki/verlay-lighthouse")
        assert "verlay-lighthouse" in page and "Accessibility tree:" in page
        # no `done` call: the final reply is the answer the judge reads
        assert orchard_reward([[{"role": "assistant", "content": "1889"}]], [env]) == [1.0]
        env.reset(**envs.dataset()[0])
        assert "The episode is over" not in env.click(x=10, y=10)
        assert "The episode is over" in env.done(answer="1066")
        assert orchard_reward([[{"role": "assistant", "content": "1889"}]], [env]) == [0.0]


def test_sandboxes_go_when_training_fails(client: Orchard, no_leaks: Callable[[str], Any]) -> None:
    [spec] = select_tasks(None, ["todo-complete-vpn"])
    with (
        no_leaks("trl"),
        pytest.raises(RuntimeError, match="the trainer failed"),
        OrchardEnvironments("claw", [spec], client=client) as envs,
    ):
        env = envs()
        assert isinstance(env, ClawEnvironment)
        env.reset(**envs.dataset()[0])  # the world starts in the background
        assert env._world is not None
        env._world.result()
        assert leftover("trl")
        raise RuntimeError("the trainer failed")
