"""The local backend's runtime spec (pure) and the `auto` backend choice (on this host)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchard.env.backends.local.oci_spec import DEFAULT_PATH, SpecInput, merge_env, runtime_spec
from orchard.env.backends.select import auto_backend, docker_answers


def test_env_merges_like_docker() -> None:
    env = merge_env(["A=image", "B=image"], {"B": "spec", "C": "spec"})
    assert env == ["A=image", "B=spec", "C=spec", f"PATH={DEFAULT_PATH}"]
    assert merge_env(["PATH=/opt/bin"], {}) == ["PATH=/opt/bin"]


def test_runtime_spec_policy() -> None:
    spec = runtime_spec(
        SpecInput(
            rootfs="/r",
            args=["/.orchard/agent"],
            env=["PATH=/bin"],
            cwd="",
            hostname="sb-1",
            cgroups_path="/orchard/sb-1",
            binds=[("/host/agent", "/.orchard/agent", True), ("/host/run", "/.orchard/run", False)],
            cpu=1.5,
            memory_bytes=64 << 20,
            pids_limit=96,
        )
    )
    proc, linux = spec["process"], spec["linux"]
    assert proc["user"] == {"uid": 0, "gid": 0} and proc["noNewPrivileges"] is True
    assert proc["cwd"] == "/"
    caps = set(proc["capabilities"]["bounding"])
    assert {"CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_CHOWN"} <= caps
    assert not caps & {"CAP_NET_RAW", "CAP_MKNOD", "CAP_AUDIT_WRITE", "CAP_SETFCAP"}
    assert not caps & {"CAP_SYS_ADMIN", "CAP_NET_ADMIN", "CAP_SYS_PTRACE"}
    assert {n["type"] for n in linux["namespaces"]} == {"pid", "network", "ipc", "uts", "mount"}
    assert all("path" not in n for n in linux["namespaces"])  # always new ones
    res = linux["resources"]
    assert res["cpu"] == {"quota": 150_000, "period": 100_000}
    assert res["memory"] == {"limit": 64 << 20, "swap": 64 << 20}
    assert res["pids"] == {"limit": 96}
    assert "/proc/kcore" in linux["maskedPaths"] and "/proc/sys" in linux["readonlyPaths"]
    denied = {n for rule in linux["seccomp"]["syscalls"] for n in rule["names"]}
    assert {"unshare", "setns", "bpf", "kexec_load", "clone3"} <= denied
    binds = {m["destination"]: m["options"] for m in spec["mounts"] if m["type"] == "bind"}
    assert "ro" in binds["/.orchard/agent"] and "ro" not in binds["/.orchard/run"]


def test_auto_prefers_an_answering_engine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    if docker_answers():
        assert auto_backend() == "docker"
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'no-engine.sock'}")
    assert not docker_answers()
    assert auto_backend() == "local"  # root with runc on PATH, as here
