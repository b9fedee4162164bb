"""The service's client of `orchard-node`, the node helper DaemonSet (node/, docs/state.md).

The helper does what the pod API cannot: freeze and thaw a container's cgroup, and list
the changes in its overlay upper dir. The service finds the helper on a sandbox's node by
listing the DaemonSet's pods there (its pod IP, a NetworkPolicy opens it to the service's
pods only) and calls it with that node's token: HMAC-SHA256 of the node's name under the
key the service and the DaemonSet share (ORCHARD_K8S_NODE_HELPER_KEY_FILE or _KEY here,
the Secret `orchard-node` there). A token seen on one node's traffic opens no other node's
helper. The key file is read again when a helper refuses the token (the kubelet rewrites
a Secret's files when it changes), so a new key needs no restart on either side.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from orchard.env.errors import (
    Conflict,
    NotSupported,
    OrchardError,
    SandboxExited,
    Unavailable,
)

TOKEN_CONTEXT = b"orchard-node/v1\x00"  # the same as node/auth.go
CONNECT_TIMEOUT_S = 3.0  # to a helper pod's IP on the cluster network
MAIN_CONTAINER = "sandbox"  # objects.MAIN_CONTAINER: the container frozen and diffed


def node_token(key: str, node: str) -> str:
    """The token that opens the helper on `node` (node/auth.go computes the same)."""
    return hmac.new(key.strip().encode(), TOKEN_CONTEXT + node.encode(), hashlib.sha256).hexdigest()


@dataclass
class NodeHelperOptions:
    """Where the helper runs and the key; `from_env` reads ORCHARD_K8S_NODE_HELPER_*."""

    namespace: str = "orchard-node"
    selector: dict[str, str] = field(
        default_factory=lambda: {"app.kubernetes.io/name": "orchard-node"}
    )
    port: int = 9091
    key: str | None = None
    key_file: str | None = None  # a Secret's file; preferred over `key` while readable
    timeout_s: float = 30.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> NodeHelperOptions:
        env = os.environ if env is None else env
        opts = cls(
            key=env.get("ORCHARD_K8S_NODE_HELPER_KEY") or None,
            key_file=env.get("ORCHARD_K8S_NODE_HELPER_KEY_FILE") or None,
        )
        if env.get("ORCHARD_K8S_NODE_HELPER_NAMESPACE"):
            opts.namespace = env["ORCHARD_K8S_NODE_HELPER_NAMESPACE"]
        if env.get("ORCHARD_K8S_NODE_HELPER_PORT"):
            opts.port = int(env["ORCHARD_K8S_NODE_HELPER_PORT"])
        if env.get("ORCHARD_K8S_NODE_HELPER_SELECTOR"):
            opts.selector = dict(json.loads(env["ORCHARD_K8S_NODE_HELPER_SELECTOR"]))
        if opts.key is not None and len(opts.key.strip()) < 16:
            raise ValueError("ORCHARD_K8S_NODE_HELPER_KEY is shorter than 16 bytes")
        return opts


@dataclass(frozen=True)
class PodRef:
    """What the helper needs to find a sandbox's container on its node."""

    node: str
    uid: str
    container_id: str

    @property
    def path(self) -> str:
        return f"/v1/pods/{self.uid}/containers/{self.container_id}"


def pod_ref(pod: Mapping[str, Any], sandbox_id: str) -> PodRef:
    """The node, pod UID and main container ID of a running sandbox pod."""
    spec, meta, status = pod.get("spec") or {}, pod.get("metadata") or {}, pod.get("status") or {}
    cid = ""
    for cs in status.get("containerStatuses") or []:
        if cs.get("name") == MAIN_CONTAINER and "running" in (cs.get("state") or {}):
            cid = str(cs.get("containerID") or "")
    runtime, _, cid = cid.rpartition("://")
    if not (spec.get("nodeName") and meta.get("uid") and cid):
        raise SandboxExited(f"sandbox {sandbox_id}'s container is not running")
    if runtime not in ("containerd", ""):
        raise NotSupported(f"the node helper knows containerd's containers, not {runtime}'s")
    return PodRef(str(spec["nodeName"]), str(meta["uid"]), cid)


# Lists the helper pods on one node: (namespace, labels, node name) -> pod dicts.
PodLister = Callable[[str, dict[str, str], str], Awaitable[list[dict[str, Any]]]]


class NodeHelpers:
    """Calls the helper on a pod's node; remembers each node's helper address until a
    call to it fails (a restarted helper pod has a new IP)."""

    def __init__(self, options: NodeHelperOptions, list_pods: PodLister) -> None:
        self.opts = options
        self._list_pods = list_pods
        self._urls: dict[str, str] = {}
        self._http: httpx.AsyncClient | None = None
        self._file_key: str | None = None
        self._read_at = 0.0

    def _key(self, again: bool = False) -> str | None:
        """The key: the key file's (read once, and again when `again`, at most once a
        second), else ORCHARD_K8S_NODE_HELPER_KEY."""
        file = self.opts.key_file
        if file and (self._file_key is None or again) and time.monotonic() - self._read_at >= 1:
            self._read_at = time.monotonic()
            try:
                text = Path(file).read_text().strip()
            except OSError:
                text = ""
            if len(text) >= 16:
                self._file_key = text
        return self._file_key or self.opts.key

    def has_key(self) -> bool:
        return bool(self._key())

    def require_key(self, what: str) -> str:
        key = self._key()
        if not key:
            raise NotSupported(
                f"{what} on kubernetes needs the node helper: set ORCHARD_K8S_NODE_HELPER_KEY "
                "(node-key in the Secret orchard-secrets) and deploy the orchard-node "
                "DaemonSet (docs/kubernetes.md)"
            )
        return key

    async def _url(self, node: str) -> str:
        if node in self._urls:
            return self._urls[node]
        for pod in await self._list_pods(self.opts.namespace, self.opts.selector, node):
            status = pod.get("status") or {}
            ready = any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in status.get("conditions") or []
            )
            if (
                ready
                and status.get("podIP")
                and not (pod.get("metadata") or {}).get("deletionTimestamp")
            ):
                ip = str(status["podIP"])
                host = f"[{ip}]" if ":" in ip else ip
                self._urls[node] = f"http://{host}:{self.opts.port}"
                return self._urls[node]
        raise Unavailable(
            f"no ready node helper on node {node} (is the orchard-node DaemonSet deployed "
            f"in namespace {self.opts.namespace}? docs/kubernetes.md)"
        )

    async def call(
        self,
        what: str,
        ref: PodRef,
        method: str,
        op: str,
        body: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """One helper call (with a JSON `body`: commit names the image, repository and tag);
        its errors become the service's (stable codes, no 500). A commit pushes a whole
        image, so it may take longer than `opts.timeout_s`: `timeout_s` overrides it."""
        key = self.require_key(what)
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=self.opts.timeout_s)
        base = await self._url(ref.node)
        sent = (method, base + f"{ref.path}/{op}", body, timeout_s)
        try:
            r = await self._send(what, ref, sent, key)
        except Unavailable as e:
            # Nothing was sent if it could not connect: the helper pod may have been
            # replaced (a new IP that another replica already knows), so look again once.
            if not isinstance(e.__cause__, httpx.ConnectError | httpx.ConnectTimeout):
                raise
            if (fresh := await self._url(ref.node)) == base:
                raise
            sent = (method, fresh + f"{ref.path}/{op}", body, timeout_s)
            r = await self._send(what, ref, sent, key)
        if r.status_code == 401 and (again := self._key(again=True)) and again != key:
            r = await self._send(what, ref, sent, again)  # the Secret changed
        try:
            answer: dict[str, Any] = r.json()
        except ValueError:
            answer = {"message": r.text[:200]}
        if r.status_code == 200:
            return answer
        raise _error(what, ref.node, r.status_code, answer)

    async def _send(
        self,
        what: str,
        ref: PodRef,
        sent: tuple[str, str, Mapping[str, Any] | None, float | None],
        key: str,
    ) -> httpx.Response:
        assert self._http is not None
        method, url, body, timeout_s = sent
        headers = {"Authorization": f"Bearer {node_token(key, ref.node)}"}
        total = self.opts.timeout_s if timeout_s is None else timeout_s
        # In-cluster: a helper that does not accept within seconds is gone, not slow.
        timeout = httpx.Timeout(total, connect=min(total, CONNECT_TIMEOUT_S))
        try:
            return await self._http.request(
                method,
                url,
                headers=headers,
                json=dict(body) if body is not None else None,
                timeout=timeout,
            )
        except httpx.TransportError as e:
            self._urls.pop(ref.node, None)
            raise Unavailable(f"{what}: the node helper on {ref.node} is unreachable: {e}") from e

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None


def _error(what: str, node: str, status: int, body: Mapping[str, Any]) -> OrchardError:
    msg = f"{what}: {body.get('message') or body.get('code') or status}"
    if status == 401:
        return Unavailable(
            f"{what}: the node helper on {node} refused the service's token (does "
            "ORCHARD_K8S_NODE_HELPER_KEY match the Secret orchard-node?)"
        )
    if status == 409:
        return Conflict(msg)
    if status == 501:
        return NotSupported(msg)
    return Unavailable(msg)  # 404 (no such container on the node), 503 (freeze timed out)
