"""The service as an ASGI app: routers, error handlers and middleware over `SandboxService`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from orchard._version import __version__
from orchard.env.backends import Backend, make_backend
from orchard.env.config import ServiceConfig
from orchard.env.server import e2b
from orchard.env.server.errors import install_error_handlers
from orchard.env.server.metrics import Metrics
from orchard.env.server.middleware import ExecFastPath, JsonBodyLimit
from orchard.env.server.redact import install as install_redaction
from orchard.env.server.routes import ROUTERS
from orchard.env.server.service import SandboxService
from orchard.env.server.ui.routes import install_dashboard


def create_app(config: ServiceConfig, backend: Backend | None = None) -> FastAPI:
    """The service as an ASGI app; its lifespan starts the service and the reconcile loop."""
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Installed here, after uvicorn configured its loggers and handlers (idempotent).
        install_redaction([*config.api_keys, config.secret])
        try:
            service = SandboxService(config, backend or make_backend(config), metrics)
            await service.start()
        except BaseException as e:
            app.state.startup_error = e
            raise
        app.state.service = service
        try:
            yield
        finally:
            await service.stop(delete_created=app.state.delete_on_close)

    app = FastAPI(
        title="Orchard Env",
        version=__version__,
        description="Sandboxes for LLM agents (docs/rest-api.md).",
        lifespan=lifespan,
    )
    app.state.config = config
    app.state.delete_on_close = False
    app.state.startup_error = None
    install_error_handlers(app, metrics)
    app.add_middleware(ExecFastPath, metrics=metrics)
    app.add_middleware(JsonBodyLimit, metrics=metrics)  # outermost: bounds the fast path too
    for router in ROUTERS:
        app.include_router(router)
    app.include_router(e2b.router)  # E2B's API beside Orchard's (docs/e2b.md)
    install_dashboard(app)  # the browser dashboard at /ui (docs/dashboard.md)
    return app
