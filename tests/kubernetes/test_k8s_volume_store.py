"""The kubernetes backend's volumes (backends/kubernetes/volume_store.py) against the fake
API server (a fake: the unit suite runs with no cluster): a claim per volume that two
replicas both see, `volume_exists` from the claim's name, mounts in the pod and back from
it, `volume_in_use`, a create racing a delete, the sweep, and that the Role grants the
calls made. The real provisioner and mounts: tests/live/test_k8s_volumes.py."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from orchard.env.backends.kubernetes import objects as objs
from orchard.env.backends.kubernetes import volumes as kv
from orchard.env.backends.volume_base import VolumeMount, VolumeRecord, new_volume_id
from orchard.env.errors import NotFound, VolumeExists, VolumeInUse
from tests.kubernetes.kube_helpers import NS, fake_cluster, instant_kubelet
from tests.kubernetes.test_k8s_control_flow import _verb, spec

pytestmark = pytest.mark.anyio
RBAC = Path(__file__).resolve().parents[2] / "deploy/kubernetes/base/rbac.yaml"


def _rec(name: str, owner: str = "alice", ttl: float | None = None) -> VolumeRecord:
    now = time.time()
    return VolumeRecord(new_volume_id(), owner, name, now, now + ttl if ttl else None)


async def test_claims_are_the_record_mounts_round_trip_and_in_use(tmp_path: Path) -> None:
    async with fake_cluster(tmp_path, kubelet=instant_kubelet) as (api, make):
        one, two = make(), make()  # two replicas, one cluster
        made = await one.volumes.create(_rec("data"), 5 << 20)
        assert made.id == one.volumes.mount_id("alice", "data")
        claim = api.items("persistentvolumeclaims", NS)[kv.pvc_name(one.opts, "alice", "data")]
        assert claim["spec"]["resources"]["requests"]["storage"] == str(5 << 20)
        with pytest.raises(VolumeExists):
            await two.volumes.create(_rec("data"), None)
        assert [r.name for r in await two.volumes.list("alice")] == ["data"]
        assert await two.volumes.find("bob", "data") is None
        assert await two.volumes.list("bob") == []

        mount = VolumeMount(made.id, "data", "/data", read_only=True)
        await one.create(spec("sb-v", volumes=(mount,)))
        pod = api.pods(NS)[objs.pod_name("sb-v")]
        vols = [v for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v]
        assert vols[0]["persistentVolumeClaim"] == {
            "claimName": kv.pvc_name(one.opts, "alice", "data"),
            "readOnly": True,
        }
        rec = await two.get("sb-v")  # another replica, from the pod alone
        assert rec is not None and rec.volumes == (mount,)
        with pytest.raises(VolumeInUse) as e:
            await two.volumes.delete(made)
        assert (e.value.details or {})["sandboxes"] == ["sb-v"]
        assert await one.volumes.find("alice", "data") is not None  # shown again

        await one.delete("sb-v")
        await two.volumes.delete(made)
        assert await one.volumes.find("alice", "data") is None
        with pytest.raises(NotFound):  # mounting a volume gone: 404, no pod left
            await one.create(spec("sb-w", volumes=(mount,)))
        assert api.pods(NS) == {}

        await one.volumes.create(_rec("old", ttl=0.01), None)
        time.sleep(0.02)
        assert await one.volumes.find("alice", "old") is None  # expired: gone at once
        assert await one.volumes.sweep() == [kv.volume_id(one.opts, "alice", "old")]
        assert api.items("persistentvolumeclaims", NS) == {}

        role = next(
            d for d in yaml.safe_load_all(RBAC.read_text())
            if d["kind"] == "Role" and d["metadata"]["name"] == "orchard-volumes"
        )  # fmt: skip
        granted = {
            (r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]
        }
        used = {_verb(*r) for r in api.requests if "/persistentvolumeclaims" in r[1]}
        assert used == granted, used ^ granted
