"""E2B's forks, snapshots and network updates on Orchard's (docs/state.md).

- `POST /sandboxes/{id}/snapshots` is Orchard's snapshot (files and settings; E2B's
  default, a memory snapshot, where Orchard's memory snapshots work, else files only);
  E2B uses a snapshot as a template, so `Sandbox.create(snapshot_id)` starts from it
  (control.py), and `DELETE /templates/{id}` deletes it.
- `POST /sandboxes/{id}/fork` is Orchard's fork: one snapshot, `count` sandboxes from
  it, all or nothing; processes carry over only with a memory snapshot.
- `PUT /sandboxes/{id}/network` is Orchard's egress policy (allowOut / denyOut /
  allow_internet_access; E2B's per-host rules are refused).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from orchard.env.errors import InvalidRequest, MemoryNotSupported, NotFound
from orchard.env.models.state import ForkRequest, Snapshot, SnapshotCreate
from orchard.env.server import state
from orchard.env.server.e2b import shapes
from orchard.env.server.e2b.control import Call, find_snapshot, json_answer, route, seconds

router = APIRouter(include_in_schema=False)
MAX_PAGE = 1000
# A fork's snapshot is the fork's own business in E2B: not listed, and soon gone.
FORK_PREFIX = "e2b-fork:"
FORK_SNAPSHOT_TTL_S = 600.0


def _info(snap: Snapshot) -> dict[str, Any]:
    """E2B's SnapshotInfo."""
    return {"snapshotID": snap.id, "names": [snap.name] if snap.name else []}


async def create_snapshot(call: Call) -> Response:
    sid = call.request.path_params["sandbox_id"]
    body = await call.body()
    await call.live(sid)
    name = body.get("name")
    if name is not None and not isinstance(name, str):
        raise InvalidRequest("name must be a string")
    memory = body.get("memory") is not False
    try:
        snap = await state.take_snapshot(
            call.svc, call.owner, sid, SnapshotCreate(name=name, memory=memory)
        )
    except MemoryNotSupported:
        if body.get("memory") is True:  # asked for outright: say it cannot be
            raise
        snap = await state.take_snapshot(call.svc, call.owner, sid, SnapshotCreate(name=name))
    return json_answer(_info(snap), 201)


async def list_snapshots(call: Call) -> Response:
    params = call.request.query_params
    snaps = await state.list_snapshots(call.svc, call.owner)
    snaps = [s for s in snaps if not (s.name or "").startswith(FORK_PREFIX)]
    if params.get("sandboxID"):
        snaps = [s for s in snaps if s.source == params["sandboxID"]]
    if params.get("name"):
        snaps = [s for s in snaps if s.name == params["name"]]
    snaps.sort(key=lambda s: (s.created_at, s.id))
    limit = params.get("limit", "100")
    if not limit.isdigit() or not 0 < int(limit) <= MAX_PAGE:
        raise InvalidRequest(f"limit must be 1 to {MAX_PAGE}")
    after = params.get("nextToken")
    if after:
        ids = [s.id for s in snaps]
        snaps = snaps[ids.index(after) + 1 :] if after in ids else []
    page = snaps[: int(limit)]
    headers = {"x-next-token": page[-1].id} if len(snaps) > len(page) else None
    return json_answer([_info(s) for s in page], headers=headers)


async def delete_template(call: Call) -> Response:
    """E2B deletes a snapshot as a template; Orchard's templates are images (not ours)."""
    template_id = call.request.path_params["template_id"]
    snapshot_id = await find_snapshot(call, template_id)
    if snapshot_id is None:
        raise NotFound(f"no snapshot {template_id!r}")
    await state.delete_snapshot(call.svc, call.owner, snapshot_id)
    return Response(status_code=204)


async def fork(call: Call) -> Response:
    sid = call.request.path_params["sandbox_id"]
    body = await call.body()
    count = body.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 20:
        raise InvalidRequest("count must be 1 to 20")
    await call.live(sid)
    req = ForkRequest(
        count=count,
        memory=True,
        timeout_s=seconds(body.get("timeout")),
        name=FORK_PREFIX + sid,
        snapshot_timeout_s=FORK_SNAPSHOT_TTL_S,
    )
    try:
        result = await state.fork(call.svc, call.owner, sid, req)
    except MemoryNotSupported:
        req = req.model_copy(update={"memory": False})
        result = await state.fork(call.svc, call.owner, sid, req)
    made = [{"sandbox": call.created(sb)} for sb in result.sandboxes]
    return json_answer(made, 201)


async def update_network(call: Call) -> Response:
    sid = call.request.path_params["sandbox_id"]
    body = await call.body()
    if body.get("rules") or body.get("egressProxy") or body.get("dnsServers"):
        raise InvalidRequest("per-host rules, egress proxies and DNS servers are not supported")
    await call.live(sid)
    policy = shapes.network_policy(
        {"allow_internet_access": body.get("allow_internet_access"), "network": body}
    )
    await call.svc.set_network(call.owner, sid, policy)
    return Response(status_code=204)


SB = "/sandboxes/{sandbox_id}"
for _path, _method, _handler in (
    (SB + "/snapshots", "POST", create_snapshot),
    ("/snapshots", "GET", list_snapshots),
    ("/templates/{template_id}", "DELETE", delete_template),
    (SB + "/fork", "POST", fork),
    (SB + "/network", "PUT", update_network),
):
    router.add_api_route(_path, route(_handler), methods=[_method])
