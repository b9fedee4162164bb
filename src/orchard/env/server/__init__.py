"""The Orchard service: REST API (FastAPI) over `SandboxService`, installable as an extra.

    pip install 'orchard[server]'

`create_app` builds the ASGI app, `serve` runs it (`orchard serve`), `EmbeddedService`
runs it in-process for the SDK's no-URL mode. Layout: `app` (factory), `auth`, `routes/`
(one router per resource), `relay` (to the agent), `middleware` (log redaction, body
limit, exec fast path), `errors` (stable codes), `service` (lifecycle, tenancy,
reconcile), `agent_client` (service -> agent), `metrics`, `run`.
"""

from __future__ import annotations

from orchard.env.server.app import create_app
from orchard.env.server.run import EmbeddedService, serve

__all__ = ["EmbeddedService", "create_app", "serve"]
