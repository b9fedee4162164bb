"""A sandbox's other ports through E2B's routing headers (`E2b-Sandbox-Port`), as the code
interpreter reaches its Jupyter server: the traffic token opens them, and no token or
routing header reaches the sandbox's server."""

from __future__ import annotations

from tests.e2b.conftest import DOMAIN, SDK

ECHO_SERVER = r"""
import http.server, json
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"path": self.path, "headers": dict(self.headers)}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_POST = do_GET
http.server.HTTPServer(("127.0.0.1", 8080), H).serve_forever()
"""


def test_other_ports(sdk: SDK) -> None:
    out = sdk.run(
        f"""
        import httpx
        url = os.environ["E2B_SANDBOX_URL"]
        with Sandbox.create() as sbx, Sandbox.create() as other:
            sbx.files.write("/tmp/echo.py", {ECHO_SERVER!r})
            sbx.commands.run("python3 /tmp/echo.py", background=True)
            base = {{"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "8080"}}
            def get(path, **headers):
                for _ in range(100):
                    r = httpx.get(url + path, headers={{**base, **headers}})
                    if r.status_code != 502:
                        return r
                    time.sleep(0.1)
                return r
            traffic = {{"E2B-Traffic-Access-Token": sbx.traffic_access_token}}
            r = get("/files?x=1", **traffic)
            seen = r.json()
            result["relayed"] = [r.status_code, seen["path"]]
            result["leaked"] = sorted(
                k for k in seen["headers"]
                if k.lower() in ("x-access-token", "e2b-traffic-access-token",
                                 "e2b-sandbox-id", "e2b-sandbox-port")
            )
            envd_token = {{"X-Access-Token": sbx._envd_access_token}}
            result["envd_token"] = get("/", **envd_token).status_code
            result["no_token"] = get("/").status_code
            others = {{"E2B-Traffic-Access-Token": other.traffic_access_token}}
            result["other_token"] = get("/", **others).status_code
            # The traffic token opens other ports, never envd.
            envd = httpx.get(url + "/health", headers={{
                "E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983",
                "X-Access-Token": sbx.traffic_access_token}})
            result["traffic_on_envd"] = envd.status_code
            closed = httpx.get(url + "/", headers={{**base, "E2b-Sandbox-Port": "8081", **traffic}})
            result["closed_port"] = closed.status_code
            result["orchard_route_kept"] = httpx.get(url + "/healthz", headers=base).status_code
        """
    )
    assert out["relayed"] == [200, "/files?x=1"]
    assert out["leaked"] == []
    assert out["envd_token"] == 200
    assert out["no_token"] == 401 and out["other_token"] == 401
    assert out["traffic_on_envd"] == 401
    assert out["closed_port"] == 502
    assert out["orchard_route_kept"] == 200


def test_routing_by_host_name(sdk: SDK) -> None:
    """`<port>-<id>.<domain>`, as the SDK names a sandbox without E2B_SANDBOX_URL (a TLS
    front proxy in front of the service in production; plain HTTP here)."""
    out = sdk.run(
        f"""
        import httpx
        url = os.environ["E2B_SANDBOX_URL"]
        with Sandbox.create() as sbx:
            sbx.files.write("/tmp/by-host", "hello")
            sbx.files.write("/tmp/echo.py", {ECHO_SERVER!r})
            sbx.commands.run("python3 /tmp/echo.py", background=True)
            def host(port):
                return {{"Host": f"{{port}}-{{sbx.sandbox_id}}.{DOMAIN}:443"}}
            token = {{"X-Access-Token": sbx._envd_access_token}}
            r = httpx.get(url + "/health", headers={{**host(49983), **token}})
            result["health"] = r.status_code
            r = httpx.get(url + "/files", params={{"path": "/tmp/by-host"}},
                          headers={{**host(49983), **token}})
            result["read"] = [r.status_code, r.text]
            result["no_token"] = httpx.get(url + "/health", headers=host(49983)).status_code
            traffic = {{"E2B-Traffic-Access-Token": sbx.traffic_access_token}}
            for _ in range(100):
                r = httpx.get(url + "/x", headers={{**host(8080), **traffic}})
                if r.status_code != 502:
                    break
                time.sleep(0.1)
            result["port"] = [r.status_code, r.json()["path"]]
            other = {{"Host": f"49983-{{sbx.sandbox_id}}.elsewhere.test"}}
            r = httpx.get(url + "/health", headers={{**other, **token}})
            result["other_domain"] = r.status_code
        """
    )
    assert out["health"] == 204
    assert out["read"] == [200, "hello"]
    assert out["no_token"] == 401
    assert out["port"] == [200, "/x"]
    assert out["other_domain"] == 404  # not routed: Orchard's own 404 for /health
