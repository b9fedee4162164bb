"""Compat shim, removed at merge: the service moved to `orchard.env.server`.

Kept only so `orchard serve` (cli.py imports `serve` from here) works until the CLI is
repointed at `orchard.env.server`; nothing else may import this module.
"""

from __future__ import annotations

from orchard.env.backends import make_backend
from orchard.env.server import EmbeddedService, create_app, serve
from orchard.env.server.middleware import ExecFastPath

__all__ = ["EmbeddedService", "ExecFastPath", "create_app", "make_backend", "serve"]
