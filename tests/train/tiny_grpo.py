"""What the tiny-model GRPO tests (SWE, GUI and Claw alike) start from: the settings of a
minimal run, and a policy taught one answer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from orchard.train.grpo import GRPORunConfig
from orchard.train.tiny import build_model
from orchard.train.tokenize import Trajectory, tokenize_trajectory


def tiny_grpo_config(out: Path, **fields: Any) -> GRPORunConfig:
    """One step on groups of 2 (at most 2 samples, both at once), no replacement draws, no
    checkpoint before the end: the least a real GRPO step with BAR can do."""
    base: dict[str, Any] = {
        "model": "tiny",
        "output_dir": str(out),
        "group_size": 2,
        "max_samples": 2,
        "stride": 2,
        "max_steps": 1,
        "learning_rate": 1e-5,
        "save_steps": 10,
        "max_replacements": 0,
    }
    return GRPORunConfig(**{**base, **fields})


def teach(tokenizer: Any, trajectory: Trajectory, *, steps: int, lr: float) -> Any:
    """The tiny model after `steps` plain supervised steps on one trajectory: a policy that
    has learnt a task's answer, so that sampling solves it in some episodes, not all."""
    import torch

    sample = tokenize_trajectory(trajectory, tokenizer)
    model = build_model(tokenizer, seed=0)
    ids, labels = torch.tensor([sample.input_ids]), torch.tensor([sample.labels])
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    for _ in range(steps):
        model(input_ids=ids, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad()
    return model


def intervals_task() -> Any:
    """The SWE sample task `intervals-1`, its image built offline once and reused by tag."""
    from orchard.swe.images import task_image
    from orchard.swe.tasks import sample_tasks

    t = next(t for t in sample_tasks() if t.instance_id == "orchard-samples__intervals-1")
    task_image(t)
    return t


def one_torch_thread() -> Iterator[None]:
    """Run a test's tiny-model work on one torch thread: on a busy shared CPU, two OpenMP
    threads that wait for each other make each step ~10x slower (160 s vs 16 s measured
    for 100 steps at load 18 on 2 cores); on an idle one it makes no difference."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
