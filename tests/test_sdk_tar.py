"""The SDK's fast tar paths give what tarfile (with its `data` filter) gives, and stay safe."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from orchard.env.errors import OrchardError
from orchard.env.sdk import tar as tars


def _tar(entries: list[tuple[str, bytes | None, int, str | None]]) -> bytes:
    """A tar of (name, data or None for a folder, mode, symlink target) entries."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data, mode, link in entries:
            info = tarfile.TarInfo(name)
            info.mode, info.mtime = mode, 1_600_000_000 + len(name)
            if link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, link
                tar.addfile(info)
            elif data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _state(root: Path) -> dict[str, tuple[str, int, int, bytes]]:
    out: dict[str, tuple[str, int, int, bytes]] = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        rel = p.relative_to(root).as_posix()
        if p.is_symlink():
            out[rel] = ("link", 0, 0, os.readlink(p).encode())
        elif p.is_dir():
            out[rel] = ("dir", st.st_mode & 0o7777, 0, b"")
        else:
            out[rel] = ("file", st.st_mode & 0o7777, int(st.st_mtime), p.read_bytes())
    return out


def test_extract_matches_tarfile_data_filter(tmp_path: Path) -> None:
    data = _tar(
        [
            ("d", None, 0o755, None),
            ("d/plain", b"plain", 0o644, None),
            ("d/setuid", b"s", 0o4777, None),
            ("d/noexec", b"n", 0o467, None),
            ("deep/er/file", b"made parents", 0o640, None),
            ("./dot/x", b"dot", 0o600, None),
            ("d/../up", b"up and back", 0o644, None),
            ("ln", None, 0o777, "d"),
            ("ln/through", b"via a link inside", 0o644, None),
            ("d/plain", b"replaced", 0o644, None),
            ("long/" + "n" * 120, b"pax name", 0o644, None),
            ("unicod\u00e9", b"pax", 0o644, None),
        ]
    )
    ours, ref = tmp_path / "ours", tmp_path / "ref"
    result = tars.extract_tar(io.BytesIO(data), ours)
    ref.mkdir()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar:
            tar.extract(member, ref, filter="data")
    assert _state(ours) == _state(ref)
    assert (ours / "d" / "through").read_bytes() == b"via a link inside"
    assert result.files == 11


def test_extract_never_writes_through_a_symlink_out(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_bytes(b"keep")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "f").symlink_to(outside)  # already in the destination folder
    (dest / "dir").symlink_to(tmp_path)
    for entry in ("f", "dir/outside", "dir/new"):
        with pytest.raises(OrchardError, match="unsafe"):
            tars.extract_tar(io.BytesIO(_tar([(entry, b"evil", 0o644, None)])), dest)
    assert outside.read_bytes() == b"keep"
    assert not (tmp_path / "new").exists()


def test_extract_link_then_entry_through_it_is_refused(tmp_path: Path) -> None:
    data = _tar([("a", None, 0o777, "../.."), ("a/escape", b"evil", 0o644, None)])
    with pytest.raises(OrchardError, match="unsafe"):
        tars.extract_tar(io.BytesIO(data), tmp_path / "x" / "dest")
    assert not (tmp_path / "escape").exists()


def test_truncated_member_is_an_error(tmp_path: Path) -> None:
    data = _tar([("big", b"x" * 5000, 0o644, None)])
    with pytest.raises(tarfile.ReadError):
        tars.extract_tar(io.BytesIO(data[:2048]), tmp_path / "dest")


def test_headers_are_tarfiles_own(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "file").write_bytes(b"abc")
    os.chmod(tmp_path / "sub" / "file", 0o4751)
    (tmp_path / "link").symlink_to("sub/file")
    (tmp_path / ("x" * 150)).write_bytes(b"long name")
    (tmp_path / "caf\u00e9").write_bytes(b"utf-8 name")
    for path, kind in (
        (tmp_path / "sub", tarfile.DIRTYPE),
        (tmp_path / "sub" / "file", tarfile.REGTYPE),
        (tmp_path / "link", tarfile.SYMTYPE),
        (tmp_path / ("x" * 150), tarfile.REGTYPE),
        (tmp_path / "caf\u00e9", tarfile.REGTYPE),
    ):
        st = path.lstat()
        name = path.relative_to(tmp_path).as_posix()
        link = os.readlink(path) if kind == tarfile.SYMTYPE else ""
        info = tarfile.TarInfo(name + ("/" if kind == tarfile.DIRTYPE else ""))
        info.mode, info.mtime, info.type, info.linkname = (
            st.st_mode & 0o7777,
            int(st.st_mtime),
            kind,
            link,
        )
        info.size = st.st_size if kind == tarfile.REGTYPE else 0
        expected = info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
        assert tars._header(name, st, kind, link) == expected


def test_small_files_share_pieces(tmp_path: Path) -> None:
    for i in range(300):
        (tmp_path / f"f{i:03d}").write_bytes(b"x" * 100)
    pieces = list(tars.iter_tar(tmp_path))
    assert len(pieces) == 1  # 300 entries of 1 KiB each: one piece, not 900
    with tarfile.open(fileobj=io.BytesIO(pieces[0])) as tar:
        names = tar.getnames()
    assert names == [f"f{i:03d}" for i in range(300)]
