"""The operator's settings of issue 17's defences: parsed once, handed to either backend."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchard.env.backends.docker.backend import DockerBackend
from orchard.env.backends.local.backend import LocalBackend
from orchard.env.config import ConfigError, ServiceConfig
from orchard.env.image_policy import DEFAULT_REGISTRIES


def test_settings_from_the_environment(tmp_path: Path, agent_binary: Path) -> None:
    env = {
        "ORCHARD_STATE_DIR": str(tmp_path),
        "ORCHARD_REGISTRIES": "ghcr.io, registry.internal:5000",
        "ORCHARD_IMAGE_DIRS": str(tmp_path),
        "ORCHARD_EGRESS_PROTECT": "10.96.0.0/12,10.244.0.0/16",
        "ORCHARD_DEFAULT_DISK": "20g",
    }
    cfg = ServiceConfig.from_env(env)
    assert cfg.registries == ("ghcr.io", "registry.internal:5000")
    assert cfg.default_disk_bytes == 20 << 30
    opts = cfg.backend_options()
    assert opts["image_policy"].registries == ("ghcr.io", "registry.internal:5000")
    assert opts["image_policy"].file_dirs == (str(tmp_path.resolve()),)
    for cls in (DockerBackend, LocalBackend):
        b = cls(tmp_path / cls.name, agent_binary, **opts)
        fw = b.firewall if isinstance(b, DockerBackend) else b.network.firewall
        assert {"10.96.0.0/12", "10.244.0.0/16", "10.213.0.0/16", "10.215.0.0/16"} <= set(
            fw.protected
        )
        assert b.default_disk_bytes == 20 << 30
    defaults = ServiceConfig.from_env({"ORCHARD_STATE_DIR": str(tmp_path)})
    assert defaults.registries == DEFAULT_REGISTRIES and defaults.default_disk_bytes is None


@pytest.mark.parametrize(
    ("var", "value"),
    [("ORCHARD_EGRESS_PROTECT", "10.0.0.0/33"), ("ORCHARD_DEFAULT_DISK", "1k")],
)
def test_bad_settings_are_refused(tmp_path: Path, var: str, value: str) -> None:
    with pytest.raises(ConfigError):
        ServiceConfig.from_env({"ORCHARD_STATE_DIR": str(tmp_path), var: value})
