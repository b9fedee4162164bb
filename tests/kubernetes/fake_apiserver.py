"""FakeKubeAPIServer: an in-process stand-in for a Kubernetes API server (a fake: no
cluster can run on the test machines).

It speaks the real wire format for what the kubernetes backend uses -- pods, ConfigMaps,
NetworkPolicies and CiliumNetworkPolicies in namespaces: create (POST, `dryRun=All` too),
get, list with label selectors and a resourceVersion, watch (`?watch=true`: chunked JSON lines of
ADDED/MODIFIED/DELETED, resumable from a version, 410 Gone for a compacted one), JSON
merge patch, delete, `metav1.Status` errors, bearer-token auth, and the garbage
collector's cascade through ownerReferences. It does not schedule or run anything: the
tests play scheduler and kubelet by setting pod status (`set_status`), or let a
`kubelet` callback do it when a pod is created (and `on_delete` when one is deleted).
Faults (409/429/5xx) are injected per method and resource with `fail()`; every request
is logged in `requests`.
"""

from __future__ import annotations

import asyncio
import copy
import json
import secrets
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import web

Obj = dict[str, Any]
Kubelet = Callable[["FakeKubeAPIServer", Obj], Coroutine[Any, Any, None]]

# (group/version prefix, plural) -> kind
KINDS = {
    ("api/v1", "pods"): ("v1", "Pod"),
    ("api/v1", "configmaps"): ("v1", "ConfigMap"),
    ("api/v1", "persistentvolumeclaims"): ("v1", "PersistentVolumeClaim"),
    ("apis/networking.k8s.io/v1", "networkpolicies"): ("networking.k8s.io/v1", "NetworkPolicy"),
    ("apis/cilium.io/v2", "ciliumnetworkpolicies"): ("cilium.io/v2", "CiliumNetworkPolicy"),
}
_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    404: "NotFound",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
}


def status_body(code: int, message: str, reason: str | None = None) -> Obj:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason or _REASONS.get(code, "Unknown"),
        "code": code,
    }


def reply(body: Obj, status: int = 200) -> web.Response:
    """JSON with exactly `application/json`, as the API server sends (clients match on it)."""
    return web.Response(
        body=json.dumps(body).encode(), status=status, headers={"Content-Type": "application/json"}
    )


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _selected(obj: Obj, selector: str) -> bool:
    labels = obj["metadata"].get("labels") or {}
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k) == v:
                return False
        elif "=" in term:
            k, v = term.split("=", 1)
            if labels.get(k.rstrip("=")) != v:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


@dataclass
class Fault:
    method: str
    plural: str
    status: int
    times: int
    reason: str | None = None
    retry_after: str | None = None
    message: str | None = None


@dataclass
class Event:
    version: int
    type: str
    key: tuple[str, str, str]
    obj: Obj


@dataclass
class FakeKubeAPIServer:
    """See the module docstring. Use as `async with FakeKubeAPIServer() as api:`."""

    cilium: bool = False
    kubelet: Kubelet | None = None
    # Called when a pod is deleted (the kubelet stopping its containers).
    on_delete: Kubelet | None = None
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    objects: dict[tuple[str, str, str], Obj] = field(default_factory=dict)
    history: list[Event] = field(default_factory=list)
    requests: list[tuple[str, str, str]] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    # Extra seconds every non-watch request takes (to observe concurrency bounds).
    latency_s: float = 0.0
    compacted_before: int = 0
    watch_generation: int = 0
    _version: int = 0
    _changed: asyncio.Condition | None = None
    _runner: web.AppRunner | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    port: int = 0

    # ------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> FakeKubeAPIServer:
        self._changed = asyncio.Condition()
        app = web.Application(client_max_size=3 << 20)  # the API server's own limit: 3 MiB
        app.router.add_route(
            "*", "/{prefix:apis?/[^/]+(?:/[^/]+)?}/namespaces/{ns}/{plural}", self._collection
        )
        app.router.add_route(
            "*", "/{prefix:apis?/[^/]+(?:/[^/]+)?}/namespaces/{ns}/{plural}/{name}", self._item
        )
        app.router.add_route("GET", "/api/v1/namespaces/{name}", self._namespace)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in list(self._tasks):
            task.cancel()
        await self.drop_watches()
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def write_kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        """A kubeconfig that points at this server with its bearer token."""
        conf = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": self.token}}],
            "contexts": [
                {
                    "name": "fake",
                    "context": {"cluster": "fake", "user": "fake", "namespace": namespace},
                }
            ],
            "current-context": "fake",
        }
        path.write_text(json.dumps(conf))  # JSON is YAML
        return path

    # ------------------------------------------------------------ test controls

    def fail(
        self,
        method: str,
        plural: str,
        status: int,
        times: int = 1,
        reason: str | None = None,
        retry_after: str | None = None,
        message: str | None = None,
    ) -> None:
        """The next `times` `method` requests on `plural` answer `status` with a Status body."""
        self.faults.append(
            Fault(method.upper(), plural, status, times, reason, retry_after, message)
        )

    def pods(self, ns: str) -> dict[str, Obj]:
        return {k[2]: v for k, v in self.objects.items() if k[0] == "pods" and k[1] == ns}

    def items(self, plural: str, ns: str) -> dict[str, Obj]:
        return {k[2]: v for k, v in self.objects.items() if k[0] == plural and k[1] == ns}

    async def set_status(self, ns: str, name: str, status: Obj) -> None:
        """Play kubelet/scheduler: merge `status` into the pod's and emit MODIFIED."""
        key = ("pods", ns, name)
        if key not in self.objects:
            return
        obj = copy.deepcopy(self.objects[key])
        obj["status"] = merge_patch(obj.get("status") or {}, status)
        await self._put(key, obj, "MODIFIED")

    async def run_pod(self, ns: str, name: str, ip: str) -> None:
        """The usual happy path: scheduled, init done, main container running at `ip`."""
        now = _now()
        await self.set_status(
            ns,
            name,
            {
                "phase": "Running",
                "podIP": ip,
                "podIPs": [{"ip": ip}],
                "startTime": now,
                "conditions": [{"type": "PodScheduled", "status": "True"}],
                "containerStatuses": [
                    {
                        "name": "sandbox",
                        "ready": True,
                        "restartCount": 0,
                        "image": "",
                        "imageID": "",
                        "state": {"running": {"startedAt": now}},
                    }
                ],
            },
        )

    async def drop_watches(self) -> None:
        """End every open watch stream, as an API server restart or a load balancer would."""
        assert self._changed is not None
        self.watch_generation += 1
        async with self._changed:
            self._changed.notify_all()

    def watchers(self) -> int:
        """How many watch requests were made so far."""
        return sum(1 for m, _, q in self.requests if m == "GET" and "watch=true" in q)

    def compact(self) -> None:
        """Forget history, like etcd compaction: older versions now answer 410 Gone."""
        self.compacted_before = self._version + 1
        self.history.clear()

    # ------------------------------------------------------------ storage

    async def _put(self, key: tuple[str, str, str], obj: Obj, kind: str) -> Obj:
        assert self._changed is not None
        self._version += 1
        obj["metadata"]["resourceVersion"] = str(self._version)
        if kind == "DELETED":
            self.objects.pop(key, None)
        else:
            self.objects[key] = obj
        self.history.append(Event(self._version, kind, key, copy.deepcopy(obj)))
        async with self._changed:
            self._changed.notify_all()
        return obj

    async def _delete(self, key: tuple[str, str, str]) -> Obj:
        obj = copy.deepcopy(self.objects[key])
        obj["metadata"]["deletionTimestamp"] = _now()
        # As a kubelet does: the pod object goes only once its containers have stopped, so
        # a client that sees it gone may rely on nothing of it still answering.
        if key[0] == "pods" and self.on_delete is not None:
            await self.on_delete(self, copy.deepcopy(obj))
        await self._put(key, obj, "DELETED")
        # The garbage collector: dependents whose owner is gone go too.
        uid = obj["metadata"].get("uid")
        for dep_key, dep in list(self.objects.items()):
            refs = dep["metadata"].get("ownerReferences") or []
            if dep_key[1] == key[1] and any(r.get("uid") == uid for r in refs):
                await self._delete(dep_key)
        return obj

    # ------------------------------------------------------------ HTTP

    def _error(self, code: int, message: str, reason: str | None = None) -> web.Response:
        return reply(status_body(code, message, reason), code)

    def _check(self, request: web.Request) -> tuple[str, str, str, str] | web.Response:
        self.requests.append((request.method, request.path, request.query_string))
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return self._error(401, "Unauthorized")
        prefix, ns, plural = (request.match_info[k] for k in ("prefix", "ns", "plural"))
        if (prefix, plural) not in KINDS or (plural.startswith("cilium") and not self.cilium):
            return self._error(404, f"the server could not find the requested resource ({plural})")
        for fault in self.faults:
            if fault.times > 0 and fault.method == request.method and fault.plural == plural:
                fault.times -= 1
                resp = self._error(
                    fault.status, fault.message or f"injected fault {fault.status}", fault.reason
                )
                if fault.retry_after:
                    resp.headers["Retry-After"] = fault.retry_after
                return resp
        return prefix, ns, plural, request.match_info.get("name", "")

    async def _timed(self) -> None:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        if self.latency_s:
            await asyncio.sleep(self.latency_s)

    async def _collection(self, request: web.Request) -> web.StreamResponse:
        checked = self._check(request)
        if isinstance(checked, web.Response):
            return checked
        prefix, ns, plural, _ = checked
        if request.method == "GET" and request.query.get("watch") in ("true", "1"):
            return await self._watch(request, ns, plural)
        await self._timed()
        try:
            if request.method == "GET":
                return self._list(request, prefix, ns, plural)
            if request.method == "POST":
                return await self._create(request, prefix, ns, plural)
            return self._error(405, f"{request.method} not allowed")
        finally:
            self.in_flight -= 1

    async def _item(self, request: web.Request) -> web.StreamResponse:
        checked = self._check(request)
        if isinstance(checked, web.Response):
            return checked
        _, ns, plural, name = checked
        key = (plural, ns, name)
        await self._timed()
        try:
            if key not in self.objects:
                return self._error(404, f'{plural} "{name}" not found')
            if request.method == "GET":
                return reply(self.objects[key])
            if request.method == "DELETE":
                return reply(await self._delete(key))
            if request.method == "PATCH":
                ctype = request.headers.get("Content-Type", "")
                if not ctype.startswith("application/merge-patch+json"):
                    return self._error(415, f"the fake only speaks JSON merge patch, not {ctype}")
                obj = merge_patch(self.objects[key], await request.json())
                return reply(await self._put(key, obj, "MODIFIED"))
            return self._error(405, f"{request.method} not allowed")
        finally:
            self.in_flight -= 1

    async def _namespace(self, request: web.Request) -> web.Response:
        """Every namespace exists (the fake does not model them beyond a GET)."""
        name = request.match_info["name"]
        meta = {"name": name, "labels": {"kubernetes.io/metadata.name": name}}
        return reply({"apiVersion": "v1", "kind": "Namespace", "metadata": meta})

    def _list(self, request: web.Request, prefix: str, ns: str, plural: str) -> web.Response:
        sel = request.query.get("labelSelector", "")
        items = [
            o
            for k, o in sorted(self.objects.items())
            if k[0] == plural and k[1] == ns and _selected(o, sel)
        ]
        api_version, kind = KINDS[(prefix, plural)]
        limit = int(request.query.get("limit") or 0)
        if limit:
            items = items[:limit]  # the backend only pages to probe; no continue token needed
        return reply(
            {
                "apiVersion": api_version,
                "kind": f"{kind}List",
                "metadata": {"resourceVersion": str(self._version)},
                "items": items,
            }
        )

    async def _create(
        self, request: web.Request, prefix: str, ns: str, plural: str
    ) -> web.Response:
        try:
            obj = await request.json()
        except ValueError:
            return self._error(400, "body is not JSON")
        api_version, kind = KINDS[(prefix, plural)]
        if obj.get("kind") != kind or obj.get("apiVersion") != api_version:
            return self._error(400, f"expected {api_version} {kind}, got {obj.get('kind')}")
        meta = obj.setdefault("metadata", {})
        name = meta.get("name")
        if not name:
            return self._error(422, "metadata.name: Required value", "Invalid")
        if meta.get("namespace", ns) != ns:
            return self._error(400, "the namespace of the object does not match the request")
        key = (plural, ns, name)
        if key in self.objects:
            return self._error(409, f'{plural} "{name}" already exists', "AlreadyExists")
        if request.query.get("dryRun") == "All":  # checked as a create, then not kept
            return reply(obj, 201)
        meta.update(namespace=ns, uid=str(uuid.uuid4()), creationTimestamp=_now())
        if plural == "pods":
            obj["status"] = {"phase": "Pending", "qosClass": "Guaranteed"}
        stored = await self._put(key, obj, "ADDED")
        if plural == "pods" and self.kubelet is not None:
            task = asyncio.create_task(self.kubelet(self, copy.deepcopy(stored)))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return reply(stored, 201)

    async def _watch(self, request: web.Request, ns: str, plural: str) -> web.StreamResponse:
        assert self._changed is not None
        sel = request.query.get("labelSelector", "")
        since = int(request.query.get("resourceVersion") or 0)
        timeout = float(request.query.get("timeoutSeconds") or 300)
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)

        async def send(kind: str, obj: Obj) -> None:
            await resp.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")

        if since and since < self.compacted_before - 1:
            await send("ERROR", status_body(410, f"too old resource version: {since}", "Expired"))
            return resp
        if not since:
            # No version: the current state first, as ADDED events.
            for k, o in sorted(self.objects.items()):
                if k[0] == plural and k[1] == ns and _selected(o, sel):
                    await send("ADDED", o)
            since = self._version
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        generation = self.watch_generation
        try:
            while loop.time() < deadline and generation == self.watch_generation:
                for ev in [e for e in self.history if e.version > since]:
                    since = ev.version
                    if ev.key[0] == plural and ev.key[1] == ns and _selected(ev.obj, sel):
                        await send(ev.type, ev.obj)
                if since < self.compacted_before - 1:
                    await send("ERROR", status_body(410, "too old resource version", "Expired"))
                    break
                async with self._changed:
                    try:
                        await asyncio.wait_for(self._changed.wait(), deadline - loop.time())
                    except TimeoutError:
                        break
        except (ConnectionResetError, asyncio.CancelledError):
            return resp
        return resp


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
