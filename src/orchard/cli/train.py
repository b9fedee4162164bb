"""`orchard train ...`: build the credit-assigned SFT data set, fine-tune, run GRPO with BAR."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from orchard.cli._common import JsonOpt, bad_request, connect, err, fail, labels, print_table
from orchard.cli._eval_log import export_log_command
from orchard.families.registry import (
    Family,
    RolloutOptions,
    UnknownFamily,
    family_names,
    get_family,
)

train_app = typer.Typer(
    help="Training: credit-assignment SFT data, SFT, and GRPO with Balanced Adaptive Rollout.",
    epilog="[bold]Examples[/bold]\n\n"
    "  orchard train sft-data runs/distill/dataset.jsonl --tokenizer Qwen/Qwen3-8B "
    "--judge rule --tasks sample --out data/sft\n\n"
    "  orchard train sft --model Qwen/Qwen3-8B --data data/sft/dataset --out ckpt/sft --lora\n\n"
    "  orchard train grpo --model ckpt/sft/final --tasks sample --out ckpt/rl --max-steps 100\n\n"
    "  orchard train grpo --family claw --category mail --model ckpt/sft/final "
    "--out ckpt/rl-claw\n\n"
    "  orchard train grpo --family gui --task wiki-lighthouse-year --model ckpt/sft/final "
    "--out ckpt/rl-gui",
    no_args_is_help=True,
)
TasksOpt = Annotated[
    str | None,
    typer.Option("--tasks", help="`sample`, a .jsonl/.json/.parquet file or a datasets folder."),
]


def _emit(result: dict[str, Any], as_json: bool, title: str) -> None:
    if as_json:
        sys.stdout.write(json.dumps(result, indent=2, default=str) + "\n")
        return
    table = Table(title=title, show_header=False)
    for key, value in result.items():
        if key != "log_history":
            table.add_row(
                key, json.dumps(value, default=str) if isinstance(value, dict) else str(value)
            )
    print_table(table)


def _quiet_stdout() -> contextlib.AbstractContextManager[Any]:
    """The trainers print progress and log dicts on stdout; stdout is for the result only."""
    return contextlib.redirect_stdout(sys.stderr)


def _overrides(path: Path | None) -> dict[str, Any]:
    """Extra config fields from a JSON or YAML file (any field of the run's dataclass)."""
    if path is None:
        return {}
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        import yaml

        data = yaml.safe_load(text) or {}
    else:
        data = json.loads(text)
    if not isinstance(data, dict):
        fail("bad_request", f"{path}: expected a mapping of config fields")
    return data


@train_app.command("sft-data")
def sft_data(
    ctx: typer.Context,
    trajectories: Annotated[
        list[Path],
        typer.Argument(help="Trajectory files: .jsonl rows (`orchard swe distill`) or .json."),
    ],
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Output folder.")],
    tokenizer: Annotated[
        str, typer.Option("--tokenizer", help="Tokenizer (model folder or name).")
    ],
    judge: Annotated[str, typer.Option("--judge", help="none, rule, or llm.")] = "rule",
    judge_url: Annotated[
        str | None, typer.Option("--judge-url", help="OpenAI-compatible base URL (…/v1).")
    ] = None,
    judge_model: Annotated[str, typer.Option("--judge-model", help="Judge model name.")] = "judge",
    cache: Annotated[
        Path | None, typer.Option("--cache", help="Judge answer cache (default OUT/judge-cache).")
    ] = None,
    threshold: Annotated[float, typer.Option("--threshold", help="Value below = critical.")] = 0.5,
    min_prefix: Annotated[int, typer.Option("--min-prefix", help="Turns to keep a prefix.")] = 2,
    mode: Annotated[str, typer.Option("--mode", help="cut or weight.")] = "cut",
    tasks: TasksOpt = None,
    annotate: Annotated[
        bool,
        typer.Option(
            "--annotate",
            help="Replay unresolved trajectories without per-turn test records in sandboxes of "
            "their task (needs --tasks), grading after every edit: what `--judge rule` reads.",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Tokenize trajectories with loss masks; keep unresolved ones up to their first critical
    mistake. Writes OUT/dataset (a datasets folder), OUT/chat.jsonl and OUT/report.json."""
    from orchard.train.credit import (
        CachedJudge,
        CreditConfig,
        CreditJudge,
        LLMJudge,
        RuleJudge,
        build_sft_data,
    )
    from orchard.train.tokenize import load_trajectories, to_dataset, write_chat_jsonl

    if mode not in ("cut", "weight"):
        fail("bad_request", "--mode must be cut or weight")
    trajs = load_trajectories(trajectories)
    by_id = {}
    if tasks:
        from orchard.swe.tasks import load_tasks

        by_id = {t.instance_id: t for t in load_tasks(tasks)}
        for t in trajs:
            task = by_id.get(str(t.metadata.get("instance_id")))
            if task is not None:
                t.metadata.setdefault("FAIL_TO_PASS", task.FAIL_TO_PASS)
                t.metadata.setdefault("PASS_TO_PASS", task.PASS_TO_PASS)
    unrecorded = [k for k, t in enumerate(trajs) if not t.resolved and not _has_test_records(t)]
    annotated = 0
    if annotate and unrecorded:
        if not by_id:
            fail("bad_request", "--annotate needs --tasks (the tasks the runs were on)")
        ids = [str(trajs[k].metadata.get("instance_id")) for k in unrecorded]
        unknown = sorted({i for i in ids if i not in by_id})
        if unknown:
            fail("bad_request", f"--annotate: no task for {', '.join(unknown)}")
        from orchard.swe.annotate import annotate_tests

        with connect(ctx) as client:
            for n, (k, i) in enumerate(zip(unrecorded, ids, strict=True), 1):
                err.print(f"annotating {i} ({n}/{len(ids)}): replay + grading after each edit")
                trajs[k] = annotate_tests(trajs[k], by_id[i], client)
        annotated, unrecorded = len(ids), []
    chosen: CreditJudge | None
    if judge == "none":
        chosen = None
    elif judge == "rule":
        chosen = RuleJudge()
    elif judge == "llm":
        if not judge_url:
            fail("bad_request", "--judge llm needs --judge-url")
        key = os.environ.get("ORCHARD_JUDGE_API_KEY") or os.environ.get("OPENAI_API_KEY")
        chosen = CachedJudge(
            LLMJudge(judge_url, judge_model, api_key=key), cache or out_dir / "judge-cache"
        )
    else:
        fail("bad_request", "--judge must be none, rule or llm")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer)
    cfg = CreditConfig(threshold, min_prefix, mode)  # type: ignore[arg-type]
    pairs, report = build_sft_data(trajs, tok, chosen, cfg)
    out_dir.mkdir(parents=True, exist_ok=True)
    to_dataset([s for _, s in pairs]).save_to_disk(str(out_dir / "dataset"))
    write_chat_jsonl(pairs, out_dir / "chat.jsonl")
    result = {
        "samples": len(pairs),
        "out": str(out_dir),
        "annotated": annotated,
        "unresolved_without_test_records": len(unrecorded),
        **report.to_json(),
    }
    if judge == "rule" and unrecorded and not as_json:
        err.print(
            f"note: {len(unrecorded)} unresolved trajectories carry no per-turn test records, "
            "so the rule judge finds no mistake in them and keeps them whole; "
            "add --annotate --tasks ... to replay and grade them",
            markup=False,
        )
    (out_dir / "report.json").write_text(json.dumps(result, indent=2))
    _emit(result, as_json, "SFT data")


def _has_test_records(traj: Any) -> bool:
    from orchard.train.credit import turn_tests

    return any(turn_tests(traj.messages[i]) is not None for i in traj.assistant_indices)


@train_app.command("sft")
def sft(
    model: Annotated[str, typer.Option("--model", help="Base model (folder or name).")],
    data: Annotated[Path, typer.Option("--data", help="Folder from `sft-data` (…/dataset).")],
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Checkpoints and final model.")],
    lora: Annotated[bool, typer.Option("--lora", help="Train a LoRA adapter (PEFT).")] = False,
    epochs: Annotated[float, typer.Option("--epochs")] = 5.0,
    max_steps: Annotated[int, typer.Option("--max-steps", help="-1 = by epochs.")] = -1,
    lr: Annotated[float, typer.Option("--lr")] = 1e-5,
    max_length: Annotated[int, typer.Option("--max-length")] = 65536,
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="JSON/YAML with more SFTRunConfig fields.")
    ] = None,
    report_to: ReportToOpt = "tensorboard",
    as_json: JsonOpt = False,
) -> None:
    """Fine-tune with TRL's SFTTrainer; resumes from the last checkpoint in OUT.
    Several GPUs: `accelerate launch -m orchard.cli train sft ...` (DDP or FSDP config)."""
    from orchard.train.sft import SFTRunConfig, run_sft

    fields = {
        "model": model,
        "dataset": str(data),
        "output_dir": str(out_dir),
        "lora": lora,
        "epochs": epochs,
        "max_steps": max_steps,
        "learning_rate": lr,
        "max_length": max_length,
        "report_to": report_to,
        **_overrides(config),
    }
    with _quiet_stdout():
        result = run_sft(SFTRunConfig(**fields))
    _emit(result, as_json, "SFT")


ReportToOpt = Annotated[
    str,
    typer.Option(
        "--report-to", help="TRL's report_to: tensorboard (OUT/runs), wandb, ..., or none."
    ),
]


FamilyOpt = Annotated[
    str,
    typer.Option(
        "--family",
        "-f",
        help="swe (SWE harness), gui (web agent), claw (tools), or module.Name of a Family.",
    ),
]
TaskIdOpt = Annotated[
    list[str] | None, typer.Option("--task", "-t", help="Only this task id (repeatable).")
]
CategoryOpt = Annotated[
    list[str] | None,
    typer.Option("--category", help="gui/claw: only this category (repeatable)."),
]


def _family(name: str) -> Family:
    try:
        return get_family(name)
    except UnknownFamily:
        *rest, last = family_names()
        fail("bad_request", f"--family must be {', '.join(rest)} or {last} (or module.Name)")


@train_app.command("grpo")
def grpo(
    ctx: typer.Context,
    model: Annotated[str, typer.Option("--model", help="Policy model (folder or name).")],
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Checkpoints and final model.")],
    family: FamilyOpt = "swe",
    tasks: Annotated[
        str,
        typer.Option(
            "--tasks",
            help="`sample` (the shipped set of the family) or a task file: SWE .jsonl/.json/"
            ".parquet or datasets folder, GUI task file, Claw spec file or folder.",
        ),
    ] = "sample",
    task: TaskIdOpt = None,
    category: CategoryOpt = None,
    max_steps: Annotated[int, typer.Option("--max-steps")] = 100,
    group_size: Annotated[int, typer.Option("--group-size", help="N per task.")] = 4,
    max_samples: Annotated[int, typer.Option("--max-samples", help="M per task.")] = 8,
    stride: Annotated[int, typer.Option("--stride", help="S, concurrent.")] = 8,
    harness: Annotated[
        Path | None,
        typer.Option("--harness", help="swe: harness YAML (default: the built-in one)."),
    ] = None,
    step_limit: Annotated[
        int | None, typer.Option("--step-limit", min=1, help="gui/claw: model turns per episode.")
    ] = None,
    workers: Annotated[
        int, typer.Option("--workers", "-w", min=1, help="gui: browsers; claw: worlds.")
    ] = 1,
    judge: Annotated[
        str, typer.Option("--judge", help="gui: state, webvoyager or webjudge.")
    ] = "state",
    judge_url: Annotated[
        str | None,
        typer.Option("--judge-url", help="LLM judge base URL (gui: LLM judges; claw: rubric)."),
    ] = None,
    judge_model: Annotated[str, typer.Option("--judge-model", help="Judge model name.")] = (
        "default"
    ),
    reward: Annotated[
        str, typer.Option("--reward", help="claw: pass (+1/-1) or score (score - 0.75).")
    ] = "pass",
    label: Annotated[
        list[str] | None, typer.Option("--label", "-l", help="K=V on every sandbox (repeatable).")
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="JSON/YAML with more GRPORunConfig fields."),
    ] = None,
    fork: Annotated[
        bool | None,
        typer.Option(
            "--fork/--no-fork",
            help="swe: set a task up once per group and fork its episodes (default: on, "
            "where the backend keeps snapshots).",
        ),
    ] = None,
    vllm_server: Annotated[
        str | None,
        typer.Option(
            "--vllm-server",
            help="Sample rollouts from this `trl vllm-serve` URL (TRL syncs the weights).",
        ),
    ] = None,
    report_to: ReportToOpt = "tensorboard",
    as_json: JsonOpt = False,
) -> None:
    """GRPO with BAR on one family's tasks, episodes in Orchard sandboxes (ORCHARD_URL, or an
    embedded service on the local Docker engine): `swe` graded by the tests, `gui` (text
    observations, whole-chat context) by its judge, `claw` by the task's rubric."""
    from orchard.train.grpo import GRPORunConfig, run_grpo
    from orchard.train.rollout import RolloutFailed

    chosen = _family(family)
    if reward not in ("pass", "score"):
        fail("bad_request", "--reward must be pass or score")
    fields = {
        "model": model,
        "output_dir": str(out_dir),
        "max_steps": max_steps,
        "group_size": group_size,
        "max_samples": max_samples,
        "stride": stride,
        "report_to": report_to,
        **_overrides(config),
    }
    if fork is not None:
        fields["fork"] = fork
    if vllm_server is not None:
        from orchard.train.vllm_server import server_mode

        with bad_request(ValueError):
            fields["extra"] = {**(fields.get("extra") or {}), **server_mode(vllm_server)}
    cfg = GRPORunConfig(**fields)
    sandbox_labels = labels(label)
    with bad_request(OSError, ValueError, KeyError):
        todo = chosen.load_tasks(tasks, task, category)
    if not todo:
        fail("bad_request", "no tasks chosen")
    with bad_request():
        the_judge = chosen.make_judge(judge, judge_url, judge_model, out_dir / "judge")
    options = RolloutOptions(
        labels=sandbox_labels,
        workers=workers,
        step_limit=step_limit,
        harness=harness,
        judge=the_judge,
        reward=reward,  # type: ignore[arg-type]
    )
    try:
        with connect(ctx) as client, _quiet_stdout():
            metrics, _ = run_grpo(cfg, chosen, todo, client, options)
    except RolloutFailed as e:  # every episode of a step failed: an infrastructure problem
        fail("rollout_failed", str(e))
    _emit(metrics, as_json, f"GRPO ({chosen.name})")


train_app.command("export-log")(export_log_command("grpo", "orchard train grpo --out"))
