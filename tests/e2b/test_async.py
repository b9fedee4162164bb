"""The async twin (`AsyncSandbox`) with the real SDK: the same surface, on asyncio."""

from __future__ import annotations

from tests.e2b.conftest import SDK


def test_async_sandbox(sdk: SDK) -> None:
    out = sdk.run(
        """
        import asyncio

        async def main():
            sbx = await AsyncSandbox.create(metadata={"flavour": "async"})
            try:
                seen = []
                r = await sbx.commands.run("echo a; sleep 0.3; echo b", on_stdout=seen.append)
                result["run"] = [r.stdout, seen]
                try:
                    await sbx.commands.run("exit 7")
                except CommandExitException as e:
                    result["exit"] = e.exit_code
                h = await sbx.commands.run("read x; echo $x!", background=True, stdin=True)
                await h.send_stdin("hi\\n")
                result["stdin"] = (await h.wait()).stdout
                bg = await sbx.commands.run("sleep 100", background=True)
                result["kill"] = await bg.kill()
                await sbx.files.write("/tmp/x/y.txt", "async")
                result["read"] = await sbx.files.read("/tmp/x/y.txt")
                result["ls"] = [e.name for e in await sbx.files.list("/tmp/x")]
                result["exists"] = await sbx.files.exists("/tmp/x/y.txt")
                await sbx.set_timeout(200)
                info = await sbx.get_info()
                result["meta"] = info.metadata
                page = await AsyncSandbox.list().next_items()
                result["listed"] = sbx.sandbox_id in [s.sandbox_id for s in page]
                result["running"] = await sbx.is_running()
            finally:
                result["killed"] = await sbx.kill()

        asyncio.run(main())
        """
    )
    assert out["run"] == ["a\nb\n", ["a\n", "b\n"]]
    assert out["exit"] == 7
    assert out["stdin"] == "hi!\n"
    assert out["kill"] is True
    assert out["read"] == "async" and out["ls"] == ["y.txt"] and out["exists"] is True
    assert out["meta"] == {"flavour": "async"}
    assert out["listed"] is True and out["running"] is True and out["killed"] is True
