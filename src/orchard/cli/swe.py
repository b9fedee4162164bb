"""`orchard swe ...`: build sample images, run the harness, grade predictions, distill."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from orchard.cli._common import (
    Connection,
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

swe_app = typer.Typer(
    help="SWE-bench-style tasks: images, agent runs, grading, distillation.",
    epilog="[bold]Examples[/bold]\n\n"
    "  orchard swe build-images --tasks sample\n\n"
    "  orchard swe run --tasks sample --model replay:src/orchard/swe/sample/trajectories "
    "--workers 2 --out runs/demo\n\n"
    "  orchard swe run --tasks verified.parquet --model http://localhost:8000/v1 "
    "--model-name Qwen/Qwen3-8B --workers 16 --out runs/q3\n\n"
    "  orchard swe eval --preds runs/q3/preds.json --tasks verified.parquet --out runs/q3-eval",
    no_args_is_help=True,
)
TasksOpt = Annotated[
    str,
    typer.Option(
        "--tasks",
        help="`sample` (the toy suite), `real` (the shipped tasks from real PyPI projects), a "
        ".jsonl/.json/.parquet file or a datasets folder.",
    ),
]
OutOpt = Annotated[Path, typer.Option("--out", "-o", help="Output folder (resumable).")]
WorkersOpt = Annotated[int, typer.Option("--workers", "-w", min=1, help="Parallel instances.")]
InstanceOpt = Annotated[
    list[str] | None, typer.Option("--instance", "-i", help="Only this instance id (repeatable).")
]
ModelOpt = Annotated[
    str, typer.Option("--model", "-m", help="OpenAI-compatible base URL, or replay:PATH.")
]
ModeOpt = Annotated[
    str, typer.Option("--mode", help="text (```bash blocks) or tool (a bash tool).")
]
ForkOpt = Annotated[
    bool,
    typer.Option(
        "--fork/--no-fork",
        help="Set a task with a set-up up once and start its attempts and gradings as copies "
        "of that state (where the backend keeps snapshots; else each runs the set-up).",
    ),
]
SetupOpt = Annotated[
    str | None,
    typer.Option(
        "--setup",
        help="A bash script run in each task's folder before its attempts (the tasks' own "
        "`setup_script`, replaced).",
    ),
]
ConfigOpt = Annotated[
    Path | None, typer.Option("--config", "-c", help="Harness YAML (default: the built-in one).")
]


def _load(tasks: str, instance: list[str] | None, setup: str | None = None) -> list[Any]:
    with bad_request(OSError, ValueError, KeyError):
        chosen = get_family("swe").load_tasks(tasks, instance)
    if setup is not None:
        chosen = [t.model_copy(update={"setup_script": setup}) for t in chosen]
    return chosen


def _images(ctx: typer.Context, chosen: list[Any]) -> None:
    """With an in-process service (no --url, no ORCHARD_URL), build the images of sample and
    synthesized rows that the local engine lacks, as `build-images` would; a remote service
    has its own engine, so nothing is built for it."""
    from orchard.env.images import ImageBuildError
    from orchard.env.sdk.core import resolve_target
    from orchard.swe.images import build_images, missing

    conn = ctx.find_object(Connection) or Connection()
    if resolve_target(conn.url, conn.api_key) is not None:
        return
    try:
        todo = missing(chosen)
    except (OSError, ImageBuildError):
        return  # no local engine to ask: the service reports a missing image itself
    if todo:
        err.print(f"building {len({t.image for t in todo})} task image(s) ...", markup=False)
        with bad_request(ImageBuildError, OSError, ValueError):
            build_images(todo)


def _print_summary(summary: dict[str, Any], as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
        return
    table = Table(title="SWE results")
    for col in (
        "total",
        "submitted",
        "completed",
        "resolved",
        "unresolved",
        "empty patch",
        "errors",
    ):
        table.add_column(col, justify="right")
    keys = ("total", "submitted", "completed", "resolved", "unresolved", "empty_patch", "error")
    table.add_row(*(str(summary[f"{k}_instances"]) for k in keys))
    print_table(table)


def _setup(mode: str, config: Path | None, step_limit: int | None) -> tuple[Any, dict[str, Any]]:
    from orchard.swe.harness import load_config

    if mode not in ("text", "tool"):
        fail("bad_request", "--mode must be text or tool")
    return load_config(config, mode=mode, step_limit=step_limit)


@swe_app.command("build-images")
def build_images(
    tasks: TasksOpt = "sample", instance: InstanceOpt = None, as_json: JsonOpt = False
) -> None:
    """Build the tasks' images offline (sample and synthesized rows, `real` included; cached by
    content; the first build takes minutes)."""
    from orchard.env.images import ImageBuildError
    from orchard.swe.images import build_images as build

    chosen = _load(tasks, instance)
    with bad_request(ImageBuildError, ValueError):
        tags = build(chosen, on_built=lambda iid, tag: err.print(f"{iid}: {tag}", markup=False))
    if as_json:
        sys.stdout.write(json.dumps(tags, indent=2) + "\n")


@swe_app.command()
def run(
    ctx: typer.Context,
    model: ModelOpt,
    out: OutOpt,
    tasks: TasksOpt = "sample",
    workers: WorkersOpt = 1,
    model_name: ModelNameOpt = "default",
    mode: ModeOpt = "text",
    config: ConfigOpt = None,
    step_limit: Annotated[int | None, typer.Option(help="Override the step limit.")] = None,
    instance: InstanceOpt = None,
    no_grade: Annotated[bool, typer.Option("--no-grade", help="Only run the agent.")] = False,
    redo: Annotated[bool, typer.Option("--redo", help="Run finished instances again.")] = False,
    label: LabelOpt = None,
    fork: ForkOpt = True,
    setup: SetupOpt = None,
    as_json: JsonOpt = False,
    no_eval_log: NoEvalLogOpt = False,
) -> None:
    """Run the agent on every task (and grade it); writes preds.json, trajectories, reports
    and the run as an Inspect log (run.eval)."""
    from orchard.swe.runner import model_factory, run_batch

    chosen = _load(tasks, instance, setup)
    agent_cfg, model_cfg = _setup(mode, config, step_limit)
    factory = model_factory(model, name=model_name, mode=mode, params=model_cfg)
    _images(ctx, chosen)
    with connect(ctx) as client:
        summary = run_batch(
            client,
            chosen,
            factory,
            agent_cfg,
            out,
            workers=workers,
            do_grade=not no_grade,
            redo=redo,
            labels=labels(label),
            fork=fork,
        )
    if not no_eval_log:
        write_eval_log(out, "swe")
    _print_summary(summary, as_json)


@swe_app.command("eval")
def eval_(
    ctx: typer.Context,
    preds: Annotated[
        Path, typer.Option("--preds", help="preds.json or .jsonl (SWE-bench format).")
    ],
    out: OutOpt,
    tasks: TasksOpt = "sample",
    workers: WorkersOpt = 1,
    redo: Annotated[bool, typer.Option("--redo", help="Grade graded instances again.")] = False,
    label: LabelOpt = None,
    setup: SetupOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Grade predictions from any source; per-instance report.json and a summary."""
    from orchard.swe.grading import load_predictions
    from orchard.swe.runner import evaluate

    chosen = _load(tasks, None, setup)
    _images(ctx, chosen)
    with connect(ctx) as client:
        summary = evaluate(
            client,
            chosen,
            load_predictions(preds),
            out,
            workers=workers,
            redo=redo,
            labels=labels(label),
        )
    _print_summary(summary, as_json)


@swe_app.command()
def distill(
    ctx: typer.Context,
    model: ModelOpt,
    out: OutOpt,
    tasks: TasksOpt = "sample",
    k: Annotated[int, typer.Option("-k", min=1, help="Attempts per task.")] = 4,
    workers: WorkersOpt = 1,
    model_name: ModelNameOpt = "default",
    mode: ModeOpt = "text",
    config: ConfigOpt = None,
    instance: InstanceOpt = None,
    label: LabelOpt = None,
    fork: ForkOpt = True,
    setup: SetupOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Run a teacher k times per task, grade each attempt, write dataset.jsonl / .parquet."""
    from orchard.swe.runner import distill as run_distill
    from orchard.swe.runner import model_factory

    chosen = _load(tasks, instance, setup)
    agent_cfg, model_cfg = _setup(mode, config, None)
    factory = model_factory(model, name=model_name, mode=mode, params=model_cfg)
    _images(ctx, chosen)
    with connect(ctx) as client:
        rows = run_distill(
            client,
            chosen,
            factory,
            agent_cfg,
            out,
            k=k,
            workers=workers,
            labels=labels(label),
            fork=fork,
        )
    counts = {"rows": len(rows), "resolved": sum(1 for r in rows if r["resolved"])}
    if as_json:
        sys.stdout.write(json.dumps(counts) + "\n")
    else:
        console.print(f"{counts['rows']} trajectories ({counts['resolved']} resolved) in {out}")


@swe_app.command("to-mini")
def to_mini(
    src: Annotated[Path, typer.Argument(help="An Orchard trajectory (.traj.json).")],
    dst: Annotated[Path, typer.Argument(help="Where to write mini-swe-agent's format.")],
) -> None:
    """Convert a trajectory to mini-swe-agent's format (for its inspector and tools)."""
    from orchard.swe.trajectory import SweTrajectory

    dst.write_text(json.dumps(SweTrajectory.load(src).to_minisweagent(), indent=1))


swe_app.command("export-log")(export_log_command("swe"))


@swe_app.command(
    help="Synthesize SWE tasks from a real PyPI project's own test suite, offline.\n\n"
    "Downloads the sdist (pip, cached), builds its image from the Debian Python base (no "
    "pulls) with the test dependencies the sdist declares (or --test-deps) installed from"
    " wheels pip downloads, runs the suite twice and keeps the tests that pass both times"
    " (slow and flaky ones are dropped), then applies SWE-smith's procedural modifiers to"
    " one function or class at a time. A candidate is kept when some tests fail "
    "(FAIL_TO_PASS) and the rest pass (PASS_TO_PASS), and the harness's own grading "
    "resolves its gold patch and not the empty one. A second run with the same -o skips "
    "what is already decided. Problem statements are written by the model at "
    "$ORCHARD_MODEL_URL ($ORCHARD_MODEL_NAME) when set, else from a template over the "
    "failing tests; neither ever holds the patch.",
    epilog="[bold]Examples[/bold]\n\n"
    "  orchard swe synth more-itertools==11.2.1 --n 5 -o real/more-itertools.jsonl\n\n"
    "  orchard swe synth more-itertools==11.2.1 --n 20 --modifiers func_pm_op_change "
    "--modifiers func_pm_remove_cond --jobs 2 --seed 1 -o mi.jsonl\n\n"
    "  orchard swe run --tasks mi.jsonl --model http://localhost:8000/v1 --out runs/mi\n\n"
    "Modifiers (SWE-smith's): func_pm_class_rm_base, func_pm_class_rm_funcs, "
    "func_pm_class_shuffle_funcs, func_pm_ctrl_invert_if, func_pm_ctrl_shuffle, "
    "func_pm_remove_assign, func_pm_remove_cond, func_pm_remove_loop, func_pm_remove_wrapper, "
    "func_pm_op_break_chains, func_pm_op_change_const, func_pm_op_change, func_pm_op_swap",
)
def synth(
    ctx: typer.Context,
    spec: Annotated[str, typer.Argument(help="The project on PyPI, pinned: NAME==VERSION.")],
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Task rows (.jsonl), appended; resumable.")
    ],
    n: Annotated[int, typer.Option("--n", min=1, help="Stop after this many kept tasks.")] = 10,
    modifiers: Annotated[
        list[str] | None,
        typer.Option("--modifiers", help="Only these modifiers (repeatable; default all)."),
    ] = None,
    seed: Annotated[int, typer.Option(help="Orders entities and seeds the modifiers.")] = 0,
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, help="Parallel sandboxes.")] = 1,
    max_candidates: Annotated[
        int | None, typer.Option(help="Try at most this many candidates (default 20 x --n).")
    ] = None,
    slow_s: Annotated[
        float, typer.Option(help="Drop tests slower than this in the baseline (seconds).")
    ] = 1.0,
    per_entity: Annotated[
        int,
        typer.Option(min=0, help="At most this many candidates per function or class (0: no cap)."),
    ] = 2,
    fork: Annotated[
        bool,
        typer.Option(
            "--fork/--no-fork",
            help="Start each candidate as a copy of the prepared sandbox (else a fresh one).",
        ),
    ] = True,
    test_deps: Annotated[
        list[str] | None,
        typer.Option(
            "--test-deps",
            help="A requirement the tests need, installed from a PyPI wheel (repeatable; "
            "replaces what the sdist declares; `none`: install nothing).",
        ),
    ] = None,
    label: LabelOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Synthesize SWE tasks from a real PyPI project's own test suite, offline."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from orchard.swe.synth.pipeline import Counts, synthesize
    from orchard.swe.synth.source import SourceError
    from orchard.swe.synth.statement import model_from_env

    def line(c: Counts) -> str:
        why = ", ".join(f"{k} {v}" for k, v in sorted(c.dropped.items())) or "none"
        return (
            f"candidates {c.candidates} · compiled {c.compiled} · tried {c.tried} · "
            f"failing {c.failing} · [green]kept {c.kept}/{n}[/green] · skipped {c.skipped} · "
            f"dropped: {why}"
        )

    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with (
        connect(ctx) as client,
        Progress(*columns, console=err, disable=as_json, transient=False) as bar,
    ):
        task = bar.add_task(f"{spec}: fetching, building, baseline ...", total=None)
        with bad_request(SourceError, ValueError):
            counts = synthesize(
                client,
                spec,
                out,
                n=n,
                modifiers=modifiers,
                seed=seed,
                jobs=jobs,
                max_candidates=max_candidates,
                fork=fork,
                slow_s=slow_s,
                per_entity=per_entity or None,
                labels=labels(label),
                model=model_from_env(),
                progress=lambda c: bar.update(task, description=line(c)),
                test_deps=None if test_deps is None else [d for d in test_deps if d != "none"],
            )
    summary = counts.summary()
    if as_json:
        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
        return
    if counts.notice:
        err.print(counts.notice, style="yellow", markup=False)
    if counts.test_deps:
        err.print(f"test dependencies (wheels): {' '.join(counts.test_deps)}", markup=False)
    table = Table(title=f"synth {spec} -> {out}")
    for col in ("modifier", "tried", "kept"):
        table.add_column(col, justify="right" if col != "modifier" else "left")
    for name, per in sorted(counts.per_modifier.items()):
        table.add_row(name, str(per["tried"]), str(per["kept"]))
    tried = sum(per["tried"] for per in counts.per_modifier.values())
    table.add_row("[bold]total[/bold]", str(tried), str(counts.kept))
    print_table(table)
    v = summary["validation_s"]
    console.print(
        f"baseline {counts.baseline_s:.1f} s/run · validation "
        + (f"{v['mean']:.1f} s/candidate" if v["mean"] is not None else "none this run")
        + f" ({'fork' if counts.fork else 'fresh'}) · dropped {json.dumps(counts.dropped)}",
        markup=False,
    )
