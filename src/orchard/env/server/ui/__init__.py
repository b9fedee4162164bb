"""The sandbox dashboard at `/ui` (docs/dashboard.md): a page, its assets, login sessions.

Kept import-free: `auth` reads `ui.sessions`, and `ui.routes` reads `auth`.
"""
