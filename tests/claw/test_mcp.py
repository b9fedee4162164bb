"""The MCP server over stdio, driven by the `mcp` client library against a real world."""

from __future__ import annotations

import sys

import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp_types import TextContent

from orchard import Orchard
from orchard.claw.tools import select
from orchard.claw.world import World

pytestmark = pytest.mark.anyio


def _params(world: World, client: Orchard, services: str) -> StdioServerParameters:
    # The world lives in this process's embedded service: the server reaches it by its socket.
    return StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "orchard.claw.mcp_server",
            "--sandbox",
            world.sandbox.id,
            "--url",
            f"unix://{client.target.uds}",
            "--services",
            services,
        ],
    )


def _text(result: object) -> str:
    content = getattr(result, "content", [])
    return "".join(c.text for c in content if isinstance(c, TextContent))


async def test_lists_and_calls_tools_and_reports_errors(
    claw_world: World, claw_client: Orchard
) -> None:
    params = _params(claw_world, claw_client, "mail,calendar,sandbox")
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        listed = await session.list_tools()
        want = select(["mail", "calendar", "sandbox"])
        assert [(t.name, t.description, t.input_schema) for t in listed.tools] == [
            (s.name, s.description, s.parameters) for s in want
        ]

        ok = await session.call_tool("mail_read_message", {"id": "m-004"})
        assert not ok.is_error
        assert ok.structured_content["subject"] == "Renewal quote request"
        assert "Globex" in _text(ok)

        missing = await session.call_tool("mail_read_message", {"id": "m-999"})
        assert missing.is_error and "m-999" in _text(missing)
        invalid = await session.call_tool("calendar_get_event", {})
        assert invalid.is_error and "'id'" in _text(invalid)
        hidden = await session.call_tool("files_read", {"path": "/docs/roadmap-2026.md"})
        assert hidden.is_error and "unknown tool" in _text(hidden)

        shell = await session.call_tool("sandbox_shell", {"command": "id -u"})
        assert not shell.is_error and shell.structured_content["stdout"].strip() == "1000"
        # The session survived every error: one more call still works.
        again = await session.call_tool("calendar_get_event", {"id": "e-007"})
        assert again.structured_content["title"] == "Roadmap review"

    audit = claw_world.audit()
    assert [(e["op"], e["args"], e["ok"]) for e in audit] == [
        ("mail_read_message", {"id": "m-004"}, True),
        ("mail_read_message", {"id": "m-999"}, False),
        ("calendar_get_event", {}, False),
        ("calendar_get_event", {"id": "e-007"}, True),
    ]
