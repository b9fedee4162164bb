"""The kubernetes backend's snapshot records (backends/kubernetes/snapshotting.py) against
the fake API server (a fake: no cluster runs on the test machines): what is listed and
found, what a copy's pod runs, that a half-made record is kept while its manifest cannot
be deleted, and that the Role grants the calls made. The whole path (node helper commit,
registry, pulls, deletes, reaping) is tests/live/test_k8s_snapshots.py."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from orchard.env.backends.base import SandboxSpec
from orchard.env.backends.kubernetes import objects as objs
from orchard.env.backends.kubernetes.snapshotting import A_SNAPSHOT, SnapshotOptions
from orchard.env.backends.state_base import SnapshotRecord
from orchard.env.errors import NotFound
from tests.kubernetes.kube_helpers import NS, fake_cluster, options
from tests.kubernetes.test_k8s_control_flow import _verb

pytestmark = pytest.mark.anyio
RBAC = Path(__file__).resolve().parents[2] / "deploy/kubernetes/base/rbac.yaml"
DIGEST = "sha256:" + "b" * 64


def _rec(sid: str, owner: str = "alice", complete: bool = True) -> SnapshotRecord:
    now = time.time()
    return SnapshotRecord(sid, owner, "sb-1", "busybox:1.36", now, now + 60, {"cpu": 1.0},
                          extra={"digest": DIGEST}, complete=complete)  # fmt: skip


async def test_records_lists_copies_and_the_roles_rights(tmp_path: Path) -> None:
    async with fake_cluster(tmp_path) as (api, make):
        b = make()
        # Nothing listens there: a manifest that cannot be deleted keeps its record.
        b._snapshot_opts = SnapshotOptions(registry_url="http://127.0.0.1:9")
        other = make(instance="other")
        await b._write_record(_rec("snap-000000000001"))
        await b._write_record(_rec("snap-000000000002", owner="team b:ops"))
        await b._write_record(_rec("snap-000000000003", complete=False))
        await other._write_record(_rec("snap-000000000004"))
        assert [s.id for s in await b.list_snapshots()] == [
            "snap-000000000001",
            "snap-000000000002",
        ]
        assert (await b.get_snapshot("snap-000000000002")).owner == "team b:ops"  # type: ignore[union-attr]
        assert await b.get_snapshot("snap-000000000003") is None  # half-made: never shown
        assert await b.get_snapshot("snap-000000000004") is None  # another install's
        assert await b.get_snapshot("snap-00000000000f") is None
        # Completing it (what the commit's answer does) shows it.
        done = _rec("snap-000000000003")
        await b._update_record(done)
        assert (await b.get_snapshot("snap-000000000003")).extra["digest"] == DIGEST  # type: ignore[union-attr]

        # A copy's pod runs the snapshot's image, by digest, and names its snapshot.
        spec = SandboxSpec(
            id="sb-2",
            owner="alice",
            image="busybox:1.36",
            agent_token="t",
            expires_at=9e9,
            cmd=["sleep", "9"],
            snapshot_id="snap-000000000001",
        )
        body = objs.build_pod(spec, options(), time.time())
        await b._from_snapshot(spec, body)
        main = next(c for c in body["spec"]["containers"] if c["name"] == "sandbox")
        assert (
            main["image"] == f"orchard-registry.orchard-system.svc:5000/orchard/snapshots@{DIGEST}"
        )
        assert body["metadata"]["annotations"][A_SNAPSHOT] == "snap-000000000001"
        assert body["metadata"]["annotations"][objs.A_IMAGE] == "busybox:1.36"
        with pytest.raises(NotFound):
            await b._from_snapshot(
                SandboxSpec(**{**spec.__dict__, "snapshot_id": "snap-00000000000f"}), body
            )

        # Half-made with its writer gone (no replica leases: not in flight here): reaped,
        # but only once its manifest is gone; the registry is unreachable, so it stays.
        await b._write_record(_rec("snap-000000000005", complete=False))
        assert await b._reap_snapshots() == []
        assert "orchard-snapshot-snap-000000000005" in api.items("configmaps", NS)

        role = next(
            d for d in yaml.safe_load_all(RBAC.read_text())
            if d["kind"] == "Role" and d["metadata"]["name"] == "orchard-snapshots"
        )  # fmt: skip
        granted = {
            (r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]
        }
        used = {_verb(*r) for r in api.requests if "/configmaps" in r[1]}
        assert used <= granted, used - granted
        # delete: the live test (it needs the registry to answer first).
        assert granted - used == {("configmaps", "delete")}
