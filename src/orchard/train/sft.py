"""Supervised fine-tuning on the credit-assigned data set with TRL's `SFTTrainer`.

One dataclass configures a run (defaults are the recipe's: lr 1e-5 cosine to 1e-6,
10% warm-up, weight decay 0.1, 5 epochs, 64K context). The data set is the one
`orchard train sft-data` writes: pre-tokenized `input_ids` and `labels`, so TRL skips
its own templating and masking. When turns carry value weights (`--mode weight`), a
small `SFTTrainer` subclass applies them per token. Full fine-tuning or LoRA (PEFT);
several GPUs through `accelerate launch` (DDP or FSDP). A run resumes from the last
checkpoint in its output folder.
"""

from __future__ import annotations

import importlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SFT_COLUMNS = ["input_ids", "labels"]


@dataclass
class SFTRunConfig:
    model: str  # a local folder or a model name the hub cache already holds
    dataset: str  # folder written by `orchard train sft-data` (`datasets.save_to_disk`)
    output_dir: str
    lora: bool = False
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    lora_target_modules: str = "all-linear"
    learning_rate: float = 1e-5
    min_learning_rate: float = 1e-6
    warmup_ratio: float = 0.1
    weight_decay: float = 0.1
    epochs: float = 5.0
    max_steps: int = -1
    max_length: int = 65536
    per_device_batch_size: int = 1
    gradient_accumulation_steps: int = 1
    gradient_checkpointing: bool = False
    bf16: bool = False
    use_weights: bool = True  # apply per-token `loss_weights` when they are not all 0/1
    save_steps: int = 500
    save_total_limit: int | None = 3
    logging_steps: int = 10
    seed: int = 0
    resume: bool = True
    report_to: str = "tensorboard"  # TRL's loggers: OUT/runs/*; "none" disables
    extra: dict[str, Any] = field(default_factory=dict)  # any other SFTConfig field

    def sft_config(self) -> Any:
        sft_config_cls = _trl("trl.trainer.sft_config", "SFTConfig")
        return sft_config_cls(
            output_dir=self.output_dir,
            learning_rate=self.learning_rate,
            lr_scheduler_type="cosine_with_min_lr",
            lr_scheduler_kwargs={"min_lr": self.min_learning_rate},
            warmup_steps=self.warmup_ratio,
            weight_decay=self.weight_decay,
            num_train_epochs=self.epochs,
            max_steps=self.max_steps,
            max_length=self.max_length,
            per_device_train_batch_size=self.per_device_batch_size,
            gradient_accumulation_steps=self.gradient_accumulation_steps,
            activation_checkpointing=self.gradient_checkpointing,
            bf16=self.bf16,
            save_steps=self.save_steps,
            save_total_limit=self.save_total_limit,
            logging_steps=self.logging_steps,
            seed=self.seed,
            report_to=self.report_to,
            **self.extra,
        )

    def peft_config(self) -> Any:
        if not self.lora:
            return None
        from peft import LoraConfig

        return LoraConfig(
            r=self.lora_r,
            lora_alpha=self.lora_alpha,
            lora_dropout=self.lora_dropout,
            target_modules=self.lora_target_modules,
            task_type="CAUSAL_LM",
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _has_fractional_weights(dataset: Any) -> bool:
    if "loss_weights" not in dataset.column_names:
        return False
    return any(w not in (0.0, 1.0) for row in dataset["loss_weights"] for w in row)


def _trl(module: str, name: str) -> Any:
    """A TRL class, imported late (importing TRL is slow) and typed Any (TRL has no stubs)."""
    return getattr(importlib.import_module(module), name)


def _weighted_trainer_class() -> tuple[Any, Any]:
    """`SFTTrainer` and its collator with per-token loss weights."""
    import torch

    sft_trainer: Any = _trl("trl.trainer.sft_trainer", "SFTTrainer")
    base_collator: Any = _trl("trl.trainer.sft_trainer", "DataCollatorForLanguageModeling")

    class WeightedCollator(base_collator):  # type: ignore[misc]
        def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
            weights = [torch.tensor(e.pop("loss_weights"), dtype=torch.float32) for e in examples]
            batch: dict[str, Any] = super().torch_call(examples)
            width = batch["input_ids"].shape[1]
            padded = torch.zeros(len(weights), width)
            for row, w in enumerate(weights):
                padded[row, : len(w)] = w[:width]
            batch["loss_weights"] = padded
            return batch

    class WeightedSFTTrainer(sft_trainer):  # type: ignore[misc]
        def _set_signature_columns_if_needed(self) -> None:
            self._signature_columns: list[str] = ["input_ids", "labels", "loss_weights"]

        def compute_loss(
            self,
            model: Any,
            inputs: dict[str, Any],
            return_outputs: bool = False,
            num_items_in_batch: Any = None,
        ) -> Any:
            weights = inputs.pop("loss_weights")
            labels = inputs.pop("labels")
            outputs = model(**inputs, use_cache=False)
            logits = outputs.logits[:, :-1].float()
            target = labels[:, 1:]
            ce = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.size(-1)),
                target.reshape(-1),
                ignore_index=-100,
                reduction="none",
            ).view_as(target)
            w = weights[:, 1:].to(ce.dtype) * (target != -100)
            # normalised like the unweighted loss (per loss token), so lr means the same
            denom = num_items_in_batch if num_items_in_batch is not None else (target != -100).sum()
            loss = (ce * w).sum() / torch.as_tensor(denom, device=ce.device).clamp(min=1)
            return (loss, outputs) if return_outputs else loss

    return WeightedSFTTrainer, WeightedCollator


def last_checkpoint(output_dir: str) -> str | None:
    """The newest complete `checkpoint-N` folder in `output_dir` (a crash mid-save leaves
    one without `trainer_state.json`, which is skipped)."""
    found = [
        p
        for p in Path(output_dir).glob("checkpoint-*")
        if p.name[11:].isdigit() and (p / "trainer_state.json").is_file()
    ]
    return str(max(found, key=lambda p: int(p.name[11:]))) if found else None


def run_sft(cfg: SFTRunConfig, *, model: Any = None, tokenizer: Any = None) -> dict[str, Any]:
    """Train; returns the trainer's metrics plus where the final model was saved.

    `model` / `tokenizer` may be passed as objects (tests build them in code); otherwise
    they are loaded from `cfg.model`.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    datasets: Any = importlib.import_module("datasets")
    data = datasets.load_from_disk(cfg.dataset)
    if isinstance(data, datasets.DatasetDict):
        data = data["train"]
    tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(cfg.model)
    model = model if model is not None else AutoModelForCausalLM.from_pretrained(cfg.model)
    args = cfg.sft_config()
    weighted = cfg.use_weights and _has_fractional_weights(data)
    keep = [*SFT_COLUMNS, "loss_weights"] if weighted else SFT_COLUMNS
    data = data.select_columns(keep)
    kwargs: dict[str, Any] = {}
    if weighted:
        trainer_cls, collator_cls = _weighted_trainer_class()
        args.remove_unused_columns = False
        kwargs["data_collator"] = collator_cls(pad_token_id=tokenizer.pad_token_id)
    else:
        trainer_cls = _trl("trl.trainer.sft_trainer", "SFTTrainer")
    trainer = trainer_cls(
        model=model,
        args=args,
        train_dataset=data,
        processing_class=tokenizer,
        peft_config=cfg.peft_config(),
        **kwargs,
    )
    resume = last_checkpoint(cfg.output_dir) if cfg.resume else None
    result = trainer.train(resume_from_checkpoint=resume)
    final = Path(cfg.output_dir) / "final"
    trainer.save_model(str(final))
    tokenizer.save_pretrained(str(final))
    return {
        **result.metrics,
        "global_step": trainer.state.global_step,
        "resumed_from": resume,
        "weighted": weighted,
        "final": str(final),
    }
