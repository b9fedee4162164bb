"""The tools of a running Claw world over MCP (stdio), for any MCP client or harness.

    python -m orchard.claw.mcp_server --sandbox sb-123 --url unix:///run/orchard.sock \
        [--services mail,calendar]

The world lives in another process (a runner, a notebook); this server attaches to its
sandbox through the SDK and forwards each call to the services. Tool schemas are those
of `orchard.claw.tools`; a tool's failure is an MCP result with `isError`, so the model
sees the message and the session goes on.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

import anyio
import anyio.to_thread
import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.server.stdio import stdio_server

from orchard import Orchard
from orchard.claw.tools import ToolSpec, select
from orchard.claw.world import World

log = logging.getLogger("orchard.claw.mcp")


def mcp_tools(specs: Sequence[ToolSpec]) -> list[types.Tool]:
    return [
        types.Tool(name=s.name, description=s.description, input_schema=s.parameters) for s in specs
    ]


def build_server(world: World, services: Sequence[str] | None = None) -> Server[Any]:
    """An MCP server exposing `services`' tools (all, sandbox shell and files included)."""
    specs = select(services)
    names = {s.name for s in specs}

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=mcp_tools(specs))

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        if params.name not in names:
            text = f"error: unknown tool '{params.name}'"
            return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)
        # World.call is blocking HTTP; a worker thread keeps the session loop responsive.
        result = await anyio.to_thread.run_sync(world.call, params.name, params.arguments or {})
        return types.CallToolResult(
            content=[types.TextContent(text=result.to_text())],
            structured_content=result.result if isinstance(result.result, dict) else None,
            is_error=not result.ok,
        )

    return Server(
        "orchard-claw",
        version="1",
        instructions="Productivity tools (mail, calendar, contacts, files, notes, chat, search)"
        " of one Orchard-Claw world.",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


async def serve_stdio(world: World, services: Sequence[str] | None = None) -> None:
    server = build_server(world, services)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m orchard.claw.mcp_server", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--sandbox", required=True, help="id of the sandbox the world runs in")
    parser.add_argument(
        "--url", default=os.environ.get("ORCHARD_URL"), help="Orchard service (or ORCHARD_URL)"
    )
    parser.add_argument("--services", help="comma list of services to expose (default: all)")
    args = parser.parse_args(argv)
    # stdout is the MCP wire: every log line goes to stderr.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if not args.url:
        parser.error("--url (or ORCHARD_URL) is needed: the world runs in another process")
    services = [s.strip() for s in args.services.split(",") if s.strip()] if args.services else None
    try:
        select(services)
    except ValueError as e:
        parser.error(str(e))
    with Orchard(args.url) as client:
        world = World.attach(client, args.sandbox)
        anyio.run(serve_stdio, world, services)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
