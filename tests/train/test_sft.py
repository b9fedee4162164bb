"""Two-step SFT runs of the tiny model on credit-assigned data: full, weighted, LoRA, resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchard.train.credit import CreditConfig, RuleJudge, build_sft_data
from orchard.train.sft import SFTRunConfig, run_sft
from orchard.train.tokenize import to_dataset
from tests.train.test_credit import regressing
from tests.train.train_data import text_trajectory, tool_trajectory


def write_data(tok: Any, path: Path, mode: str) -> str:
    trajs = [text_trajectory(), tool_trajectory(), regressing()]
    trajs[1].metadata["resolved"] = True
    pairs, _ = build_sft_data(trajs, tok, RuleJudge(), CreditConfig(mode=mode))  # type: ignore[arg-type]
    to_dataset([s for _, s in pairs]).save_to_disk(str(path))
    return str(path)


def test_sft_two_steps_then_resume(tiny_dir: Path, tokenizer: Any, tmp_path: Path) -> None:
    data = write_data(tokenizer, tmp_path / "data", "cut")
    cfg = SFTRunConfig(
        model=str(tiny_dir),
        dataset=data,
        output_dir=str(tmp_path / "out"),
        max_steps=2,
        save_steps=2,
        logging_steps=1,
        learning_rate=1e-3,
    )
    first = run_sft(cfg)
    assert first["global_step"] == 2 and first["resumed_from"] is None and not first["weighted"]
    assert (Path(first["final"]) / "model.safetensors").is_file()
    cfg.max_steps = 3
    again = run_sft(cfg)
    assert again["resumed_from"].endswith("checkpoint-2") and again["global_step"] == 3


@pytest.mark.parametrize("lora", [False, True])
def test_sft_weighted_and_lora(tiny_dir: Path, tokenizer: Any, tmp_path: Path, lora: bool) -> None:
    data = write_data(tokenizer, tmp_path / "data", "weight")
    cfg = SFTRunConfig(
        model=str(tiny_dir),
        dataset=data,
        output_dir=str(tmp_path / "out"),
        max_steps=2,
        save_steps=100,
        lora=lora,
        lora_r=4,
        lora_alpha=8,
        learning_rate=1e-3,
    )
    res = run_sft(cfg)
    assert res["weighted"] and res["global_step"] == 2 and res["train_loss"] > 0
    saved = Path(res["final"])
    assert (saved / ("adapter_model.safetensors" if lora else "model.safetensors")).is_file()
