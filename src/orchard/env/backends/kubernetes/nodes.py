"""Sandboxes on a lost node are `failed` (410 on use), whichever replica is asked.

A node is lost when its kubelet has stopped reporting (the controller manager sets its
Ready condition to Unknown after `--node-monitor-grace-period`, 50 s by default) for
UNKNOWN_HOLD_S more, or when it has said NotReady for NOT_READY_HOLD_S. The holds keep a
blip (an API server restart that delays a heartbeat) from failing a whole node's
sandboxes for good. Each replica lists the nodes every
CHECK_EVERY_S and marks every sandbox pod on a lost node with `A_NODE_LOST`; the mark is
what the records read (objects.record_from_pod), so all replicas agree, and it stays when
the node comes back: the sandbox ran on unseen for a while and its caller has moved on.

Kubernetes' own answer, taint-based eviction, waits 300 s by default and stops altogether
when every node of a zone is down (the controller then blames its own network), which is
the one-node case. Listing needs `list` on nodes (ClusterRole `orchard-tenants`); without
it the check is off, said once in the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any

log = logging.getLogger("orchard.kubernetes")

CHECK_EVERY_S = 5.0
UNKNOWN_HOLD_S = 10.0
NOT_READY_HOLD_S = 60.0  # a NotReady kubelet (runtime down, PLEG) gets this long to recover

ListNodes = Callable[[], Awaitable[list[dict[str, Any]]]]
MarkLost = Callable[[dict[str, str]], Awaitable[None]]


class NodesForbidden(Exception):
    """The service may not list nodes: the check is off."""


def _since(stamp: Any) -> float | None:
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def node_lost(node: Mapping[str, Any], now: float) -> str | None:
    """Why the node is lost, or None while it is (or may yet be) fine."""
    name = (node.get("metadata") or {}).get("name", "?")
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    if ready is None or ready.get("status") == "True":
        return None
    message = ready.get("message") or ready.get("reason") or "no reason given"
    since = _since(ready.get("lastTransitionTime"))
    held = now - since if since is not None else 0.0
    if ready.get("status") == "Unknown":
        return f"node {name} lost: {message}" if held >= UNKNOWN_HOLD_S else None
    if held >= NOT_READY_HOLD_S:
        return f"node {name} not ready for {held:.0f} s: {message}"
    return None


class NodeWatch:
    """The per-replica loop: list the nodes, hand the lost ones to `mark`."""

    def __init__(self, list_nodes: ListNodes, mark: MarkLost) -> None:
        self._list = list_nodes
        self._mark = mark
        self._task: asyncio.Task[None] | None = None

    def ensure(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="orchard-k8s-nodes")

    async def check(self, now: float) -> dict[str, str]:
        """One pass: the lost nodes and why (after marking their sandboxes)."""
        lost: dict[str, str] = {}
        for node in await self._list():
            why = node_lost(node, now)
            if why:
                lost[(node.get("metadata") or {}).get("name", "")] = why
        if lost:
            await self._mark(lost)
        return lost

    async def _loop(self) -> None:
        while True:
            try:
                await self.check(datetime.now().timestamp())
            except NodesForbidden as e:
                log.warning("lost nodes are not detected: %s", e)
                return
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the API server restarting, say: next pass
                log.debug("node check failed: %s", e)
            await asyncio.sleep(CHECK_EVERY_S)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
