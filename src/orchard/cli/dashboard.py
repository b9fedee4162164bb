"""`orchard dashboard --runs DIR`: the runs viewer, local web pages over run folders."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated

import typer

from orchard.cli._common import err, examples, fail

dashboard_app = typer.Typer()


def _log(line: str) -> None:
    err.print(line, markup=False)


@dashboard_app.command(
    epilog=examples(
        "orchard swe run --out runs/swe-1 && orchard dashboard --runs runs",
        "orchard dashboard --runs /tmp/orchard-swe-demo-x1y2  # the folder `make demo` printed",
        "orchard dashboard --runs runs --port 9000",
        "curl -s http://127.0.0.1:8765/runs.json | jq .   # the list, for scripts",
    )
)
def dashboard(
    runs: Annotated[
        Path,
        typer.Option(
            "--runs",
            help="A folder of run folders (or one run folder): the --out of `orchard swe run`, "
            "`orchard gui run`, `orchard claw run` (pass@k with -k), the SWE demo's folder. "
            "Searched 4 levels deep; symlinked folders are not followed.",
        ),
    ],
    port: Annotated[int, typer.Option(help="TCP port (0: any free one).")] = 8765,
    host: Annotated[
        str,
        typer.Option(
            help="Address to listen on. The default is loopback only: the pages show "
            "prompts, patches and screenshots; bind another address only on a trusted network."
        ),
    ] = "127.0.0.1",
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log each request.")] = False,
) -> None:
    """Browse run folders in a local web page: per run, its attempts (task, attempt, verdict,
    reward, sandbox id, time) and reward and pass@k plots; per attempt, the transcript
    (commands and tool calls with their outputs), the score's explanation, the patch, and a
    GUI run's screenshots in order. Each run page shows the command that opens it in
    Inspect's viewer (`orchard <family> export-log RUN && inspect view --log-dir RUN`).

    Read-only (GET only; nothing under DIR is written), nothing fetched from the internet,
    no path outside DIR served. Stop it with Ctrl-C. See docs/runs-viewer.md.
    """
    from orchard.dashboard import make_server

    if not runs.is_dir():
        fail("not_found", f"{runs}: not a folder")
    try:
        server = make_server(runs, host, port, log=_log if verbose else None)
    except OSError as e:
        fail("unavailable", f"cannot listen on {host}:{port}: {e.strerror or e}")
    with server:
        err.print(f"Orchard runs viewer: {server.url}  (runs under {runs.resolve()})", markup=False)
        err.print("Ctrl-C stops it", markup=False)
        with contextlib.suppress(KeyboardInterrupt):
            server.serve_forever()
