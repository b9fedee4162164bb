"""Calls of the service itself: its health and what the caller's key holds."""

from __future__ import annotations

from orchard.env import models as m
from orchard.env.sdk.core import Call, parse_model


def health() -> Call[m.Health]:
    return Call("GET", "/healthz", parse_model(m.Health), idempotent=True)


def usage() -> Call[m.Usage]:
    return Call("GET", "/v1/usage", parse_model(m.Usage), idempotent=True)
