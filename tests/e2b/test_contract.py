"""The envd surface against the SDK's own contract: every RPC of `process.Process` and
`filesystem.Filesystem` that the installed SDK's generated code names (from E2B's
protos) is served here, as the kind of RPC it is (unary, server or client stream), so a
new SDK's new or changed RPC fails here before it fails a user."""

from __future__ import annotations

import re
from pathlib import Path

from orchard.env.config import ServiceConfig
from orchard.env.server import create_app
from orchard.env.server.errors import _flat_routes
from tests.e2b.conftest import E2B_VENV

ENDPOINT = re.compile(r'"(/(?:process\.Process|filesystem\.Filesystem)/\w+)": Endpoint\.(\w+)\(')


def sdk_rpcs() -> dict[str, str]:
    found: dict[str, str] = {}
    for module in ("process/process_connect.py", "filesystem/filesystem_connect.py"):
        [path] = E2B_VENV.glob(f"lib/python3*/site-packages/e2b/envd/{module}")
        found.update(ENDPOINT.findall(path.read_text()))
    return found


def test_every_rpc_of_the_sdk_is_served(e2b_python: Path, tmp_path: Path) -> None:
    wanted = sdk_rpcs()
    assert len(wanted) == 17, wanted  # 8 of process.Process, 9 of filesystem.Filesystem
    app = create_app(ServiceConfig(state_dir=tmp_path, secret=b"s" * 32))
    served = {
        route.path: getattr(route.endpoint, "rpc_kind", None)
        for route in _flat_routes(app.router.routes)
        if getattr(route, "path", "").startswith(("/process.", "/filesystem."))
    }
    assert served == wanted
