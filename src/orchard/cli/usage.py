"""`orchard usage`: what your key holds now against its limits."""

from __future__ import annotations

import typer

from orchard.cli._common import JsonOpt, connect, examples, out, print_json

usage_app = typer.Typer()


def _fmt(value: float | int | None) -> str:
    return "unlimited" if value is None else f"{value:g}"


@usage_app.command(epilog=examples("orchard usage", "orchard usage --json | jq .sandboxes"))
def usage(ctx: typer.Context, json_out: JsonOpt = False) -> None:
    """Show your sandboxes, cpu and memory against your key's limits."""
    with connect(ctx) as client:
        use = client.usage()
    if json_out:
        print_json(use)
        return
    lim = use.limits
    out.print(f"owner      {use.owner}")
    out.print(
        f"sandboxes  {use.sandboxes} of {_fmt(lim.get('max_sandboxes'))} ({use.creating} creating)"
    )
    out.print(f"cpu        {use.cpu:g} of {_fmt(lim.get('max_cpu'))} cores")
    out.print(f"memory     {use.memory_bytes} of {_fmt(lim.get('max_memory'))} bytes")
    rate = _fmt(lim.get("creates_per_second"))
    out.print(
        f"creates    {rate}/s, bursts of {_fmt(lim.get('create_burst'))}, "
        f"batches of {_fmt(lim.get('max_batch'))}"
    )
