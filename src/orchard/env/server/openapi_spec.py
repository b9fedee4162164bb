"""The REST API's contract as a committed file: docs/openapi.json is the app's own OpenAPI
spec (what the service serves at /openapi.json), regenerated from the routers and the
pydantic models, so a change to either shows up in review as a change to the file.

    python -m orchard.env.server.openapi_spec            # rewrite docs/openapi.json
    python -m orchard.env.server.openapi_spec --check    # exit 1 if the committed file is stale

The spec needs no engine: the app is built, never started (its backend is made on start).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from orchard.env.config import ServiceConfig
from orchard.env.server.app import create_app

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
    ap = argparse.ArgumentParser(prog=REGENERATE, description=__doc__)
    ap.add_argument("--root", type=Path, default=Path("."), help="the repository root")
    ap.add_argument("--check", action="store_true", help="fail if the file is stale")
    args = ap.parse_args(argv)
    path = args.root / SPEC_FILE
    text = render()
    if args.check:
        if not path.is_file() or path.read_text() != text:
            print(f"{path} is stale (the API changed): run `{REGENERATE}`", file=sys.stderr)
            return 1
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"wrote {path} ({len(json.loads(text)['paths'])} paths)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
