"""Run folders as Inspect logs from the CLI: `orchard <family> export-log RUN_DIR`, and the
`run.eval` that `orchard <family> run` writes at its end (`--no-eval-log` skips it).

The log is a view of the run folder, never its record: a failure to write it is reported
on stderr and leaves the run's own results (and exit status) as they are.
"""

from __future__ import annotations

import importlib.util
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from orchard.cli._common import err, fail

NoEvalLogOpt = Annotated[
    bool,
    typer.Option(
        "--no-eval-log", help="Do not write the run as an Inspect log (run.eval in --out)."
    ),
]
RunDirArg = Annotated[Path, typer.Argument(help="A run folder (the --out of a run).")]
LogOutOpt = Annotated[
    Path | None,
    typer.Option("--out", "-o", help="The .eval file to write (default: RUN_DIR/run.eval)."),
]


def _hint(path: Path) -> str:
    folder = shlex.quote(str(path.parent))
    return f"Inspect log: {path}\n  open it with: inspect view --log-dir {folder}"


def write_eval_log(out: Path, family: str) -> Path | None:
    """`out` as `out/run.eval`, announced on stderr; a failure is a warning, not an error."""
    if importlib.util.find_spec("inspect_ai") is None:  # an optional extra
        err.print(
            "note: no Inspect log written: inspect_ai is not installed "
            "(pip install 'orchard[integrations]'; --no-eval-log skips this)",
            markup=False,
        )
        return None
    from orchard.integrations.inspect_log import export_log

    try:
        path = export_log(out, family)
    except Exception as e:  # the run stands without its log
        err.print(f"warning: no Inspect log written: {type(e).__name__}: {e}", markup=False)
        return None
    err.print(_hint(path), markup=False, soft_wrap=True)
    return path


def export_log_command(
    family: str, source: str | None = None
) -> Callable[[Path, Path | None], None]:
    """The `export-log` command of `family`'s CLI (`source`: the command that made the
    folder, default `orchard FAMILY run`)."""

    def export_log_cmd(run_dir: RunDirArg, out: LogOutOpt = None) -> None:
        from orchard.integrations.inspect_log import export_log

        try:
            path = export_log(run_dir, family, out)
        except FileNotFoundError as e:
            fail("not_found", str(e))
        except ValueError as e:
            fail("bad_request", str(e))
        typer.echo(str(path))
        err.print(_hint(path), markup=False, soft_wrap=True)

    export_log_cmd.__doc__ = (
        f"Convert an `{source or f'orchard {family} run'}` folder into an Inspect log (.eval) for "
        "`inspect view`: one sample per attempt, transcript, score and metadata."
    )
    return export_log_cmd
