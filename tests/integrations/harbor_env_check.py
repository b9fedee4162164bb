"""Every OrchardEnvironment method, loaded the way Harbor loads it (by import path).

Run by test_harbor.py with the Harbor virtualenv's Python (Harbor needs >= 3.12); prints
"ok" and exits 0 when every check holds.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

from harbor.environments.factory import EnvironmentFactory  # type: ignore[import-not-found]
from harbor.models.task.config import EnvironmentConfig, NetworkMode, NetworkPolicy  # type: ignore[import-not-found]
from harbor.models.trial.paths import TrialPaths  # type: ignore[import-not-found]

IMPORT_PATH = "orchard.integrations.harbor:OrchardEnvironment"


async def main(image: str) -> None:
    tmp = Path(tempfile.mkdtemp())
    env_dir = tmp / "environment"
    env_dir.mkdir()
    paths = TrialPaths(trial_dir=tmp / "trial")
    paths.mkdir()
    cls = EnvironmentFactory.get_environment_class(import_path=IMPORT_PATH)
    env = cls(
        environment_dir=env_dir,
        environment_name="check",
        session_id="check__env",
        trial_paths=paths,
        task_env_config=EnvironmentConfig(
            docker_image=image, cpus=0.5, memory_mb=256, workdir="/work", env={"TASK": "t"}
        ),
        network_policy=NetworkPolicy(network_mode=NetworkMode.NO_NETWORK),
        phase_network_policies=[NetworkPolicy(network_mode=NetworkMode.PUBLIC)],
    )
    await env.start(force_build=False)
    try:
        info = await env._sandbox.refresh()
        assert (info.resources.cpu, info.resources.memory_bytes) == (0.5, 256 * 1024**2), info
        assert info.network.egress == "none"
        r = await env.exec("echo $TASK $X; pwd; [[ 1 == 1 ]] && echo bash", env={"X": "y"})
        assert (r.return_code, r.stdout) == (0, "t y\n/work\nbash\n"), r
        r = await env.exec("pwd; id -u; exit 4", cwd="/tmp", user="nobody")
        assert (r.return_code, r.stdout) == (4, "/tmp\n65534\n"), r
        try:
            await env.exec("sleep 10", timeout_sec=1)
            raise AssertionError("no timeout")
        except RuntimeError as exc:
            assert "timed out" in str(exc)
        src = tmp / "up"
        (src / "sub").mkdir(parents=True)
        (src / "a.txt").write_text("A")
        (src / "sub" / "b.bin").write_bytes(bytes(range(256)))
        await env.upload_dir(src, "/data")
        await env.upload_file(src / "a.txt", "/single/a.txt")
        r = await env.exec("cat /data/a.txt /single/a.txt; wc -c < /data/sub/b.bin")
        assert r.stdout == "AA256\n", r
        down = tmp / "down"
        await env.download_dir("/data", down)
        assert (down / "sub" / "b.bin").read_bytes() == bytes(range(256))
        await env.download_file("/single/a.txt", down / "x" / "a.txt")
        assert (down / "x" / "a.txt").read_text() == "A"
        assert await env.is_dir("/data") and await env.is_file("/data/a.txt")
        await env.set_network_policy(NetworkPolicy(network_mode=NetworkMode.PUBLIC))
        assert (await env._sandbox.refresh()).network.egress == "all"
        allow = NetworkPolicy(network_mode=NetworkMode.ALLOWLIST, allowed_hosts=["10.9.8.0/24"])
        env.validate_network_policy_support(allow)
    finally:
        await env.stop(delete=True)
    print("ok")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
