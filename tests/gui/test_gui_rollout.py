"""GRPO with BAR over the GUI environment: the tiny in-code model as a text-only policy in a
REAL browser, episodes judged by an LLM judge served by the fake OpenAI-compatible server
(a named fake). The judge alternates SUCCESS / NOT SUCCESS, so the rewards can only have
come from it; an unparsable verdict is no score, and the episode is backfill (ABORTED)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from orchard import Orchard
from orchard.gui.browser_env import EnvConfig
from orchard.gui.demo import ScriptedModel
from orchard.gui.harness import GuiAgentConfig, run_episode
from orchard.gui.judges import WebVoyagerJudge
from orchard.gui.rollout import GuiEpisodeResult, GuiRolloutRunner, GuiRunnerFactory
from orchard.gui.tasks import sample_tasks
from orchard.gui.types import WebTask
from orchard.llm.client import OpenAIModel
from orchard.train.bar import BARConfig, Outcome, bar_rollout
from orchard.train.grpo import train_grpo
from orchard.train.rollout import HFGenerator
from orchard.train.tokenize import Trajectory, tokenize_trajectory
from tests.swe.fake_openai import FakeOpenAIServer, Reply
from tests.train.tiny_grpo import one_torch_thread, teach, tiny_grpo_config

# a short prompt: the tiny model is taught on it in seconds
CONFIG = GuiAgentConfig(
    observation="text",
    context="chat",
    actions=("done",),
    system_prompt="Browse the web; call the done tool with the answer.",
)
ANSWER = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        {
            "id": "call_0",
            "type": "function",
            "function": {"name": "done", "arguments": {"answer": "1872"}},
        }
    ],
}


class AlternatingJudge:
    """The fake judge's script: SUCCESS, NOT SUCCESS, SUCCESS, ... (or garbage when asked)."""

    def __init__(self) -> None:
        self.n = 0
        self.garbage = False
        self.lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> Reply:
        with self.lock:
            if self.garbage:
                return Reply(content="I cannot tell.")
            self.n += 1
            return Reply(content="SUCCESS" if self.n % 2 else "NOT SUCCESS")


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    yield from one_torch_thread()


@pytest.fixture(scope="module")
def judge_script() -> AlternatingJudge:
    return AlternatingJudge()


@pytest.fixture(scope="module")
def factory(
    gui_client: Orchard, browser_image: str, tokenizer: Any, judge_script: AlternatingJudge
) -> Iterator[GuiRunnerFactory]:
    with FakeOpenAIServer(judge_script) as server:
        judge = WebVoyagerJudge(OpenAIModel(server.base_url, max_retries=0))
        env_cfg = EnvConfig(max_steps=4)
        with GuiRunnerFactory(
            gui_client,
            tokenizer,
            CONFIG,
            env_config=env_cfg,
            judge=judge,
            temperature=0.7,
            top_p=1.0,
            max_new_tokens=60,
            seed=0,
        ) as f:
            yield f


@pytest.fixture(scope="module")
def task() -> WebTask:
    return next(t for t in sample_tasks() if t.id == "wiki-lighthouse-year")


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from orchard.train.tiny import build_tokenizer

    return build_tokenizer()


@pytest.fixture(scope="module")
def taught(factory: GuiRunnerFactory, task: WebTask, tokenizer: Any) -> Any:
    """The tiny model, taught (plain supervised steps) to answer the task's first prompt with
    a `done` call; the prompt is the one the harness really builds for this page."""
    script = ScriptedModel([{"name": "done", "args": {"answer": "x"}}])
    traj = factory.envs.submit(lambda env: run_episode(task, script, env, CONFIG)).result()
    prompt = traj.turns[0]["prompt"]
    assert [m["role"] for m in prompt] == ["system", "user"]
    assert "Current page:\nURL: http://wiki.localhost:8000/" in prompt[1]["content"]
    trajectory = Trajectory([*prompt, ANSWER], CONFIG.tools())
    assert tokenize_trajectory(trajectory, tokenizer).n_loss_tokens > 10
    return teach(tokenizer, trajectory, steps=60, lr=6e-3)


def _check(ep: Any) -> GuiEpisodeResult:
    r = ep.payload
    assert isinstance(r, GuiEpisodeResult) and r.trajectory is not None
    if r.exit_status == "done":  # judged: the reward is the judge's verdict
        assert r.verdict is not None and r.verdict["judge"] == "webvoyager"
        assert ep.outcome is Outcome.SUBMITTED
        assert ep.reward == (1.0 if r.verdict["success"] else 0.0)
        assert r.resolved is bool(r.verdict["success"])
    else:  # three malformed calls in a row, or the step limit: not judged
        assert r.verdict is None or r.exit_status == "max_steps"
        assert ep.reward == (-1.0 if r.exit_status == "malformed" else 0.0)
    rec = r.record
    assert len(rec.completion_ids) == len(rec.logprobs) == len(rec.env_mask)
    assert rec.turns == len(r.trajectory.steps) and ep.length == sum(rec.env_mask) > 0
    return r


def test_bar_group_rewards_come_from_the_judge(
    factory: GuiRunnerFactory,
    taught: Any,
    task: WebTask,
    tokenizer: Any,
    judge_script: AlternatingJudge,
) -> None:
    gen = HFGenerator(taught, tokenizer.eos_token_id, tokenizer.pad_token_id, temperature=0.7,
                      top_p=1.0, seed=1)  # fmt: skip
    runner = GuiRolloutRunner(factory.envs, tokenizer, gen, CONFIG, max_new_tokens=60)
    asked = judge_script.n
    with ThreadPoolExecutor(2) as pool:
        res = bar_rollout(runner.sampler(task, pool), BARConfig(2, 4, 2, (0.25, 0.75)))
    results = [_check(ep) for ep in res.group]
    judged = [r for r in results if r.exit_status == "done"]
    # the taught policy calls done (seeded sampling); each episode asked the judge once, and
    # the alternating verdicts give one success and one failure: a balanced group
    assert len(judged) == 2 and judge_script.n - asked == 2
    assert res.rule == "band" and sorted(ep.reward or 0.0 for ep in res.group) == [0.0, 1.0]


def test_no_score_from_the_judge_is_an_aborted_episode(
    factory: GuiRunnerFactory, taught: Any, task: WebTask, tokenizer: Any,
    judge_script: AlternatingJudge,
) -> None:  # fmt: skip
    gen = HFGenerator(taught, tokenizer.eos_token_id, tokenizer.pad_token_id, temperature=0.7,
                      top_p=1.0, seed=3)  # fmt: skip
    runner = GuiRolloutRunner(factory.envs, tokenizer, gen, CONFIG, max_new_tokens=60)
    judge_script.garbage = True
    try:
        ep = runner.run(task)
    finally:
        judge_script.garbage = False
    r = ep.payload
    assert isinstance(r, GuiEpisodeResult) and r.exit_status == "done"
    assert ep.outcome is Outcome.ABORTED and ep.reward is None and ep.backfill
    assert r.verdict is not None and r.verdict["success"] is None
    assert "no score" in r.verdict["reason"]


def test_grpo_step_with_bar_over_the_browser(
    factory: GuiRunnerFactory, taught: Any, task: WebTask, tokenizer: Any, tmp_path: Path
) -> None:
    """One real TRL GRPO step (`train_grpo`) whose rollouts are judged GUI episodes."""
    cfg = tiny_grpo_config(
        tmp_path / "grpo", max_samples=4, max_tokens_per_turn=60, temperature=0.7, top_p=1.0
    )
    metrics, rollout = train_grpo(cfg, [task], factory, taught, tokenizer)
    assert metrics["global_step"] == 1
    assert rollout.stats.tasks == 1 and rollout.stats.episodes >= 2
    logged = [h for h in metrics["log_history"] if "reward" in h]
    assert logged and -1.0 <= logged[0]["reward"] <= 1.0
    (res,) = rollout.results
    assert len(res.group) == 2
    for ep in res.group:
        _check(ep)  # each reward is the judge's verdict ...
    # ... and those are the rewards the step trained on (backfill counts 0)
    assert logged[0]["reward"] == pytest.approx(sum(ep.reward or 0.0 for ep in res.group) / 2)
