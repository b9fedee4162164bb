"""`files` with the real SDK: write (multipart, octet-stream, gzip, several at once), read
(text, bytes, stream), list, exists, get_info, make_dir, rename, remove; and the errors."""

from __future__ import annotations

from tests.e2b.conftest import SDK, UPLOAD_LIMIT


def test_files(sdk: SDK) -> None:
    out = sdk.run(
        f"""
        import io
        from e2b import FileType
        with Sandbox.create() as sbx:
            f = sbx.files
            w = f.write("/tmp/e2b/a.txt", "hello\\n")
            result["write"] = [w.name, w.path, str(w.type.value)]
            result["read"] = f.read("/tmp/e2b/a.txt")
            data = bytes(range(256)) * 64
            f.write("/tmp/e2b/bin", data)
            result["bytes"] = bytes(f.read("/tmp/e2b/bin", format="bytes")) == data
            f.write("/tmp/e2b/stream", io.BytesIO(data))  # a file-like: octet-stream
            result["octet"] = bytes(f.read("/tmp/e2b/stream", format="bytes")) == data
            f.write("/tmp/e2b/gz", data, gzip=True)
            result["gzip"] = bytes(f.read("/tmp/e2b/gz", format="bytes")) == data
            chunks = b"".join(f.read("/tmp/e2b/bin", format="stream"))
            result["read_stream"] = chunks == data
            many = f.write_files([
                {{"path": "/tmp/e2b/m/one", "data": "1"}},
                {{"path": "/tmp/e2b/m/two", "data": b"2"}},
                {{"path": "/tmp/e2b/m/with \\"quote\\" and space", "data": "3"}},
            ])
            result["many"] = [i.path for i in many]
            result["quoted"] = f.read('/tmp/e2b/m/with "quote" and space')
            result["ls"] = sorted((e.name, str(e.type.value)) for e in f.list("/tmp/e2b"))
            result["deep"] = sorted(e.path for e in f.list("/tmp/e2b", depth=2))
            result["exists"] = [f.exists("/tmp/e2b/a.txt"), f.exists("/tmp/e2b/nope")]
            info = f.get_info("/tmp/e2b/a.txt")
            result["info"] = [info.name, info.size, info.permissions, str(info.type.value)]
            result["mkdir"] = [f.make_dir("/tmp/e2b/new/deep"), f.make_dir("/tmp/e2b/new/deep")]
            moved = f.rename("/tmp/e2b/a.txt", "/tmp/e2b/new/b.txt")
            result["moved"] = [moved.path, f.read("/tmp/e2b/new/b.txt"), f.exists("/tmp/e2b/a.txt")]
            f.remove("/tmp/e2b/new")
            result["removed"] = f.exists("/tmp/e2b/new")
            f.remove("/tmp/e2b/never-was")  # as envd: nothing to remove is fine
            f.write("rel.txt", "home")  # relative: the user's home (root's)
            result["relative"] = sbx.commands.run("cat /root/rel.txt").stdout
            sbx.commands.run("ln -s /tmp/e2b/bin /tmp/e2b/link")
            link = f.get_info("/tmp/e2b/link")
            result["link"] = [str(link.type.value), link.symlink_target]
            for what, call in (
                ("read_missing", lambda: f.read("/tmp/e2b/missing")),
                ("read_dir", lambda: f.read("/tmp")),
                ("list_missing", lambda: f.list("/tmp/e2b/missing")),
                ("info_missing", lambda: f.get_info("/tmp/e2b/missing")),
                ("metadata", lambda: f.write("/tmp/e2b/meta", "x", metadata={{"k": "v"}})),
                ("too_big", lambda: f.write("/tmp/e2b/big", b"x" * ({UPLOAD_LIMIT} + 1))),
                ("too_big_stream", lambda: f.write(
                    "/tmp/e2b/big2", io.BytesIO(b"x" * ({UPLOAD_LIMIT} + 1)))),
            ):
                try:
                    call()
                    result[what] = "no error"
                except Exception as e:
                    result[what] = kind(e)
            gone = ("/tmp/e2b/big", "/tmp/e2b/big2", "/tmp/e2b/meta")
            result["no_partial"] = [f.exists(p) for p in gone]
        """
    )
    assert out["write"] == ["a.txt", "/tmp/e2b/a.txt", "file"]
    assert out["read"] == "hello\n"
    assert out["bytes"] and out["octet"] and out["gzip"] and out["read_stream"]
    assert out["many"] == ["/tmp/e2b/m/one", "/tmp/e2b/m/two", '/tmp/e2b/m/with "quote" and space']
    assert out["quoted"] == "3"
    assert out["ls"] == [
        ["a.txt", "file"],
        ["bin", "file"],
        ["gz", "file"],
        ["m", "dir"],
        ["stream", "file"],
    ]
    assert "/tmp/e2b/m/one" in out["deep"] and "/tmp/e2b/a.txt" in out["deep"]
    assert out["exists"] == [True, False]
    assert out["info"] == ["a.txt", 6, "-rw-r--r--", "file"]
    assert out["mkdir"] == [True, False]
    assert out["moved"] == ["/tmp/e2b/new/b.txt", "hello\n", False]
    assert out["removed"] is False
    assert out["relative"] == "home"
    assert out["link"] == ["symlink", "/tmp/e2b/bin"]
    assert out["read_missing"] == "FileNotFoundException"
    assert out["read_dir"] == "InvalidArgumentException"
    assert out["list_missing"] == "FileNotFoundException"
    assert out["info_missing"] == "FileNotFoundException"
    assert out["metadata"] == "InvalidArgumentException"
    assert out["too_big"] == "SandboxException"
    assert out["too_big_stream"] == "SandboxException"
    assert out["no_partial"] == [False, False, False]


def test_watch_dir(sdk: SDK) -> None:
    out = sdk.run(
        """
        import asyncio
        with Sandbox.create() as sbx:
            f = sbx.files
            f.make_dir("/tmp/w/sub")
            h = f.watch_dir("/tmp/w", recursive=True)
            f.write("/tmp/w/a", "1")
            f.write("/tmp/w/sub/b", "2")
            result["first"] = [[e.name, e.type.value] for e in h.get_new_events()]
            result["quiet"] = h.get_new_events()
            f.write("/tmp/w/a", "123")
            sbx.commands.run("chmod 600 /tmp/w/a; rm /tmp/w/sub/b")
            result["second"] = [[e.name, e.type.value] for e in h.get_new_events()]
            flat = f.watch_dir("/tmp/w", include_entry=True)
            f.write("/tmp/w/sub/c", "deep")
            f.write("/tmp/w/d", "top")
            events = flat.get_new_events()
            result["flat"] = [[e.name, e.type.value, e.entry and e.entry.size] for e in events]
            h.stop()
            flat.stop()
            try:
                h.get_new_events()
            except Exception as e:
                result["stopped"] = kind(e)
            try:
                f.watch_dir("/tmp/w/a")
            except Exception as e:
                result["not_a_dir"] = kind(e)

        async def streamed():
            sbx = await AsyncSandbox.create()
            try:
                seen = []
                await sbx.files.make_dir("/tmp/aw")
                handle = await sbx.files.watch_dir("/tmp/aw", on_event=seen.append)
                await sbx.files.write("/tmp/aw/x", "x")
                for _ in range(100):
                    if seen:
                        break
                    await asyncio.sleep(0.1)
                await handle.stop()
                result["streamed"] = [[e.name, e.type.value] for e in seen]
            finally:
                await sbx.kill()

        asyncio.run(streamed())
        """,
        hard_exit=True,
    )
    assert out["first"] == [["a", "create"], ["sub/b", "create"]]
    assert out["quiet"] == []
    assert out["second"] == [["a", "write"], ["a", "chmod"], ["sub/b", "remove"]]
    assert out["flat"] == [["d", "create", 3]]  # not recursive: sub/c is not seen
    assert out["stopped"] == "SandboxException"
    assert out["not_a_dir"] == "InvalidArgumentException"
    assert out["streamed"] == [["x", "create"]]


def test_signed_urls_by_header(sdk: SDK) -> None:
    """In header mode a signed URL names no sandbox (it is E2B_SANDBOX_URL/files?...): a
    client adds `E2b-Sandbox-Id`, and the signature stands for the token. Host mode, where
    the URL alone is enough: test_host_mode.py::test_signed_file_urls."""
    out = sdk.run(
        """
        import httpx
        with Sandbox.create() as sbx:
            sbx.files.write("/tmp/s.txt", "signed")
            routed = {"E2b-Sandbox-Id": sbx.sandbox_id}
            url = sbx.download_url("/tmp/s.txt", use_signature_expiration=60)
            r = httpx.get(url, headers=routed)
            result["download"] = [r.status_code, r.text]
            result["no_header"] = httpx.get(url).status_code
            up = sbx.upload_url("/tmp/s2.txt")
            r = httpx.post(up, headers=routed, files={"file": ("s2.txt", b"up")})
            result["upload"] = [r.status_code, sbx.files.read("/tmp/s2.txt")]
            bad = url.replace("signature=v1_", "signature=v1_x")
            r = httpx.get(bad, headers=routed)
            result["forged"] = [r.status_code, r.json()]
        """
    )
    assert out["download"] == [200, "signed"]
    assert out["no_header"] == 404  # not routed: no sandbox named
    assert out["upload"] == [200, "up"]
    assert out["forged"] == [401, {"code": 401, "message": "invalid signature"}]
