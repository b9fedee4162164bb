"""`orchard` command line: run the service, create, use and clean up sandboxes, and drive
the task families (`swe`, `gui`, `claw`) and training (`train`).

One module per command group (`sandbox`, `volume`, `serve`, `swe`, `gui`, `claw`, `train`,
`dashboard`), what they share in `_common`. Commands import the libraries; no library
imports a command.
Every command takes `--json` (machine-readable output only, on stdout). Errors print one
line, `error: <code>: <message>`, on stderr and exit non-zero; never a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Annotated, Any

import typer

from orchard.cli._common import Connection, err, examples
from orchard.cli.claw import claw_app
from orchard.cli.dashboard import dashboard_app
from orchard.cli.gui import gui_app
from orchard.cli.pool import pool_app
from orchard.cli.sandbox import sandbox_app
from orchard.cli.serve import serve_app
from orchard.cli.state import snapshot_app
from orchard.cli.swe import swe_app
from orchard.cli.train import train_app
from orchard.cli.usage import usage_app
from orchard.cli.volume import volume_app
from orchard.env.errors import OrchardError

__all__ = ["app", "main"]

app = typer.Typer(
    name="orchard",
    help="Orchard: fast, secure sandboxes for LLM agents.",
    epilog=examples(
        "orchard serve --uds /tmp/orchard.sock",
        "export ORCHARD_URL=unix:///tmp/orchard.sock",
        "ID=$(orchard sandbox create busybox:latest)",
        "orchard sandbox exec $ID -- uname -a",
        "orchard sandbox rm $ID",
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(serve_app)  # `orchard serve`: a command of the root, not a group
app.add_typer(usage_app)  # `orchard usage`
app.add_typer(dashboard_app)  # `orchard dashboard --runs DIR`
app.add_typer(sandbox_app, name="sandbox")
app.add_typer(snapshot_app, name="snapshot")
app.add_typer(volume_app, name="volume")
app.add_typer(pool_app, name="pool")
app.add_typer(swe_app, name="swe")
app.add_typer(train_app, name="train")
app.add_typer(claw_app, name="claw")
app.add_typer(gui_app, name="gui")


@app.callback()
def _connection(
    ctx: typer.Context,
    url: Annotated[
        str | None,
        typer.Option(
            "--url",
            envvar="ORCHARD_URL",
            help="Service URL (http://host:port or unix:///path.sock). "
            "Unset: run the service in-process on local Docker.",
        ),
    ] = None,
    api_key: Annotated[
        str | None, typer.Option("--api-key", envvar="ORCHARD_API_KEY", help="API key.")
    ] = None,
) -> None:
    ctx.obj = Connection(url, api_key)


def _run(invoke: Callable[[], Any]) -> int:
    try:
        invoke()
    except OrchardError as exc:
        err.print(f"error: {exc.code}: {exc.message}", markup=False)
        return 1
    except FileNotFoundError as exc:
        err.print(f"error: not_found: {exc}", markup=False)
        return 1
    except KeyboardInterrupt:
        return 130
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except Exception as exc:  # a bug or an unexpected failure: still one line, no traceback
        err.print(f"error: internal: {type(exc).__name__}: {exc}", markup=False)
        return 1
    return 0


def main(argv: list[str] | None = None) -> None:
    sys.exit(_run(lambda: app(args=argv, prog_name="orchard")))
