"""Several service replicas on one cluster: who is alive, what is still being created, and
when a sandbox was last used, all kept where every replica reads them.

- Liveness: each replica holds a Lease `orchard-replica-<hash>` in the sandbox namespace,
  renewed every few seconds and deleted when it stops. A lease whose resourceVersion has
  not changed for its duration, as this replica observed it (no clocks compared, as
  client-go's leader election does), or that is absent, is a dead replica's.
- Creates: a pod is born with `orchard.dev/creating-by: <replica id>` and loses it once
  the create is answered (`handed_over`). A marked pod whose replica is dead was never
  handed to anyone (the replica was killed mid-create), so any replica's reconcile
  deletes it; nothing leaks past the lease's duration and one reconcile.
- Activity: the idle clock of a sandbox served by replica A must not run out on replica
  B. A replica that serves a sandbox with an idle timeout writes `orchard.dev/active-at`
  on its pod at most once per `objects.activity_interval`; every replica's records carry
  it (`SandboxRecord.active_at`, plus that interval, so it is never early).
- Deletes by reconcile (expired, idle, orphaned) re-read the pod and delete it with a
  resourceVersion precondition: a replica that just extended, used or claimed the
  sandbox wins over another's stale view.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
import socket
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import httpx2
from lightkube import ApiError, codecs
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from orchard.env.backends.kubernetes import objects as objs
from orchard.env.errors import NotFound, Unavailable

if TYPE_CHECKING:
    from orchard.env.backends.kubernetes.host import ClusterHost

log = logging.getLogger("orchard.kubernetes.replicas")

L_REPLICA = f"{objs.GROUP}/replica-of"  # the lease's label: the instance it belongs to
LEASE_S = 20
RENEW_S = 5.0
_MAX_WRITES = 256  # activity writes in flight at once; more are skipped (the next one comes)


def replica_id() -> str:
    """The host name (a pod's name in a Deployment) and a token per process: a container
    restarted in the same pod is a new replica, and its predecessor's creates are dead."""
    return f"{socket.gethostname()[:40]}-{secrets.token_hex(4)}"


def lease_name(rid: str) -> str:
    return f"orchard-replica-{hashlib.sha256(rid.encode()).hexdigest()[:16]}"


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def build_lease(opts: objs.KubernetesOptions, rid: str, now: float) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": lease_name(rid),
            "namespace": opts.namespace,
            "labels": {**opts.extra_labels, L_REPLICA: opts.instance},
        },
        "spec": {
            "holderIdentity": rid,
            "leaseDurationSeconds": LEASE_S,
            "acquireTime": _iso(now),
            "renewTime": _iso(now),
        },
    }


def _dict(obj: Any) -> dict[str, Any]:
    return dict(obj.to_dict()) if hasattr(obj, "to_dict") else dict(obj)


class Replicas:
    """This replica's lease, its creates, and its view of the others' (see the module)."""

    def __init__(self, backend: ClusterHost) -> None:
        self.b = backend
        self.opts = backend.opts
        self.id = replica_id()
        self._started: asyncio.Task[None] | None = None
        self._renew: asyncio.Task[None] | None = None
        self._seen: dict[str, tuple[str, float]] = {}  # holder -> (version, first seen)
        self._written: dict[str, float] = {}  # sandbox id -> activity last written
        self._writes: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------ our lease

    async def start(self) -> None:
        """Before the first create: the lease must exist before any pod names us."""
        if self._started is None or (self._started.done() and self._started.exception()):
            self._started = asyncio.ensure_future(self._create_lease())
        await asyncio.shield(self._started)
        if self._renew is None or self._renew.done():
            self._renew = asyncio.create_task(self._renew_loop(), name="orchard-k8s-lease")

    async def _create_lease(self) -> None:
        body = build_lease(self.opts, self.id, time.time())
        await self.b._call(
            f"create lease of replica {self.id}",
            lambda: self.b.client.create(codecs.from_dict(body)),
        )

    async def _renew_loop(self) -> None:
        name = lease_name(self.id)
        while True:
            await asyncio.sleep(RENEW_S)
            try:
                await self._renew_once(name)
            except NotFound:
                log.warning("lease %s was deleted; making it again", name)
                with contextlib.suppress(Exception):
                    await self._create_lease()
            except Exception as e:  # the next renewal tries again
                log.warning("lease %s not renewed: %s", name, e)

    async def _renew_once(self, name: str) -> None:
        patch = {"spec": {"renewTime": _iso(time.time())}}
        await self.b._call(
            f"renew lease {name}",
            lambda: self.b.client.patch(
                Lease, name, patch, namespace=self.opts.namespace, patch_type=PatchType.MERGE
            ),
        )

    async def _delete_lease(self, name: str) -> None:
        await self.b._gone_ok(
            f"delete lease {name}",
            lambda: self.b.client.delete(Lease, name, namespace=self.opts.namespace),
        )

    async def close(self) -> None:
        for task in (self._renew, *self._writes):
            if task is not None:
                task.cancel()
        if self._renew is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._renew
        if self._started is not None and self._started.done():
            with contextlib.suppress(Exception):
                await self._delete_lease(lease_name(self.id))

    # ------------------------------------------------------------ creates

    def mark(self, pod: dict[str, Any]) -> None:
        """The pod about to be created carries our id until `handed_over`."""
        pod["metadata"].setdefault("annotations", {})[objs.A_CREATING] = self.id

    async def alive(self) -> set[str]:
        """The replicas whose lease is held: seen to change within its duration (or first
        seen less than that ago). Leases dead for twice that are deleted."""

        async def go() -> list[dict[str, Any]]:
            it = self.b.client.list(
                Lease, namespace=self.opts.namespace, labels={L_REPLICA: self.opts.instance}
            )
            return [_dict(x) async for x in it]

        leases = await self.b._call("list replica leases", go)
        now = time.monotonic()
        out: set[str] = {self.id}
        current: dict[str, tuple[str, float]] = {}
        for lease in leases:
            rid = str((lease.get("spec") or {}).get("holderIdentity") or "")
            version = str(lease["metadata"].get("resourceVersion") or "")
            duration = float((lease.get("spec") or {}).get("leaseDurationSeconds") or LEASE_S)
            seen = self._seen.get(rid)
            since = seen[1] if seen and seen[0] == version else now
            current[rid] = (version, since)
            if now - since < duration:
                out.add(rid)
            elif now - since > 2 * duration and rid != self.id:
                with contextlib.suppress(Exception):
                    await self._delete_lease(str(lease["metadata"]["name"]))
        self._seen = current
        return out

    async def abandoned(self, pods: Iterable[dict[str, Any]]) -> list[str]:
        """Sandboxes still marked as being created by a replica that is gone."""
        marked = {}
        for pod in pods:
            meta = pod.get("metadata") or {}
            by = (meta.get("annotations") or {}).get(objs.A_CREATING)
            sid = (meta.get("labels") or {}).get(objs.L_SANDBOX)
            if by and sid and by != self.id:
                marked[str(sid)] = str(by)
        if not marked:
            return []
        alive = await self.alive()
        return [sid for sid, by in marked.items() if by not in alive]

    # ------------------------------------------------------------ activity

    def note_activity(self, sandbox_id: str, at: float) -> None:
        pod = self.b._pods.get(sandbox_id)
        ann = ((pod or {}).get("metadata") or {}).get("annotations") or {}
        try:
            idle = float(ann.get(objs.A_IDLE) or 0)
            last = self._written.get(sandbox_id) or float(ann.get(objs.A_ACTIVE) or 0)
        except ValueError:
            return
        if not idle or at - last < objs.activity_interval(idle) or len(self._writes) > _MAX_WRITES:
            return
        self._written[sandbox_id] = at
        task = asyncio.ensure_future(self._write_activity(sandbox_id, at))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _write_activity(self, sandbox_id: str, at: float) -> None:
        try:
            await self.b._annotate(sandbox_id, {objs.A_ACTIVE: repr(at)})
        except Exception as e:  # gone, or the API busy: the next request writes it
            self._written.pop(sandbox_id, None)
            log.debug("sandbox %s: activity not written (%s)", sandbox_id, e)

    def forget(self, sandbox_id: str) -> None:
        self._written.pop(sandbox_id, None)


async def delete_with_version(
    backend: ClusterHost, namespace: str, name: str, version: str
) -> bool:
    """DELETE with a resourceVersion precondition: False (409) when the pod changed since.
    lightkube's delete takes no DeleteOptions body, so the request is built here."""
    api = backend.client._client
    br = api.prepare_request("delete", res=Pod, name=name, namespace=namespace, params={})
    br.data = {
        "kind": "DeleteOptions",
        "apiVersion": "v1",
        "preconditions": {"resourceVersion": version},
    }
    try:
        async with backend._sem:
            resp = await api.send(api.build_adapter_request(br))  # type: ignore[no-untyped-call]
            api.handle_response("delete", resp, br)
    except ApiError as e:
        if e.status.code == 409:
            return False
        if e.status.code == 404:
            return True
        raise backend._error(f"delete {name}", e) from e
    except httpx2.HTTPStatusError as e:
        raise backend._error(f"delete {name}", e) from e
    except httpx2.TransportError as e:
        raise Unavailable(f"delete {name}: Kubernetes API unreachable: {e}") from e
    return True
