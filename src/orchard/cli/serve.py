"""`orchard serve`: run the Orchard service until interrupted."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from orchard.cli._common import examples, fail

serve_app = typer.Typer()


@serve_app.command(
    epilog=examples(
        "orchard serve                          # http://127.0.0.1:8080, no auth",
        "orchard serve --uds /tmp/orchard.sock  # a Unix socket",
        "ORCHARD_API_KEYS=alice:s3cret orchard serve --host 0.0.0.0",
        "ORCHARD_API_KEYS=alice:s3cret,ops:t0ps orchard serve --operator ops",
        "orchard serve --limits limits.yaml     # per-key quotas (docs/security.md)",
        "orchard serve --backend local --local-runtime runc  # memory snapshots (CRIU)",
        "orchard serve --tls-cert cert.pem --tls-key key.pem  # HTTPS (docs/e2b.md)",
    )
)
def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8080,
    uds: Annotated[str | None, typer.Option(help="Listen on this Unix socket instead.")] = None,
    backend: Annotated[
        str | None,
        typer.Option(
            help="Where sandboxes run: docker, local (crun or runc), kubernetes, or auto (docker "
            "if an engine answers, else local). Default: $ORCHARD_BACKEND, else auto.",
            show_default=False,
        ),
    ] = None,
    local_runtime: Annotated[
        str | None,
        typer.Option(
            help="The OCI runtime of new local sandboxes: crun (fastest), runc (memory "
            "snapshots need it) or auto (crun if installed, else runc). Default: "
            "$ORCHARD_LOCAL_RUNTIME, else auto.",
            show_default=False,
        ),
    ] = None,
    limits: Annotated[
        str | None,
        typer.Option(
            help="Per-key quotas, a YAML or JSON file with a `default:` block and one block "
            "per owner. Default: $ORCHARD_LIMITS, else the built-in defaults.",
            show_default=False,
        ),
    ] = None,
    operator: Annotated[
        list[str] | None,
        typer.Option(
            help="An owner (the NAME of a NAME:KEY in $ORCHARD_API_KEYS or the keys file) whose "
            "key sees the whole service in /metrics and /healthz; repeat for several. Any "
            "other key sees its own figures only. Default: $ORCHARD_OPERATORS (comma list).",
            show_default=False,
        ),
    ] = None,
    tls_cert: Annotated[
        str | None,
        typer.Option(help="Serve HTTPS with this PEM certificate (chain); needs --tls-key."),
    ] = None,
    tls_key: Annotated[str | None, typer.Option(help="The PEM private key of --tls-cert.")] = None,
    log_level: Annotated[
        str, typer.Option(help="uvicorn log level (no level logs an API key).")
    ] = "info",
) -> None:
    """Run the Orchard service (REST API) until interrupted."""
    from orchard.env.config import ConfigError, ServiceConfig

    try:
        from orchard.env.server import serve as run_service
    except ModuleNotFoundError as exc:  # the SDK/CLI install without the server stack
        fail("bad_request", f"the service needs {exc.name!r}: pip install 'orchard[server]'")
    try:
        env = dict(os.environ)
        if limits:
            env["ORCHARD_LIMITS"] = limits
        if operator:
            env["ORCHARD_OPERATORS"] = ",".join(operator)
        config = ServiceConfig.from_env(env, backend=backend, local_runtime=local_runtime)
        run_service(
            config,
            host=host,
            port=port,
            uds=uds,
            log_level=log_level,
            tls_cert=tls_cert,
            tls_key=tls_key,
        )
    except ConfigError as exc:
        fail("bad_request", str(exc))
