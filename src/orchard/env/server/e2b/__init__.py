"""E2B's API on Orchard's service, so the unmodified `e2b` SDK runs against `orchard serve`.

Two surfaces on the same port, beside Orchard's own routes (docs/e2b.md):

- the control API (`E2B_API_URL`): `control` (routes), `snapshots` (forks, snapshots,
  network), `shapes` (E2B's JSON shapes, templates as images);
- envd, the in-sandbox daemon (`E2B_SANDBOX_URL`, routed by the `E2b-Sandbox-Id`
  header): `process`, `filesystem` and `watch` (Connect RPC, framed by `connect`), `files`
  (`/health`, `/files`, with `multipart`), all translated to the sandbox's Orchard agent
  through the service's agent client; `access` admits each request by its envd token
  (`signed`: or `/files` by the SDK's signed URL);
- the sandbox's other ports (`E2b-Sandbox-Port`, e.g. the code interpreter's):
  `traffic`, through Orchard's port proxy.

None of these paths is one of Orchard's own (`/v1/...`, `/healthz`), and none is in
Orchard's OpenAPI spec: E2B's spec is the contract here.
"""

from __future__ import annotations

from fastapi import APIRouter

from orchard.env.server.e2b import (
    control,
    files,
    filesystem,
    process,
    snapshots,
    traffic,
    watch,
)

router = APIRouter(include_in_schema=False)
for _sub in (
    traffic.router,  # first: a request for another port goes there whatever its path
    control.router,
    snapshots.router,
    process.router,
    filesystem.router,
    watch.router,
    files.router,
):
    router.include_router(_sub)

__all__ = ["router"]
