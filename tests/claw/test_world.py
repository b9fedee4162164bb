"""The tool registry, and the World handle: start/attach, the sandbox shell and files tools,
and the isolation between the agent's uid and the root-owned services."""

from __future__ import annotations

import jsonschema  # type: ignore[import-untyped]
import pytest

from orchard import Orchard
from orchard.claw import spec
from orchard.claw.tools import SANDBOX_SERVICE, TOOLS, openai_tools, select, tool_names
from orchard.claw.world import HOME, TOKEN_PATH, World


def test_catalog_schemas_are_valid_and_named_by_service() -> None:
    assert {t.service for t in TOOLS} == {*spec.SERVICES, SANDBOX_SERVICE}
    assert len({t.name for t in TOOLS}) == len(TOOLS)
    for t in TOOLS:
        jsonschema.Draft202012Validator.check_schema(t.parameters)
        assert t.parameters["type"] == "object" and t.parameters["additionalProperties"] is False
        assert set(t.parameters["required"]) <= set(t.parameters["properties"])
        prefixes = ("notes_", "todo_") if t.service == "notes" else (t.service + "_",)
        assert t.name.startswith(prefixes) and t.description


def test_openai_tools_and_names() -> None:
    chat = openai_tools(["chat"])
    assert [f["function"]["name"] for f in chat] == tool_names(["chat"])
    assert all(f["type"] == "function" and f["function"]["parameters"] for f in chat)
    assert "todo_add" in tool_names(["notes"]) and "mail_send_message" not in tool_names(["notes"])
    assert len(openai_tools(None)) == len(TOOLS) == len(select())
    with pytest.raises(ValueError, match="mial"):
        tool_names(["mial"])


def test_every_service_tool_is_served(claw_world: World) -> None:
    """With no arguments each tool answers 200 or names a missing one: none is unrouted."""
    for t in TOOLS:
        if t.service == SANDBOX_SERVICE:
            continue
        r = claw_world.call(t.name, {})
        if t.parameters["required"]:
            assert r.status == 400 and t.parameters["required"][0] in (r.error or ""), t.name
        else:
            assert r.ok, (t.name, r.error)


def test_shell_runs_as_the_agent_user_in_its_home(claw_world: World) -> None:
    r = claw_world.call("sandbox_shell", {"command": "id -u; pwd; echo $HOME; touch mine"})
    assert r.ok and r.result["exit_code"] == 0
    assert r.result["stdout"].split() == ["1000", HOME, HOME]
    slow = claw_world.call("sandbox_shell", {"command": "sleep 5", "timeout_s": 1})
    assert slow.ok and slow.result["timed_out"] and slow.result["exit_code"] == 124


def test_shell_cannot_reach_the_token_or_stop_the_services(claw_world: World) -> None:
    token = claw_world.call("sandbox_read_file", {"path": TOKEN_PATH})
    assert not token.ok and "Permission denied" in (token.error or "")
    find_and_kill = (
        "for p in /proc/[0-9]*; do grep -qs server.py $p/cmdline && kill -9 ${p#/proc/}; done"
    )
    r = claw_world.call("sandbox_shell", {"command": find_and_kill})
    assert "Operation not permitted" in r.result["stderr"]
    assert claw_world.call("contacts_get", {"id": "c-001"}).ok


def test_sandbox_file_tools(claw_world: World) -> None:
    wrote = claw_world.call("sandbox_write_file", {"path": "out/report.md", "content": "# Ré\n"})
    assert wrote.ok and wrote.result["size"] == len("# Ré\n".encode())
    read = claw_world.call("sandbox_read_file", {"path": f"{HOME}/out/report.md"})
    assert read.ok and read.result["content"] == "# Ré\n"
    assert claw_world.sandbox.files.read(f"{HOME}/out/report.md") == "# Ré\n".encode()
    missing = claw_world.call("sandbox_read_file", {"path": "nope.txt"})
    assert not missing.ok and missing.status == 404
    bad = claw_world.call("sandbox_shell", {"command": "true", "timeout_s": "soon"})
    assert (bad.ok, bad.status) == (False, 400) and "'timeout_s'" in (bad.error or "")
    assert "'command'" in (claw_world.call("sandbox_shell", {}).error or "")


def test_attach_from_another_handle(claw_world: World, claw_client: Orchard) -> None:
    claw_world.call("todo_complete", {"id": "t-001"})
    other = World.attach(claw_client, claw_world.sandbox.id)
    assert other.state() == claw_world.state()
    assert [e["op"] for e in other.audit()] == ["todo_complete"]
    done = other.call("todo_list", {"status": "done"}).result["todos"]
    assert [t["id"] for t in done] == ["t-005", "t-001"]
