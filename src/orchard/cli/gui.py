"""`orchard gui ...`: list tasks, run the web agent, judge saved runs, export SFT data."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from orchard.cli._common import JsonOpt, ModelNameOpt, bad_request, connect, fail, print_table
from orchard.cli._common import out as console
from orchard.cli._eval_log import NoEvalLogOpt, export_log_command, write_eval_log
from orchard.families.registry import get_family

if TYPE_CHECKING:
    from orchard.gui.types import Judge, WebTask

gui_app = typer.Typer(
    help="Web tasks in a sandboxed browser: tasks, agent runs, judging, SFT export.",
    epilog="[bold]Examples[/bold]\n\n"
    "  orchard gui tasks\n\n"
    "  orchard gui tasks --task shop-nordwind-shoe-42 --json\n\n"
    "  orchard gui run --model http://localhost:8000/v1 --model-name Qwen/Qwen2.5-VL-7B-Instruct "
    "--workers 4 --out runs/gui\n\n"
    "  orchard gui run --model replay:runs/gui --out runs/gui-replay --judge state\n\n"
    "  orchard gui eval --out runs/gui --judge webjudge --judge-url http://localhost:8001/v1\n\n"
    "  orchard gui export-sft --out runs/gui --dest data/gui-sft",
    no_args_is_help=True,
)
TasksOpt = Annotated[
    str,
    typer.Option(
        "--tasks",
        help="`sample` (the shipped offline tasks) or a task file (WebVoyager JSONL, "
        "Online-Mind2Web / DeepShop JSON).",
    ),
]
TaskOpt = Annotated[
    list[str] | None, typer.Option("--task", "-t", help="Only this task id (repeatable).")
]
OutOpt = Annotated[Path, typer.Option("--out", "-o", help="Run folder (resumable).")]
WorkersOpt = Annotated[int, typer.Option("--workers", "-w", min=1, help="Parallel browsers.")]
JudgeOpt = Annotated[str, typer.Option("--judge", "-j", help="state, webvoyager or webjudge.")]
JudgeUrlOpt = Annotated[
    str | None,
    typer.Option(
        "--judge-url",
        envvar="ORCHARD_JUDGE_URL",
        help="OpenAI-compatible base URL of the judge's vision model (LLM judges).",
    ),
]
JudgeNameOpt = Annotated[
    str,
    typer.Option("--judge-model", envvar="ORCHARD_JUDGE_MODEL", help="The judge's model name."),
]


def select_tasks(
    tasks: str, ids: list[str] | None, categories: list[str] | None = None
) -> list[WebTask]:
    """`--tasks` narrowed to `--task` ids (an unknown one fails) and `--category` names."""
    with bad_request(OSError, ValueError, KeyError):
        return get_family("gui").load_tasks(tasks, ids, categories)


def web_judge(spec: str, url: str | None, name: str, cache: Path | None) -> Judge:
    from orchard.gui.judges import make_judge

    with bad_request():
        return make_judge(spec, model_url=url, model_name=name, cache_dir=cache)


def _print_summary(summary: dict[str, Any], as_json: bool, title: str) -> None:
    if as_json:
        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
        return
    table = Table(title=title)
    cols = ("total", "finished", "scored", "success", "failure", "no_score", "errors")
    for col in (*cols, "success rate", "mean steps"):
        table.add_column(col.replace("_", " "), justify="right")
    rate = summary["success_rate"]
    table.add_row(
        *(str(summary[c]) for c in cols),
        "-" if rate is None else f"{rate:.1%}",
        str(summary["mean_steps"] if summary["mean_steps"] is not None else "-"),
    )
    print_table(table)


@gui_app.command("tasks")
def tasks_cmd(
    tasks: TasksOpt = "sample",
    task: TaskOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List the tasks (or show the chosen ones in full with --task)."""
    chosen = select_tasks(tasks, task)
    if as_json:
        sys.stdout.write(json.dumps([t.to_dict() for t in chosen], indent=2) + "\n")
        return
    if task:
        for t in chosen:
            Console().print_json(json.dumps(t.to_dict()))
        return
    table = Table(title=f"{len(chosen)} tasks")
    for col in ("id", "site", "category", "check", "task"):
        table.add_column(col, overflow="fold")
    for t in chosen:
        table.add_row(t.id, t.web_name, t.category, "yes" if t.check else "-", t.ques)
    print_table(table)


@gui_app.command()
def run(
    ctx: typer.Context,
    model: Annotated[
        str,
        typer.Option(
            "--model", "-m", help="OpenAI-compatible base URL, or replay:RUN_DIR (saved replies)."
        ),
    ],
    out: OutOpt,
    tasks: TasksOpt = "sample",
    task: TaskOpt = None,
    workers: WorkersOpt = 1,
    model_name: ModelNameOpt = "default",
    observation: Annotated[
        str, typer.Option(help="image (a screenshot) or text (accessibility tree).")
    ] = "image",
    context: Annotated[
        str, typer.Option(help="latest (one screenshot + text history) or chat.")
    ] = "latest",
    som: Annotated[bool, typer.Option("--som", help="Set-of-Mark screenshot + element tools.")] = (
        False
    ),
    max_steps: Annotated[int, typer.Option(min=1, help="Steps per episode.")] = 30,
    max_seconds: Annotated[float, typer.Option(help="Wall time per episode.")] = 1200.0,
    egress: Annotated[
        str,
        typer.Option(help="The browser's network: none (the offline sites only) or all."),
    ] = "none",
    allow: Annotated[
        list[str] | None,
        typer.Option("--allow", help="Only these hosts/CIDRs may be reached (repeatable)."),
    ] = None,
    judge: JudgeOpt = "state",
    judge_url: JudgeUrlOpt = None,
    judge_model: JudgeNameOpt = "default",
    redo: Annotated[bool, typer.Option("--redo", help="Run finished tasks again.")] = False,
    as_json: JsonOpt = False,
    no_eval_log: NoEvalLogOpt = False,
) -> None:
    """Run the agent on every task, judge each episode; writes result.json per task and the
    run as an Inspect log (run.eval).

    The browser is offline by default: the shipped tasks run on sites inside its sandbox.
    Tasks on the live web (WebVoyager, Online-Mind2Web) need `--egress all` or `--allow`.
    """
    from pydantic import ValidationError

    from orchard.env.models import NetworkPolicy
    from orchard.gui.browser_env import EnvConfig
    from orchard.gui.harness import GuiAgentConfig
    from orchard.gui.runner import model_factory, run_batch

    if observation not in ("image", "text") or context not in ("latest", "chat"):
        fail("bad_request", "--observation must be image or text, --context latest or chat")
    chosen = select_tasks(tasks, task)
    the_judge = web_judge(judge, judge_url, judge_model, out / "judge-cache")
    cfg = GuiAgentConfig(observation=observation, context=context, som=som)  # type: ignore[arg-type]
    with bad_request():
        factory = model_factory(model, cfg, name=model_name)
    try:
        network = NetworkPolicy(egress="allow" if allow else egress, allow=allow or [])  # type: ignore[arg-type]
    except ValidationError as e:
        fail("bad_request", f"--egress must be none or all ({e.errors()[0]['msg']})")
    env_cfg = EnvConfig(max_steps=max_steps, max_seconds=max_seconds, network=network)
    with connect(ctx) as client:
        summary = run_batch(
            client,
            chosen,
            factory,
            cfg,
            out,
            env_config=env_cfg,
            judge=the_judge,
            workers=workers,
            redo=redo,
        )
    if not no_eval_log:
        write_eval_log(out, "gui")
    _print_summary(summary, as_json, f"GUI run ({judge} judge)")


@gui_app.command("eval")
def eval_(
    out: OutOpt,
    judge: JudgeOpt = "webvoyager",
    judge_url: JudgeUrlOpt = None,
    judge_model: JudgeNameOpt = "default",
    tasks: TasksOpt = "sample",
    workers: WorkersOpt = 4,
    redo: Annotated[bool, typer.Option("--redo", help="Judge judged tasks again.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Judge a saved run again with any judge; writes eval/<judge>.json per task."""
    from orchard.gui.runner import evaluate

    chosen = select_tasks(tasks, None)
    the_judge = web_judge(judge, judge_url, judge_model, out / "judge-cache")
    summary = evaluate(chosen, out, the_judge, workers=workers, redo=redo)
    _print_summary(summary, as_json, f"GUI eval ({judge} judge)")


@gui_app.command("export-sft")
def export_sft(
    out: OutOpt,
    dest: Annotated[Path, typer.Option("--dest", "-d", help="Where dataset.jsonl goes.")],
    all_episodes: Annotated[
        bool, typer.Option("--all", help="Keep failed episodes too (default: successes only).")
    ] = False,
    judge: Annotated[
        str | None, typer.Option("--judge", help="Success by this eval's verdicts instead.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Training rows (messages with image files, tools) from a run's successful episodes."""
    from orchard.gui.runner import export_sft as export

    rows = export(out, dest, only_success=not all_episodes, judge=judge)
    counts = {"rows": len(rows), "episodes": len({r["instance_id"] for r in rows})}
    if as_json:
        sys.stdout.write(json.dumps(counts) + "\n")
    else:
        console.print(
            f"{counts['rows']} rows from {counts['episodes']} episodes in {dest / 'dataset.jsonl'}"
        )


gui_app.command("export-log")(export_log_command("gui"))
