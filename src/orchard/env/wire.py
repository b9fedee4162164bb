"""The service <-> agent wire contract, in one place.

The pydantic models in `models` are the single source of every JSON body: this module
names the ones that travel between the service and the in-sandbox agent and exports
them as JSON Schema, which the Go agent's request and response structs are tested
against (agent/testdata/wire_schema.json). It also holds the one list of headers a
relay never passes on, used by the service's proxy and by the agent client alike.

    python -m orchard.env.wire            # rewrite agent/testdata/wire_schema.json
    python -m orchard.env.wire --check    # exit 1 if the committed file is stale
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchard.env import models as m
from orchard.env.models import pool as pm

# Every body the agent accepts or answers, by route (docs/agent-api.md).
WIRE_MODELS: tuple[type[m.WireModel], ...] = (
    m.AgentHealth,  # GET /health
    m.ErrorResponse,  # any error answer
    m.ExecRequest,  # POST /exec, /exec/stream
    m.ExecResult,  # POST /exec
    m.StreamEvent,  # NDJSON lines of /exec/stream and /processes/{id}/follow
    m.ProcessStart,  # POST /processes
    m.ProcessInfo,  # /processes/{id}, /wait
    m.ProcessList,  # GET /processes
    m.ProcessOutput,  # GET /processes/{id}/output
    m.StdinWrite,  # POST /processes/{id}/stdin
    m.SignalRequest,  # POST /processes/{id}/signal
    m.ResizeRequest,  # POST /processes/{id}/resize
    m.FileStat,  # PUT /files, GET /files/stat, POST /files/mkdir|move
    m.FileList,  # GET /files/list
    m.MkdirRequest,  # POST /files/mkdir
    m.RemoveRequest,  # POST /files/remove
    m.MoveRequest,  # POST /files/move
    m.TarResult,  # PUT /files/tar
    m.TokenUpdate,  # POST /token
    pm.AgentDefaults,  # PUT /defaults (a claimed warm-pool sandbox)
)

# Headers that describe one hop, never the request itself (RFC 9110 7.6.1), plus the
# caller's credentials: a relay drops them, so the agent sees only its own token and a
# sandbox never sees the caller's key. (Content-Length is framing: whoever re-frames a
# body drops it there.)
NOT_FORWARDED = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "authorization",
        "x-api-key",
    }
)

SCHEMA_FILE = Path("agent") / "testdata" / "wire_schema.json"


def wire_schema() -> dict[str, Any]:
    """`{class name: its JSON Schema (by alias)}` for every model in WIRE_MODELS."""
    return {model.__name__: model.model_json_schema(by_alias=True) for model in WIRE_MODELS}


def render() -> str:
    """The schema file's exact text (stable key order, trailing newline)."""
    return json.dumps(wire_schema(), indent=2, sort_keys=True) + "\n"


def write_or_check(
    argv: list[str] | None, *, prog: str, doc: str | None, file: Path, render: Callable[[], str]
) -> int:
    """The command line of a committed contract file (this schema, the REST API's spec):
    write it, or with `--check` exit 1 when the committed file differs from `render()`."""
    ap = argparse.ArgumentParser(prog=prog, description=doc)
    ap.add_argument("--root", type=Path, default=Path("."), help="the repository root")
    ap.add_argument("--check", action="store_true", help="fail if the file is stale")
    args = ap.parse_args(argv)
    path = args.root / file
    text = render()
    if args.check:
        if not path.is_file() or path.read_text() != text:
            print(f"{path} is stale (the contract changed): run `{prog}`", file=sys.stderr)
            return 1
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"wrote {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return write_or_check(
        argv, prog="python -m orchard.env.wire", doc=__doc__, file=SCHEMA_FILE, render=render
    )


if __name__ == "__main__":
    raise SystemExit(main())
