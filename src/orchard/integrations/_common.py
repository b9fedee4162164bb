"""What every adapter shares: the label that marks its sandboxes, and one way to find them.

Each adapter labels what it creates `integration=<tool>` (plus its own keys), so a tool's
cleanup command, or a test, can find and delete exactly those sandboxes through the SDK.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchard import AsyncOrchard, Orchard

INTEGRATION_LABEL = "integration"


def labels_for(tool: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The labels an adapter puts on its sandboxes: `integration=<tool>` and `extra`."""
    return {INTEGRATION_LABEL: tool, **(extra or {})}


def delete_labelled(client: Orchard, tool: str, extra: Mapping[str, str] | None = None) -> int:
    """Delete every sandbox of `tool` (matching `extra` too); returns how many went."""
    sandboxes = client.sandboxes.list(labels_for(tool, extra))
    for sb in sandboxes:
        sb.delete(missing_ok=True)
    return len(sandboxes)


async def adelete_labelled(
    client: AsyncOrchard, tool: str, extra: Mapping[str, str] | None = None
) -> int:
    """Async twin of `delete_labelled`."""
    sandboxes = await client.sandboxes.list(labels_for(tool, extra))
    for sb in sandboxes:
        await sb.delete(missing_ok=True)
    return len(sandboxes)


def label_value(text: str, default: str = "x") -> str:
    """`text` in the characters and length a label value allows (names, session ids)."""
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in text)
    return safe[:63] or default
