"""The PVC and pod-volume builders of volumes on Kubernetes (kubernetes/volumes.py),
validated against the API server's OpenAPI schemas, and the record read back."""

from __future__ import annotations

import pytest

from orchard.env.backends.kubernetes import volumes as kv
from orchard.env.backends.kubernetes.objects import KubernetesOptions, build_pod, record_from_pod
from orchard.env.backends.volume_base import VolumeMount, VolumeRecord, new_volume_id
from orchard.env.errors import QuotaExceeded
from tests.kubernetes.test_k8s_objects import spec, validate


def _rec(**kw: object) -> VolumeRecord:
    base: dict[str, object] = dict(
        id=new_volume_id(), owner="alice:team", name="data", created_at=1.5
    )
    base.update(kw)
    return VolumeRecord(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("expires", [None, 99.25])
def test_pvc_is_valid_and_reads_back(expires: float | None) -> None:
    opts = KubernetesOptions()
    rec = _rec(expires_at=expires, labels={"k": "v"})
    pvc = kv.build_pvc(opts, rec, "orchard-sandboxes-0123", 5 << 20, "local-path")
    validate(pvc)
    assert pvc["spec"]["resources"]["requests"]["storage"] == str(5 << 20)
    back = kv.record_from_pvc(pvc)
    assert back == rec


def test_names_are_per_instance_owner_and_name() -> None:
    a, b = KubernetesOptions(), KubernetesOptions(instance="other")
    names = {
        kv.pvc_name(a, "alice", "data"),
        kv.pvc_name(a, "bob", "data"),
        kv.pvc_name(a, "alice", "data2"),
        kv.pvc_name(b, "alice", "data"),
    }
    assert len(names) == 4
    assert kv.pvc_name(a, "alice", "data") == kv.pvc_name(a, "alice", "data")


def test_read_only_mounts_are_read_only_in_the_pod_and_the_container() -> None:
    opts = KubernetesOptions()
    mounts = [
        VolumeMount(new_volume_id(), "data", "/data", read_only=True),
        VolumeMount(new_volume_id(), "cache", "/cache"),
    ]
    volumes, volume_mounts = kv.pod_volumes(opts, "alice", mounts)
    assert volumes[0]["persistentVolumeClaim"]["readOnly"] is True
    assert volume_mounts[0]["readOnly"] is True
    assert "readOnly" not in volumes[1]["persistentVolumeClaim"]
    assert volume_mounts[1]["readOnly"] is False
    pod = build_pod(spec(), opts, 1.0)
    pod["spec"]["volumes"] += volumes
    pod["spec"]["containers"][0].setdefault("volumeMounts", []).extend(volume_mounts)
    validate(pod)


def test_foreign_or_deleted_pvcs_are_not_records() -> None:
    assert kv.record_from_pvc({"metadata": {"name": "x"}}) is None
    pvc = kv.build_pvc(KubernetesOptions(), _rec(), "ns", 1)
    pvc["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    rec = kv.record_from_pvc(pvc)
    assert rec is not None and rec.deleted and not rec.live()


def test_sizes_over_the_owner_limit_are_refused() -> None:
    kv.check_request(10, None)
    kv.check_request(10, 10)
    with pytest.raises(QuotaExceeded):
        kv.check_request(11, 10)
    assert kv.request_bytes(None) == kv.DEFAULT_REQUEST
    assert kv.request_bytes(7) == 7


def test_a_pods_mounts_are_in_its_spec_and_read_back_from_it() -> None:
    opts = KubernetesOptions()
    mounts = (
        VolumeMount(kv.volume_id(opts, "alice", "data"), "data", "/data", read_only=True),
        VolumeMount(kv.volume_id(opts, "alice", "out"), "out", "/out"),
    )
    s = spec(owner="alice", volumes=mounts)
    pod = build_pod(s, opts, 1.0)
    kv.add_mounts(pod, opts, s)
    validate(pod)
    claims = [v for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v]
    assert [c["persistentVolumeClaim"]["claimName"] for c in claims] == [
        kv.pvc_name(opts, "alice", "data"),
        kv.pvc_name(opts, "alice", "out"),
    ]
    rec = record_from_pod(pod, opts)
    assert rec is not None and rec.volumes == mounts
    bare = build_pod(spec(), opts, 1.0)
    kv.add_mounts(bare, opts, spec())
    assert record_from_pod(bare, opts).volumes == ()  # type: ignore[union-attr]
