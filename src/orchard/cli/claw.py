"""`orchard claw ...`: run and grade Claw tasks, pass@k, synthesis, SFT export, the MCP server."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from orchard.cli._common import (
    JsonOpt,
    LabelOpt,
    ModelNameOpt,
    bad_request,
    connect,
    err,
    fail,
    labels,
    print_table,
)
from orchard.cli._common import out as console
from orchard.cli._eval_log import NoEvalLogOpt, export_log_command, write_eval_log
from orchard.families.registry import get_family

if TYPE_CHECKING:
    from orchard.claw.spec import TaskSpec

claw_app = typer.Typer(
    help="Productivity-tool tasks (mail, calendar, files, ...): runs, pass@k, synthesis.",
    epilog="[bold]Examples[/bold]\n\n"
    "  orchard claw tasks list\n\n"
    "  orchard claw run --model reference --out runs/ref    (replays the reference solutions)\n\n"
    "  orchard claw run --model http://localhost:8000/v1 --model-name Qwen/Qwen3-8B "
    "-k 3 --workers 4 --out runs/q3\n\n"
    "  orchard claw eval runs/q3 -k 3 --regrade --judge http://localhost:8001/v1\n\n"
    "  orchard claw synthesize --model http://localhost:8000/v1 --n 20 --out my-tasks\n\n"
    "  orchard claw export-sft runs/q3 --out sft.jsonl",
    no_args_is_help=True,
)
tasks_app = typer.Typer(help="List, inspect and validate task specs.", no_args_is_help=True)
claw_app.add_typer(tasks_app, name="tasks")
TasksOpt = Annotated[
    Path | None,
    typer.Option("--tasks", help="A spec file or folder of specs (default: the shipped tasks)."),
]
TaskIdOpt = Annotated[
    list[str] | None, typer.Option("--task", "-t", help="Only this task id (repeatable).")
]
CategoryOpt = Annotated[
    list[str] | None, typer.Option("--category", help="Only this category (repeatable).")
]
KOpt = Annotated[int, typer.Option("-k", min=1, help="Trials per task (pass@k, pass^k).")]
JudgeOpt = Annotated[
    str | None,
    typer.Option("--judge", help="OpenAI-compatible base URL of an LLM rubric judge."),
]
JudgeNameOpt = Annotated[
    str, typer.Option("--judge-model", help="Model name sent to the judge endpoint.")
]


# Column names of `tasks list` for the keys of `tasks.task_traits`.
TRAITS = (
    ("multi-turn", "multi_turn"),
    ("llm-user", "llm_user"),
    ("faults", "faults"),
    ("safety", "safety"),
)


def select_tasks(
    path: Path | None, ids: list[str] | None = None, categories: list[str] | None = None
) -> list[TaskSpec]:
    """The specs at `path` (None: the shipped ones) narrowed to `ids` (an unknown one fails)
    and `categories`."""
    with bad_request():
        return get_family("claw").load_tasks(str(path or "sample"), ids, categories)


def _print_summary(summary: dict[str, Any], as_json: bool) -> None:
    from orchard.claw.metrics import table_header, table_rows

    if as_json:
        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
        return
    table = Table(title=f"Claw results (k={summary['k']})")
    for i, col in enumerate(table_header(summary["k"])):
        table.add_column(col, justify="left" if i == 0 else "right")
    for row in table_rows(summary):
        table.add_row(*row)
    print_table(table)
    for e in summary.get("errors") or []:
        err.print(f"error: {e}", markup=False)


# ---------------------------------------------------------------- run / eval


@claw_app.command()
def run(
    ctx: typer.Context,
    model: Annotated[
        str,
        typer.Option(
            "--model", "-m", help="OpenAI-compatible base URL, `reference` or `null` (scripted)."
        ),
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder (resumable).")],
    tasks: TasksOpt = None,
    task: TaskIdOpt = None,
    category: CategoryOpt = None,
    k: KOpt = 1,
    workers: Annotated[int, typer.Option("--workers", "-w", min=1, help="Parallel worlds.")] = 1,
    harness: Annotated[str, typer.Option("--harness", help="tools or assistant.")] = "tools",
    model_name: ModelNameOpt = "default",
    temperature: Annotated[float | None, typer.Option(help="Sampling temperature.")] = None,
    step_limit: Annotated[int, typer.Option(help="Model calls per trial.")] = 30,
    time_limit: Annotated[float, typer.Option(help="Seconds per trial.")] = 600.0,
    judge: JudgeOpt = None,
    judge_model: JudgeNameOpt = "default",
    user_model: Annotated[
        str | None,
        typer.Option(
            "--user-model",
            help="OpenAI-compatible base URL of an LLM playing the simulated user of "
            "multi-turn tasks (default: their scripted follow-ups).",
        ),
    ] = None,
    user_model_name: Annotated[
        str, typer.Option("--user-model-name", help="Model name sent to the user endpoint.")
    ] = "default",
    redo: Annotated[bool, typer.Option("--redo", help="Forget finished trials.")] = False,
    label: LabelOpt = None,
    as_json: JsonOpt = False,
    no_eval_log: NoEvalLogOpt = False,
) -> None:
    """Run k graded trials of every task; writes results.jsonl, trajectories, summary.json
    and the run as an Inspect log (run.eval). Exits 1 when a trial broke on infrastructure
    (a model endpoint or sandbox that failed): the same command runs those again."""
    from orchard.claw.harness import HarnessConfig
    from orchard.claw.judge import rubric_judge
    from orchard.claw.runner import model_factory, run_trials
    from orchard.claw.usersim import user_model_factory

    chosen = select_tasks(tasks, task, category)
    with bad_request():
        users = user_model_factory(user_model, name=user_model_name) if user_model else None
        config = HarnessConfig(
            harness,  # type: ignore[arg-type]
            step_limit=step_limit,
            wall_time_limit_s=time_limit,
            user_model=users,
        )
        params = {"temperature": temperature} if temperature is not None else {}
        factory = model_factory(model, name=model_name, params=params)
    with connect(ctx) as client:
        summary = run_trials(
            client,
            chosen,
            factory,
            config,
            out,
            k=k,
            workers=workers,
            judge=rubric_judge(judge, judge_model, out / "judge-cache"),
            redo=redo,
            labels=labels(label),
        )
    if not no_eval_log:
        write_eval_log(out, "claw")
    _print_summary(summary, as_json)
    if summary.get("errors"):  # a script must see that the run is not complete
        n = len(summary["errors"])
        err.print(
            f"error: {n} trial(s) broke on infrastructure and were not graded; "
            "the same command runs them again",
            markup=False,
        )
        raise typer.Exit(1)


@claw_app.command("eval")
def eval_(
    out: Annotated[Path, typer.Argument(help="A run folder (with results.jsonl).")],
    k: KOpt = 1,
    tasks: TasksOpt = None,
    regrade: Annotated[
        bool, typer.Option("--regrade", help="Grade the saved trajectories again.")
    ] = False,
    judge: JudgeOpt = None,
    judge_model: JudgeNameOpt = "default",
    as_json: JsonOpt = False,
) -> None:
    """Recompute pass@k / pass^k of a run (for any k); --regrade grades it again first."""
    from orchard.claw.judge import rubric_judge
    from orchard.claw.runner import read_results, write_summary
    from orchard.claw.runner import regrade as do_regrade

    rows = read_results(out)
    if not rows:
        fail("bad_request", f"no results.jsonl in {out}")
    if regrade or judge:
        summary = do_regrade(
            select_tasks(tasks),
            out,
            k=k,
            judge=rubric_judge(judge, judge_model, out / "judge-cache"),
        )
    else:
        summary = write_summary(out, k, [r for r in rows if r["trial"] < k])
    _print_summary(summary, as_json)


@claw_app.command("export-sft")
def export_sft(
    run_dir: Annotated[Path, typer.Argument(help="A run folder (with results.jsonl).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="JSONL file to write.")],
    min_score: Annotated[
        float | None, typer.Option(help="Keep trials scoring at least this (default: passed).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Passing trials as chat rows with their tools ({"messages", "tools", ...}) for SFT."""
    from orchard.claw.runner import export_sft as do_export

    n = do_export(run_dir, out, min_score=min_score)
    if as_json:
        sys.stdout.write(json.dumps({"rows": n, "out": str(out)}) + "\n")
    else:
        console.print(f"{n} trajectories in {out}")


# ---------------------------------------------------------------- tasks


@tasks_app.command("list")
def tasks_list(
    tasks: TasksOpt = None, category: CategoryOpt = None, as_json: JsonOpt = False
) -> None:
    """One line per task (id, category, what it exercises, request), then the counts per
    category."""
    specs = select_tasks(tasks, None, category)
    if as_json:
        rows = [
            {
                "id": s.id,
                "category": s.category,
                "services": s.services,
                "request": s.request,
                **s.traits(),
            }
            for s in specs
        ]
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    table = Table(title=f"{len(specs)} Claw tasks")
    table.add_column("id", no_wrap=True)  # whole, to be copied; services: see --json or show
    for col in ("category", "traits", "request"):
        table.add_column(col)
    for s in specs:
        t = s.traits()
        traits = [name for name, on in TRAITS if t[on]]
        request = s.request if len(s.request) <= 60 else s.request[:57] + "..."
        table.add_row(s.id, s.category, " ".join(traits), request)
    print_table(table)
    counts = Table(title="per category")
    for i, col in enumerate(("category", "tasks", *(name for name, _ in TRAITS))):
        counts.add_column(col, justify="left" if i == 0 else "right")
    for cat, row in _trait_counts(specs).items():
        counts.add_row(cat, *(str(v) for v in row))
    print_table(counts)


def _trait_counts(specs: list[TaskSpec]) -> dict[str, list[int]]:
    """Per category (and "all"): tasks, then how many have each of `TRAITS`."""
    out: dict[str, list[int]] = {}
    for s in specs:
        t = s.traits()
        row = [1, *(int(bool(t[key])) for _, key in TRAITS)]
        for cat in (s.category, "all"):
            out[cat] = [a + b for a, b in zip(out.get(cat, [0] * len(row)), row, strict=True)]
    return dict(sorted(out.items(), key=lambda kv: (kv[0] == "all", kv[0])))


@tasks_app.command("show")
def tasks_show(
    task_id: Annotated[str, typer.Argument(help="A task id.")], tasks: TasksOpt = None
) -> None:
    """Print one spec as JSON."""
    (spec,) = select_tasks(tasks, [task_id])
    sys.stdout.write(json.dumps(spec.model_dump(mode="json"), indent=2) + "\n")


@tasks_app.command("validate")
def tasks_validate(
    ctx: typer.Context,
    tasks: TasksOpt = None,
    task: TaskIdOpt = None,
    run_policies: Annotated[
        bool,
        typer.Option(
            "--run", help="Also check in a world: the reference passes, the null policy fails."
        ),
    ] = False,
    label: LabelOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Load and check specs (schema, tools, checks); --run also plays both scripted policies."""
    specs = select_tasks(tasks, task)
    problems: dict[str, str] = {}
    if run_policies:
        from orchard.claw.synthesize import DraftError, check_draft
        from orchard.claw.world import World

        with connect(ctx) as client, World.start(client, labels=labels(label)) as world:
            for s in specs:
                try:
                    check_draft(world, s)
                except DraftError as e:
                    problems[s.id] = str(e)
    report = {"tasks": len(specs), "ok": len(specs) - len(problems), "problems": problems}
    if as_json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        for tid, why in problems.items():
            err.print(f"{tid}: {why}", markup=False)
        console.print(f"{report['ok']}/{len(specs)} tasks valid")
    if problems:
        raise typer.Exit(1)


# ---------------------------------------------------------------- synthesize / mcp


@claw_app.command()
def synthesize(
    ctx: typer.Context,
    model: Annotated[
        str, typer.Option("--model", "-m", help="OpenAI-compatible base URL of the drafter.")
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for kept specs and rejects.")],
    n: Annotated[int, typer.Option("--n", min=1, help="Specs to keep.")] = 10,
    seed: Annotated[
        int, typer.Option(help="Seeds example choice and the endpoint's sampling.")
    ] = 0,
    max_attempts: Annotated[
        int | None, typer.Option(help="Drafts to ask for at most (default 4n).")
    ] = None,
    model_name: ModelNameOpt = "default",
    temperature: Annotated[float, typer.Option(help="Sampling temperature.")] = 0.8,
    examples: TasksOpt = None,
    label: LabelOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Draft task specs with an LLM; keep those whose reference passes and null policy fails."""
    from orchard.claw.synthesize import synthesize as run_synthesis
    from orchard.claw.world import World
    from orchard.llm.client import OpenAIModel

    shown = select_tasks(examples)
    drafter = OpenAIModel(
        model, name=model_name, temperature=temperature, extra_body={"seed": seed}
    )
    with connect(ctx) as client, World.start(client, labels=labels(label)) as world:
        report = run_synthesis(
            drafter, world, out, n=n, examples=shown, seed=seed, max_attempts=max_attempts
        )
    if as_json:
        sys.stdout.write(json.dumps(report.__dict__, indent=2) + "\n")
    else:
        console.print(
            f"kept {len(report.accepted)} of {report.attempts} drafts in {out} "
            f"(rejects: {out / 'rejects.jsonl'})"
        )
    if len(report.accepted) < n:
        raise typer.Exit(1)


@claw_app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def mcp(ctx: typer.Context) -> None:
    """The Claw tools as an MCP server (`python -m orchard.claw.mcp_server`; try `--help`)."""
    os.execv(sys.executable, [sys.executable, "-m", "orchard.claw.mcp_server", *ctx.args])


claw_app.command("export-log")(export_log_command("claw"))
