from orchard.env.backends.kubernetes.snapshots import (
    OWNER_LABEL,
    configmap_name,
    expired,
    from_configmap,
    to_configmap,
)
from orchard.env.backends.state_base import SnapshotRecord


def _record(complete: bool = True) -> SnapshotRecord:
    return SnapshotRecord(
        id="SnapAB12",
        owner="team-a",
        source="sb-1",
        image="10.96.0.50:5000/orchard/snapshots@sha256:" + "0" * 64,
        created_at=100.5,
        expires_at=200.25,
        settings={"cpu": 1.0},
        name="prepared",
        size_bytes=4096,
        extra={"digest": "sha256:" + "0" * 64},
        complete=complete,
    )


def test_record_round_trips_through_a_configmap() -> None:
    body = to_configmap(_record(), "orchard")
    assert body["metadata"]["name"] == configmap_name("SnapAB12") == "orchard-snapshot-snapab12"
    assert body["metadata"]["labels"][OWNER_LABEL] == "team-a"
    assert from_configmap(body) == _record()


def test_incomplete_record_stays_incomplete() -> None:
    assert from_configmap(to_configmap(_record(complete=False), "orchard")).complete is False


def test_expiry() -> None:
    assert not expired(_record(), 200.0)
    assert expired(_record(), 200.25)


def test_labels_select_and_annotations_keep_the_owner() -> None:
    """Owner names need not be label values: the label is the tenant key, the owner an
    annotation; an incomplete record names the replica writing it, for the reaper."""
    from orchard.env.backends.kubernetes.snapshots import INSTANCE_LABEL, writer

    rec = _record(complete=False)
    rec.owner = "team a:ops"
    body = to_configmap(rec, "orchard-sandboxes", instance="x", owner_key="0f" * 8, writer="r-1")
    assert body["metadata"]["labels"][OWNER_LABEL] == "0f" * 8
    assert body["metadata"]["labels"][INSTANCE_LABEL] == "x"
    assert from_configmap(body).owner == "team a:ops"
    assert writer(body) == "r-1"
    assert writer(to_configmap(_record(), "orchard-sandboxes")) == ""


def test_snapshot_options_and_image_names() -> None:
    from orchard.env.backends.kubernetes.snapshotting import SnapshotOptions, image_id

    opts = SnapshotOptions.from_env({})
    digest = "sha256:" + "a" * 64
    assert opts.image(digest) == (
        "orchard-registry.orchard-system.svc:5000/orchard/snapshots@" + digest
    )
    opts = SnapshotOptions.from_env(
        {"ORCHARD_K8S_REGISTRY_URL": "http://10.96.0.50:5000/", "ORCHARD_K8S_COMMIT_TIMEOUT_S": "9"}
    )
    assert (opts.registry_url, opts.commit_timeout_s) == ("http://10.96.0.50:5000", 9.0)
    pod = {"status": {"containerStatuses": [
        {"name": "orchard-agent", "imageID": "sha256:" + "1" * 64},
        {"name": "sandbox", "imageID": "docker.io/library/busybox@" + digest},
    ]}}  # fmt: skip
    assert image_id(pod, "sb-1") == "docker.io/library/busybox@" + digest
