"""`orchard pool create|ls|inspect|rm`: warm pools (docs/pools.md); claim with
`orchard sandbox create --pool NAME`."""

from __future__ import annotations

from typing import Annotated, Literal

import typer
from rich.table import Table

from orchard.cli._common import JsonOpt, connect, examples, out, print_json, print_table
from orchard.env.models.pool import Pool

pool_app = typer.Typer(
    help="Warm pools: ready sandboxes, claimed in milliseconds by `sandbox create --pool`.",
    epilog=examples(
        "orchard pool create warm debian:12 --size 8 --cpu 1 --memory 1g",
        "orchard sandbox create --pool warm -e TASK=42 -l run=a  # a claim",
        "orchard pool ls",
        "orchard pool rm warm",
    ),
    no_args_is_help=True,
)
NameArg = Annotated[str, typer.Argument(metavar="NAME")]


def _show(pool: Pool, json_out: bool) -> None:
    if json_out:
        print_json(pool.model_dump(mode="json"))
    else:
        out.print(f"{pool.name} {pool.ready}/{pool.size} ready")


@pool_app.command(epilog=examples("orchard pool create warm busybox:latest --size 4"))
def create(
    ctx: typer.Context,
    name: NameArg,
    image: Annotated[str, typer.Argument(help="Any OCI image reference.")],
    size: Annotated[int, typer.Option(min=0, max=1000, help="Sandboxes to keep ready.")] = 1,
    cpu: Annotated[float | None, typer.Option(help="CPU cores of each.")] = None,
    memory: Annotated[str | None, typer.Option(help="Memory limit of each, e.g. 1g.")] = None,
    disk: Annotated[str | None, typer.Option(help="Disk limit of each, e.g. 10g.")] = None,
    egress: Annotated[
        Literal["none", "all", "allow"], typer.Option(help="The egress they are born with.")
    ] = "none",
    allow: Annotated[list[str] | None, typer.Option(help="With --egress allow.")] = None,
    wait: Annotated[bool, typer.Option(help="Return once the pool is full.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Create a warm pool; it fills in the background."""
    with connect(ctx) as client:
        pool = client.pools.create(
            name,
            image,
            size,
            cpu=cpu,
            memory=memory,
            disk=disk,
            network={"egress": egress, "allow": list(allow or [])},
        )
        if wait:
            pool = client.pools.wait_ready(name)
    _show(pool, json_out)


@pool_app.command("ls")
def list_(ctx: typer.Context, json_out: JsonOpt = False) -> None:
    """The caller's pools."""
    with connect(ctx) as client:
        pools = client.pools.list()
    if json_out:
        print_json([p.model_dump(mode="json") for p in pools])
        return
    table = Table("NAME", "IMAGE", "READY", "CREATING", "FAILED", "CLAIMED", "LAST ERROR")
    for p in pools:
        table.add_row(
            p.name,
            p.settings.image,
            f"{p.ready}/{p.size}",
            str(p.creating),
            str(p.failed),
            str(p.claimed),
            p.last_error or "",
        )
    print_table(table)


@pool_app.command("inspect")
def inspect(ctx: typer.Context, name: NameArg, json_out: JsonOpt = False) -> None:
    """Show one pool (JSON with --json)."""
    with connect(ctx) as client:
        pool = client.pools.get(name)
    print_json(pool.model_dump(mode="json")) if json_out else _show(pool, False)


@pool_app.command("rm")
def remove(
    ctx: typer.Context, names: Annotated[list[str], typer.Argument()], json_out: JsonOpt = False
) -> None:
    """Delete pools and their unclaimed sandboxes."""
    with connect(ctx) as client:
        for name in names:
            client.pools.delete(name)
            if not json_out:
                out.print(name)
    if json_out:
        print_json({"deleted": names})
