"""The Claw tools as function-calling schemas, read from the services' own catalog.json.

`services/catalog.json` is the single source of truth: the in-sandbox server validates
calls against the same schemas the model is shown here, so the two cannot drift.
Tools of service "sandbox" (shell and files) are run by `World.call` through the SDK.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from typing import Any

SANDBOX_SERVICE = "sandbox"


@dataclass(frozen=True)
class ToolSpec:
    name: str
    service: str
    description: str
    parameters: dict[str, Any]  # a JSON schema of type object


def _load() -> list[ToolSpec]:
    text = (resources.files("orchard.claw") / "services" / "catalog.json").read_text()
    return [
        ToolSpec(t["name"], t["service"], t["description"], t["parameters"])
        for t in json.loads(text)["tools"]
    ]


TOOLS: list[ToolSpec] = _load()
BY_NAME: dict[str, ToolSpec] = {t.name: t for t in TOOLS}
SERVICES: tuple[str, ...] = tuple(dict.fromkeys(t.service for t in TOOLS))


def select(services: Iterable[str] | None = None) -> list[ToolSpec]:
    """The tools of `services` (all of them for None), in catalog order.

    Raises ValueError for a service name that has no tools, so a typo is not a silent
    empty tool list.
    """
    if services is None:
        return list(TOOLS)
    wanted = set(services)
    unknown = wanted - set(SERVICES)
    if unknown:
        raise ValueError(f"unknown service(s): {', '.join(sorted(unknown))}; known: {SERVICES}")
    return [t for t in TOOLS if t.service in wanted]


def tool_names(services: Iterable[str] | None = None) -> list[str]:
    return [t.name for t in select(services)]


def openai_tools(services: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """OpenAI-style `tools=[{"type": "function", "function": {...}}]` for `services`."""
    return [
        {
            "type": "function",
            "function": {
                "name": t.name,
                "description": t.description,
                "parameters": t.parameters,
            },
        }
        for t in select(services)
    ]
