"""scripts/criu.sh on a fresh machine, run for real against fake apt-get/dpkg/make on a temp PATH.

The fresh-machine path: no criu; Debian's criu installed by apt (it fails `criu check` on
new kernels); CRIU built from source and installed earlier on PATH. The check after the
build must run the new binary, not the one bash remembered from the check before it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CRIU_SH = ROOT / "scripts" / "criu.sh"

BROKEN_CRIU = """#!/bin/sh
case "$1" in
  check) echo "Error (criu/vdso.c:381): vdso: Unexpected rt vDSO area bounds" >&2; exit 1;;
  --version) echo "Version: 3.17.1";;
esac
"""
WORKING_CRIU = """#!/bin/sh
case "$1" in
  check) echo "Looks good."; exit 0;;
  --version) echo "Version: 4.2.1";;
esac
"""
# apt-get: `install ... criu` puts Debian's (broken) criu in $FAKE_DEBIAN_BIN; `source`
# leaves an orig tarball in the current folder; anything else (deps, update) succeeds.
FAKE_APT_GET = """#!/bin/bash
args=" $* "
if [[ $args == *" install "* && $args == *" criu "* ]]; then
  cp "$FAKE_BROKEN_CRIU" "$FAKE_DEBIAN_BIN/criu"; chmod +x "$FAKE_DEBIAN_BIN/criu"
elif [[ $args == *" source "* ]]; then
  mkdir -p criu-4.2.1/criu && tar -czf criu_4.2.1.orig.tar.gz criu-4.2.1 && rm -rf criu-4.2.1
fi
exit 0
"""
# make -C SRC ... criu: the build leaves a working criu in SRC/criu/criu.
FAKE_MAKE = """#!/bin/bash
[ "$1" = -C ] || exit 2
cp "$FAKE_WORKING_CRIU" "$2/criu/criu"; chmod +x "$2/criu/criu"
"""
FAKES = {
    "apt-get": FAKE_APT_GET,
    "make": FAKE_MAKE,
    "dpkg": "#!/bin/sh\nexit 1\n",  # nothing is installed
    "sudo": '#!/bin/sh\nexec "$@"\n',
    "uname": "#!/bin/sh\necho 6.18.44-test\n",  # a kernel that needs CRIU >= 4.2
}


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def _run_criu_sh(tmp_path: Path, path: str) -> str:
    """Run scripts/criu.sh with the fakes; `path` names {fakebin}, {debian} and {prefix}."""
    fakebin, debian_bin, prefix = tmp_path / "fakebin", tmp_path / "debian", tmp_path / "prefix"
    for name, text in FAKES.items():
        _write(fakebin / name, text)
    debian_bin.mkdir()
    apt_etc = tmp_path / "apt"
    _write(apt_etc / "sources.list.d" / "debian.sources", "URIs: http://deb.example/debian\n")
    env = {
        "PATH": path.format(fakebin=fakebin, debian=debian_bin, prefix=prefix),
        "HOME": str(tmp_path),
        "TMPDIR": str(tmp_path),
        "CRIU_PREFIX": str(prefix),
        "APT_ETC": str(apt_etc),
        "FAKE_DEBIAN_BIN": str(debian_bin),
        "FAKE_BROKEN_CRIU": str(_write(tmp_path / "broken-criu", BROKEN_CRIU)),
        "FAKE_WORKING_CRIU": str(_write(tmp_path / "working-criu", WORKING_CRIU)),
    }
    proc = subprocess.run(
        ["/bin/bash", str(CRIU_SH)], env=env, capture_output=True, text=True, timeout=60
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert (debian_bin / "criu").exists(), f"Debian's criu was not tried first:\n{out}"
    assert "building CRIU 4.2.1" in out, out
    assert os.access(prefix / "sbin" / "criu", os.X_OK), out
    return out


def test_fresh_machine_checks_the_criu_it_just_built(tmp_path: Path) -> None:
    # The built criu's folder first on PATH, Debian's last; no real criu (/usr/sbin, /sbin).
    assert not any((Path(d) / "criu").exists() for d in ("/usr/bin", "/bin")), "a real criu"
    out = _run_criu_sh(tmp_path, "{prefix}/sbin:{fakebin}:/usr/bin:/bin:{debian}")
    assert f"Version: 4.2.1 installed in {tmp_path}/prefix/sbin" in out, out
    assert "still fails" not in out, out


def test_built_criu_that_path_does_not_find_is_named(tmp_path: Path) -> None:
    """The build works but PATH finds Debian's first: say so, not "CRIU fails"."""
    out = _run_criu_sh(tmp_path, "{fakebin}:{debian}:/usr/bin:/bin:{prefix}/sbin")
    want = f"{tmp_path}/prefix/sbin/criu works, but PATH finds {tmp_path}/debian/criu first"
    assert want in out, out
