"""The REST API's contract as a committed file: docs/openapi.json is the app's own OpenAPI
spec (what the service serves at /openapi.json), regenerated from the routers and the
pydantic models, so a change to either shows up in review as a change to the file.

    python -m orchard.env.server.openapi_spec            # rewrite docs/openapi.json
    python -m orchard.env.server.openapi_spec --check    # exit 1 if the committed file is stale

The spec needs no engine: the app is built, never started (its backend is made on start).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from orchard.env.config import ServiceConfig
from orchard.env.server.app import create_app
from orchard.env.wire import write_or_check

SPEC_FILE = Path("docs") / "openapi.json"
REGENERATE = "python -m orchard.env.server.openapi_spec"


def openapi_spec() -> dict[str, Any]:
    """The spec `create_app` serves; nothing in it depends on the config's values."""
    config = ServiceConfig(state_dir=Path(tempfile.gettempdir()), secret=b"openapi-spec")
    spec: dict[str, Any] = create_app(config).openapi()
    return spec


def render() -> str:
    """The spec file's exact text (sorted keys, two-space indent, trailing newline)."""
    return json.dumps(openapi_spec(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    return write_or_check(argv, prog=REGENERATE, doc=__doc__, file=SPEC_FILE, render=render)


if __name__ == "__main__":
    raise SystemExit(main())
