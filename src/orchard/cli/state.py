"""`orchard sandbox pause|resume|snapshot|fork|diff` and `orchard snapshot ...` (docs/state.md)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from orchard.cli._common import JsonOpt, connect, examples, out, pairs, print_json, print_table
from orchard.cli.sandbox import sandbox_app

snapshot_app = typer.Typer(
    help="List, inspect and delete snapshots (take one with `orchard sandbox snapshot`).",
    epilog=examples("orchard snapshot ls", "orchard snapshot rm $SNAP"),
    no_args_is_help=True,
)
IdArg = Annotated[str, typer.Argument(metavar="ID")]


@sandbox_app.command(epilog=examples("orchard sandbox pause $ID"))
def pause(ctx: typer.Context, sandbox_id: IdArg, json_out: JsonOpt = False) -> None:
    """Freeze a sandbox's processes (CPU stops, memory kept) until `resume`."""
    with connect(ctx) as client:
        info = client.sandboxes.get(sandbox_id).pause()
    print_json(info.model_dump(mode="json")) if json_out else out.print(f"{info.id} {info.status}")


@sandbox_app.command(epilog=examples("orchard sandbox resume $ID"))
def resume(ctx: typer.Context, sandbox_id: IdArg, json_out: JsonOpt = False) -> None:
    """Thaw a paused sandbox."""
    with connect(ctx) as client:
        info = client.sandboxes.get(sandbox_id).resume()
    print_json(info.model_dump(mode="json")) if json_out else out.print(f"{info.id} {info.status}")


MemoryOpt = Annotated[
    bool,
    typer.Option("--memory", help="Keep running processes and memory too (CRIU, local)."),
]


@sandbox_app.command(
    epilog=examples(
        "orchard sandbox snapshot $ID --name prepared",
        "orchard sandbox snapshot $ID --memory  # its running processes too (CRIU)",
        "orchard sandbox create --snapshot $SNAP  # a copy",
    )
)
def snapshot(
    ctx: typer.Context,
    sandbox_id: IdArg,
    name: Annotated[str | None, typer.Option(help="A name for people.")] = None,
    timeout: Annotated[float | None, typer.Option(help="Time to live in seconds.")] = None,
    memory: MemoryOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Keep a sandbox's filesystem changes and settings as a snapshot."""
    with connect(ctx) as client:
        sb = client.sandboxes.get(sandbox_id)
        snap = sb.snapshot(name, timeout_s=timeout, memory=memory)
    print_json(snap.model_dump(mode="json")) if json_out else out.print(snap.id)


@sandbox_app.command(epilog=examples("orchard sandbox fork $ID -n 8 -l group=7"))
def fork(
    ctx: typer.Context,
    sandbox_id: IdArg,
    count: Annotated[int, typer.Option("--count", "-n", min=1, max=100)] = 1,
    label: Annotated[list[str] | None, typer.Option("--label", "-l", help="K=V.")] = None,
    timeout: Annotated[float | None, typer.Option(help="Time to live of the copies.")] = None,
    memory: MemoryOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Snapshot a sandbox and start N isolated copies of it."""
    opts: dict[str, object] = {"memory": True} if memory else {}
    if label:
        opts["labels"] = pairs(label, "label")
    if timeout is not None:
        opts["timeout_s"] = timeout
    with connect(ctx) as client:
        result = client.sandboxes.get(sandbox_id).fork(count, **opts)
    if json_out:
        print_json(
            {
                "snapshot": result.snapshot.model_dump(mode="json") if result.snapshot else None,
                "sandboxes": [s.info.model_dump(mode="json") for s in result.sandboxes],
                "errors": [e.model_dump(mode="json") for e in result.errors],
            }
        )
        return
    for sb in result.sandboxes:
        out.print(sb.id)
    for e in result.errors:
        out.print(f"[red]error[/red] {e.code}: {e.message}")


@sandbox_app.command(epilog=examples("orchard sandbox diff $ID", "orchard sandbox diff $ID $SNAP"))
def diff(
    ctx: typer.Context,
    sandbox_id: IdArg,
    since: Annotated[str, typer.Argument(help="`start` or a snapshot id.")] = "start",
    json_out: JsonOpt = False,
) -> None:
    """List the paths a sandbox added (A), modified (M) and deleted (D)."""
    with connect(ctx) as client:
        d = client.sandboxes.get(sandbox_id).files.diff(since)
    if json_out:
        print_json(d.model_dump(mode="json"))
        return
    for mark, paths in (("A", d.added), ("M", d.modified), ("D", d.deleted)):
        for path in paths:
            out.print(f"{mark} {path}", markup=False, highlight=False)


@snapshot_app.command("ls")
def list_(ctx: typer.Context, json_out: JsonOpt = False) -> None:
    """The caller's snapshots."""
    with connect(ctx) as client:
        snaps = client.snapshots.list()
    if json_out:
        print_json([s.model_dump(mode="json") for s in snaps])
        return
    table = Table("ID", "NAME", "SOURCE", "IMAGE", "SIZE", "EXPIRES")
    for s in snaps:
        size = f"{s.size_bytes / (1 << 20):.1f} MiB"
        table.add_row(s.id, s.name or "", s.source, s.image, size, s.expires_at.isoformat())
    print_table(table)


@snapshot_app.command("inspect")
def inspect(ctx: typer.Context, snapshot_id: IdArg) -> None:
    """Show one snapshot (JSON)."""
    with connect(ctx) as client:
        print_json(client.snapshots.get(snapshot_id).model_dump(mode="json"))


@snapshot_app.command("rm")
def remove(ctx: typer.Context, snapshot_ids: Annotated[list[str], typer.Argument()]) -> None:
    """Delete snapshots (their storage goes once no sandbox made from them runs)."""
    with connect(ctx) as client:
        for sid in snapshot_ids:
            client.snapshots.delete(sid)
            out.print(sid)
