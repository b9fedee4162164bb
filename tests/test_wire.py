"""The wire contract has one source: the committed JSON Schema matches the pydantic models.

The Go agent's structs are checked against agent/testdata/wire_schema.json (agent tests);
this checks that file against the models, so a model change without a regenerated
schema fails here: run `python -m orchard.env.wire`.
"""

from __future__ import annotations

import json
import typing
from pathlib import Path

from orchard.env import models as m
from orchard.env import wire
from orchard.env.sdk import calls

ROOT = Path(__file__).resolve().parents[1]


def test_committed_schema_is_current() -> None:
    committed = (ROOT / wire.SCHEMA_FILE).read_text()
    assert committed == wire.render(), "stale: run `python -m orchard.env.wire`"
    assert wire.main(["--root", str(ROOT), "--check"]) == 0


def test_schema_file_format() -> None:
    data = json.loads((ROOT / wire.SCHEMA_FILE).read_text())
    assert set(data) == {model.__name__ for model in wire.WIRE_MODELS}
    exec_request = data["ExecRequest"]
    assert exec_request == m.ExecRequest.model_json_schema(by_alias=True)
    assert {"cmd", "stdin", "stdin_b64", "timeout_s"} <= set(exec_request["properties"])
    assert exec_request["additionalProperties"] is False


def test_sdk_exec_options_are_exec_request_fields() -> None:
    """The SDK's keyword arguments map onto the model's fields (bytes stdin -> stdin_b64)."""
    pairs = ((calls.ExecOptions, m.ExecRequest), (calls.ProcessOptions, m.ProcessStart))
    for options, model in pairs:
        keys = set(typing.get_type_hints(options))
        assert keys <= set(model.model_fields), keys - set(model.model_fields)
    body = calls.exec_call("sb-1", "cat", {"stdin": b"\x00"}).json
    assert body == {"cmd": "cat", "stdin_b64": "AA=="}


def test_stdin_is_one_of_two_fields() -> None:
    assert m.ExecRequest(cmd="cat", stdin="x").stdin == "x"
    try:
        m.ExecRequest(cmd="cat", stdin="x", stdin_b64="eA==")
    except ValueError as exc:
        assert "not both" in str(exc)
    else:
        raise AssertionError("both stdin fields were accepted")


def test_one_header_list() -> None:
    assert {"authorization", "x-api-key", "host", "transfer-encoding"} <= wire.NOT_FORWARDED
    assert "content-length" not in wire.NOT_FORWARDED  # framing, not a hop's description
