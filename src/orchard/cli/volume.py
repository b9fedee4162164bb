"""`orchard volume create|ls|inspect|rm` (docs/volumes.md); mount with `sandbox create -v`."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from orchard.cli._common import JsonOpt, connect, examples, out, pairs, print_json, print_table

volume_app = typer.Typer(
    help="Create, list, inspect and delete volumes (mount with `orchard sandbox create -v`).",
    epilog=examples(
        "orchard volume create outputs",
        "orchard sandbox create debian:12 -v /out=outputs",
        "orchard volume rm outputs",
    ),
    no_args_is_help=True,
)
NameArg = Annotated[str, typer.Argument(metavar="NAME")]


@volume_app.command(epilog=examples("orchard volume create pip --timeout 86400 -l kind=cache"))
def create(
    ctx: typer.Context,
    name: NameArg,
    timeout: Annotated[
        float | None, typer.Option(help="Time to live in seconds (default: until deleted).")
    ] = None,
    label: Annotated[list[str] | None, typer.Option("--label", "-l", help="K=V.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Create an empty volume; prints its name."""
    with connect(ctx) as client:
        vol = client.volumes.create(name, timeout_s=timeout, labels=pairs(label, "--label"))
    print_json(vol.model_dump(mode="json")) if json_out else out.print(vol.name)


@volume_app.command("ls")
def list_(ctx: typer.Context, json_out: JsonOpt = False) -> None:
    """The caller's volumes, with their size and the sandboxes that mount them."""
    with connect(ctx) as client:
        vols = client.volumes.list()
    if json_out:
        print_json([v.model_dump(mode="json") for v in vols])
        return
    table = Table("NAME", "ID", "SIZE", "MOUNTED BY", "EXPIRES")
    for v in vols:
        size = f"{v.size_bytes / (1 << 20):.1f} MiB" if v.size_bytes is not None else "-"
        expires = v.expires_at.isoformat() if v.expires_at else ""
        table.add_row(v.name, v.id, size, " ".join(v.mounted_by), expires)
    print_table(table)


@volume_app.command("inspect")
def inspect(ctx: typer.Context, name: NameArg, json_out: JsonOpt = False) -> None:
    """Show one volume (JSON, with or without --json)."""
    with connect(ctx) as client:
        print_json(client.volumes.get(name).model_dump(mode="json"))


@volume_app.command("rm")
def remove(
    ctx: typer.Context, names: Annotated[list[str], typer.Argument()], json_out: JsonOpt = False
) -> None:
    """Delete volumes and their files (refused while a sandbox mounts one: 409)."""
    removed = []
    with connect(ctx) as client:
        for name in names:
            client.volumes.delete(name)
            removed.append(name)
            if not json_out:
                out.print(name)
    if json_out:
        print_json(removed)
