"""The control API with the real SDK: create, get_info, list, connect, set_timeout, kill,
and the errors the SDK turns into its own exception types."""

from __future__ import annotations

from tests.e2b.conftest import SDK
from tests.security.conftest import KEY_BOB


def test_lifecycle(sdk: SDK) -> None:
    out = sdk.run(
        """
        from e2b import SandboxQuery
        sbx = Sandbox.create(metadata={"who": "alice"}, timeout=120)
        info = sbx.get_info()
        result["id"] = sbx.sandbox_id
        result["template"] = info.template_id
        result["state"] = str(info.state.value)
        result["metadata"] = info.metadata
        result["ttl"] = (info.end_at - info.started_at).total_seconds()
        result["listed"] = [s.sandbox_id for s in Sandbox.list().next_items()]
        mine = SandboxQuery(metadata={"who": "alice"})
        result["by_meta"] = [s.sandbox_id for s in Sandbox.list(query=mine).next_items()]
        other = SandboxQuery(metadata={"who": "bob"})
        result["by_other_meta"] = [s.sandbox_id for s in Sandbox.list(query=other).next_items()]
        result["running"] = sbx.is_running()
        result["metrics"] = sbx.get_metrics()  # partial: no samples (docs/e2b.md)
        sbx.set_timeout(600)
        result["extended"] = (sbx.get_info().end_at - info.end_at).total_seconds()
        same = Sandbox.connect(sbx.sandbox_id)
        result["via_connect"] = same.commands.run("echo hi").stdout
        result["killed"] = sbx.kill()
        result["killed_again"] = Sandbox.kill(sbx.sandbox_id)
        result["running_after"] = sbx.is_running()
        try:
            Sandbox.get_info(sbx.sandbox_id)
        except Exception as e:
            result["get_after"] = kind(e)
        """
    )
    sid = out["id"]
    assert out["template"] == "base" and out["state"] == "running"
    assert out["metadata"] == {"who": "alice"}
    assert 100 < out["ttl"] <= 121
    assert sid in out["listed"] and out["by_meta"] == [sid] and out["by_other_meta"] == []
    assert out["running"] is True
    assert out["metrics"] == []
    assert out["extended"] > 400
    assert out["via_connect"] == "hi\n"
    assert out["killed"] is True and out["killed_again"] is False
    assert out["running_after"] is False
    assert out["get_after"] == "SandboxNotFoundException"


def test_context_manager_and_envs(sdk: SDK) -> None:
    out = sdk.run(
        """
        with Sandbox.create(envs={"FROM_CREATE": "yes"}) as sbx:
            result["env"] = sbx.commands.run("echo $FROM_CREATE").stdout
            result["id"] = sbx.sandbox_id
        result["after"] = [s.sandbox_id for s in Sandbox.list().next_items()]
        """
    )
    assert out["env"] == "yes\n"
    assert out["id"] not in out["after"]


def test_create_options(sdk: SDK) -> None:
    """Egress from `allow_internet_access` / `network`; `lifecycle` (kill on timeout) and
    `idempotency_key` accepted; `user=` of files resolves a relative path in that home."""
    out = sdk.run(
        """
        made = []
        try:
            closed = Sandbox.create(allow_internet_access=False)
            allowed = Sandbox.create(network={"deny_out": ["0.0.0.0/0"], "allow_out": ["10.9.9.9"]})
            other = Sandbox.create(lifecycle={"on_timeout": "kill"}, idempotency_key="k-1")
            made += [closed, allowed, other]
            result["sdk"] = [m.get_info().allow_internet_access for m in made]
            import httpx  # Orchard's own view of the same sandboxes
            auth = {"Authorization": "Bearer " + os.environ["E2B_API_KEY"]}
            url = os.environ["E2B_API_URL"] + "/v1/sandboxes/"
            views = [httpx.get(url + m.sandbox_id, headers=auth).json()["network"] for m in made]
            result["egress"] = [[v["egress"], v.get("allow") or []] for v in views]
            other.commands.run("mkdir -p /home/nobody")
            other.files.write("rel.txt", "as nobody", user="nobody")
            result["user_file"] = other.commands.run(
                "stat -c %U /home/nobody/rel.txt").stdout.strip()
            result["user_read"] = other.files.read("rel.txt", user="nobody")
        finally:
            for m in made:
                m.kill()
        """
    )
    assert out["sdk"] == [False, True, True]
    assert out["egress"] == [["none", []], ["allow", ["10.9.9.9"]], ["all", []]]
    assert out["user_file"] == "root"  # written as root, in nobody's home
    assert out["user_read"] == "as nobody"


def test_errors_are_the_sdks_exceptions(sdk: SDK) -> None:
    missing = f"{sdk.registry}/no/such:1"
    out = sdk.run(
        f"""
        from packaging.version import Version
        from e2b.connection_config import ConnectionConfig
        try:
            Sandbox.create(api_key="not-a-key")
        except Exception as e:
            result["bad_key"] = kind(e)
        try:
            Sandbox.create({missing!r})
        except Exception as e:
            result["bad_template"] = [kind(e), e.status_code, str(e)]
        try:
            Sandbox.create("127.0.0.1:1/private:1")
        except Exception as e:
            result["refused_template"] = [kind(e), e.status_code]
        try:
            Sandbox.connect("sb-000000000000")
        except Exception as e:
            result["unknown_id"] = kind(e)
        with Sandbox.create() as sbx:
            headers = {{"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983",
                       "X-Access-Token": "forged" * 8}}
            forged = Sandbox(
                sandbox_id=sbx.sandbox_id, sandbox_domain=None,
                envd_version=Version("0.6.4"), envd_access_token="forged",
                connection_config=ConnectionConfig(extra_sandbox_headers=headers),
            )
            for what, call in (
                ("run", lambda: forged.commands.run("true")),
                ("read", lambda: forged.files.read("/etc/hostname")),
                ("list", lambda: forged.files.list("/")),
            ):
                try:
                    call()
                except Exception as e:
                    result["forged_" + what] = kind(e)
            result["real_still_works"] = sbx.commands.run("echo ok").stdout
        """
    )
    assert out["bad_key"] == "AuthenticationException"
    kind_, status, message = out["bad_template"]
    assert kind_ == "SandboxException" and status == 404, out["bad_template"]
    assert missing in message
    assert out["refused_template"] == ["SandboxException", 400]
    assert out["unknown_id"] == "SandboxNotFoundException"
    assert out["forged_run"] == "AuthenticationException"
    assert out["forged_read"] == "AuthenticationException"
    assert out["forged_list"] == "AuthenticationException"
    assert out["real_still_works"] == "ok\n"


def test_two_tenants_are_isolated(sdk: SDK) -> None:
    alice = sdk.run(
        """
        sbx = Sandbox.create(timeout=120)
        result["id"] = sbx.sandbox_id
        result["token"] = sbx._envd_access_token
        """
    )
    sid = alice["id"]
    bob = sdk.run(
        f"""
        from packaging.version import Version
        from e2b.connection_config import ConnectionConfig
        sid = {sid!r}
        result["listed"] = [s.sandbox_id for s in Sandbox.list().next_items()]
        for what, call in (
            ("connect", lambda: Sandbox.connect(sid)),
            ("get_info", lambda: Sandbox.get_info(sid)),
            ("set_timeout", lambda: Sandbox.set_timeout(sid, 10)),
        ):
            try:
                call()
                result[what] = "allowed"
            except Exception as e:
                result[what] = kind(e)
        result["kill"] = Sandbox.kill(sid)
        with Sandbox.create() as own:
            # Bob's own, genuine token, with Alice's sandbox id.
            headers = {{"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "49983",
                        "X-Access-Token": own._envd_access_token}}
            cross = Sandbox(
                sandbox_id=sid, sandbox_domain=None, envd_version=Version("0.6.4"),
                envd_access_token=own._envd_access_token,
                connection_config=ConnectionConfig(extra_sandbox_headers=headers),
            )
            try:
                cross.commands.run("echo pwned > /tmp/pwned")
                result["cross_run"] = "allowed"
            except Exception as e:
                result["cross_run"] = kind(e)
            result["own_token_differs"] = own._envd_access_token != {alice["token"]!r}
        """,
        key=KEY_BOB,
    )
    assert sid not in bob["listed"]
    assert bob["connect"] == "SandboxNotFoundException"
    assert bob["get_info"] == "SandboxNotFoundException"
    assert bob["set_timeout"] == "SandboxNotFoundException"
    assert bob["kill"] is False
    assert bob["cross_run"] == "AuthenticationException"
    assert bob["own_token_differs"] is True
    after = sdk.run(
        f"""
        sbx = Sandbox.connect({sid!r})
        result["pwned"] = sbx.files.exists("/tmp/pwned")
        result["ttl"] = (sbx.get_info().end_at - sbx.get_info().started_at).total_seconds()
        result["killed"] = sbx.kill()
        """
    )
    assert after == {"pwned": False, "ttl": after["ttl"], "killed": True}
    assert after["ttl"] > 100  # bob's set_timeout(10) did not reach it


def test_readme_quickstart(sdk: SDK) -> None:
    """The `e2b` README's example, unchanged."""
    out = sdk.run(
        """
        from e2b import Sandbox

        with Sandbox.create() as sandbox:
            r = sandbox.commands.run("echo 'Hello, World!'")
        result["stdout"] = r.stdout
        """
    )
    assert out["stdout"] == "Hello, World!\n"
