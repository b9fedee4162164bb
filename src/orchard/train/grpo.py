"""GRPO with Balanced Adaptive Rollout on TRL's `GRPOTrainer`.

One dataclass configures a run; defaults are the recipe's (clip 0.2 / 0.28, no KL term,
entropy bonus 1e-4, lr 1e-6, temperature and top-p 0.95, group size 4 from up to 8
samples). `train_grpo` is the loop over any runner factory (rollouts come from
`BARRolloutFunc`); `run_grpo` is the entry point over any `Family`, which brings its
runners. The reward function just reads the reward each rollout was graded with.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchard.families.registry import Family, RolloutOptions
from orchard.train.bar import BARConfig, RewardConfig
from orchard.train.rollout import BARRolloutFunc, RolloutRunner, reward_from_rollout
from orchard.train.sft import last_checkpoint

if TYPE_CHECKING:
    from orchard.env.sdk import Orchard


@dataclass
class GRPORunConfig:
    model: str
    output_dir: str
    group_size: int = 4  # N: completions per task TRL trains on (= num_generations)
    max_samples: int = 8  # M
    stride: int = 8  # S
    band: tuple[float, float] = (0.25, 0.75)
    reward_resolved: float = 1.0
    reward_unresolved: float = -1.0
    tasks_per_step: int = 1  # groups per optimizer step (per device)
    max_replacements: int = 2  # tasks drawn to replace a group the filter drops
    concurrency: int | None = None  # episodes run at once (default: stride)
    fork: bool = True  # a group sets its task up once and forks its episodes (SWE)
    learning_rate: float = 1e-6
    epsilon: float = 0.2
    epsilon_high: float = 0.28
    beta: float = 0.0  # KL coefficient; 0 needs no reference model
    entropy_coef: float = 1e-4
    temperature: float = 0.95
    top_p: float = 0.95
    max_tokens_per_turn: int = 4096
    max_steps: int = 100
    gradient_accumulation_steps: int = 1
    save_steps: int = 50
    logging_steps: int = 1
    bf16: bool = False
    lora: bool = False
    lora_r: int = 16
    lora_alpha: int = 32
    seed: int = 0
    resume: bool = True
    report_to: str = "tensorboard"  # TRL's loggers: OUT/runs/*; "none" disables
    extra: dict[str, Any] = field(default_factory=dict)  # any other GRPOConfig field

    def bar(self) -> BARConfig:
        return BARConfig(self.group_size, self.max_samples, self.stride, self.band)

    def reward(self) -> RewardConfig:
        return RewardConfig(self.reward_resolved, self.reward_unresolved)

    def grpo_config(self) -> Any:
        cls: Any = importlib.import_module("trl.trainer.grpo_config").GRPOConfig
        return cls(
            output_dir=self.output_dir,
            num_generations=self.group_size,
            per_device_train_batch_size=self.group_size * self.tasks_per_step,
            gradient_accumulation_steps=self.gradient_accumulation_steps,
            learning_rate=self.learning_rate,
            epsilon=self.epsilon,
            epsilon_high=self.epsilon_high,
            beta=self.beta,
            entropy_coef=self.entropy_coef,
            temperature=self.temperature,
            top_p=self.top_p,
            max_completion_length=self.max_tokens_per_turn,
            max_steps=self.max_steps,
            save_steps=self.save_steps,
            logging_steps=self.logging_steps,
            bf16=self.bf16,
            seed=self.seed,
            report_to=self.report_to,
            **self.extra,
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _bar_log_callback(rollout: BARRolloutFunc) -> Any:
    """A TrainerCallback adding BAR's rollout counts (`bar/*`) to each logged step."""
    base: Any = importlib.import_module("transformers").TrainerCallback

    class BARLog(base):  # type: ignore[misc]
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs is None:
                return
            st = rollout.stats
            logs["bar/tasks"] = float(st.tasks)
            logs["bar/episodes"] = float(st.episodes)
            logs["bar/replaced"] = float(st.replaced)
            for why, n in st.dropped.items():
                logs[f"bar/dropped_{why}"] = float(n)

    return BARLog()


def load_policy(cfg: GRPORunConfig, model: Any = None, tokenizer: Any = None) -> tuple[Any, Any]:
    """The policy and its tokenizer: the ones given, else loaded from `cfg.model`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(cfg.model)
    model = model if model is not None else AutoModelForCausalLM.from_pretrained(cfg.model)
    return model, tokenizer


def train_grpo(
    cfg: GRPORunConfig,
    tasks: Sequence[Any],
    runner_factory: Callable[[Any], RolloutRunner],
    model: Any,
    tokenizer: Any,
) -> tuple[dict[str, Any], BARRolloutFunc]:
    """Train on any family: `runner_factory(trainer)` gives the step's `RolloutRunner`
    (SWE, GUI, Claw), `tasks` are anything with an `instance_id`. Returns the metrics and
    the rollout function (its `stats` say what BAR spent, `results` hold the last groups)."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental
    rollout = BARRolloutFunc(
        tasks,
        runner_factory,
        cfg.bar(),
        max_replacements=cfg.max_replacements,
        concurrency=cfg.concurrency,
        seed=cfg.seed,
        log_dir=Path(cfg.output_dir),
    )
    peft_config = None
    if cfg.lora:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=cfg.lora_r,
            lora_alpha=cfg.lora_alpha,
            target_modules="all-linear",
            task_type="CAUSAL_LM",
        )
    trainer_cls: Any = importlib.import_module("trl.trainer.grpo_trainer").GRPOTrainer
    trainer = trainer_cls(
        model=model,
        reward_funcs=reward_from_rollout,
        args=cfg.grpo_config(),
        train_dataset=rollout.prompts_dataset(),
        processing_class=tokenizer,
        peft_config=peft_config,
        rollout_func=rollout,
    )
    # BAR's counts join every log line; first in line so TensorBoard & co. see them
    trainer.callback_handler.callbacks.insert(0, _bar_log_callback(rollout))
    resume = last_checkpoint(cfg.output_dir) if cfg.resume else None
    result = trainer.train(resume_from_checkpoint=resume)
    final = Path(cfg.output_dir) / "final"
    trainer.save_model(str(final))
    tokenizer.save_pretrained(str(final))
    metrics = {
        **result.metrics,
        "global_step": trainer.state.global_step,
        "resumed_from": resume,
        "final": str(final),
        "bar": asdict(rollout.stats),
        "log_history": trainer.state.log_history,
    }
    return metrics, rollout


def run_grpo(
    cfg: GRPORunConfig,
    family: Family,
    tasks: Sequence[Any],
    client: Orchard,
    options: RolloutOptions | None = None,
    *,
    model: Any = None,
    tokenizer: Any = None,
) -> tuple[dict[str, Any], BARRolloutFunc]:
    """GRPO on any family's tasks: the one entry point (`orchard train grpo --family`).

    The family runs the episodes (`Family.rollouts`) in sandboxes of `client`; `options`
    say what the command line asked of them, and the sampling settings come from `cfg`.
    The policy and tokenizer are the ones given, else loaded from `cfg.model` (the
    tokenizer first, so a family's bad settings fail before the weights load)."""
    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    opts = replace(
        options or RolloutOptions(),
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        max_new_tokens=cfg.max_tokens_per_turn,
        seed=cfg.seed,
        reward_resolved=cfg.reward_resolved,
        reward_unresolved=cfg.reward_unresolved,
        fork=cfg.fork,
    )
    with family.rollouts(client, tokenizer, opts) as rollouts:
        model, tokenizer = load_policy(cfg, model, tokenizer)
        if cfg.concurrency is None and rollouts.concurrency is not None:
            cfg = replace(cfg, concurrency=rollouts.concurrency)
        return train_grpo(cfg, tasks, rollouts.runners, model, tokenizer)
