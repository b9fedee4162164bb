"""The offline sites' server in a real sandbox, driven over real HTTP through the port proxy.

The proxy sends `Host: 127.0.0.1:8000`, so these requests use the path-prefixed routes
(`/shop/...`); routing by Host name is checked from inside the sandbox.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from orchard import Orchard
from orchard.env.sdk import Sandbox
from orchard.gui.browser_env import SITES_DIR

PORT = 8000
TOKEN_FILE = "/run/orchard/sites-token"


@dataclass
class Sites:
    client: Orchard
    sb: Sandbox
    token: str

    def request(
        self, method: str, path: str, *, token: str | None = None, follow: bool = True
    ) -> httpx.Response:
        headers = {"X-Orchard-Token": token} if token is not None else {}
        r = self.client.http.request(
            method, self.sb.port_url(PORT, path.lstrip("/")), headers=headers, timeout=30.0
        )
        if follow and r.status_code == 303:  # the server's Location is relative to its root
            return self.request("GET", r.headers["location"])
        return r

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return self.request("GET", path, **kw)

    def page(self, path: str) -> str:
        r = self.get(path)
        assert r.status_code == 200, (path, r.status_code, r.text[:500])
        return r.text

    def state(self) -> dict[str, Any]:
        r = self.get("__orchard/state", token=self.token)
        assert r.status_code == 200
        data: dict[str, Any] = r.json()
        return data

    def reset(self) -> None:
        assert self.request("POST", "__orchard/reset", token=self.token).status_code == 200


@pytest.fixture(scope="module")
def sites(gui_client: Orchard, browser_image: str) -> Iterator[Sites]:
    """The server started the way BrowserEnv starts it, in the image it runs in."""
    sb = gui_client.sandboxes.create(browser_image, network={"egress": "none"})
    try:
        sb.files.upload_dir(SITES_DIR, "/opt/orchard/sites")
        token = secrets.token_urlsafe(24)
        sb.files.mkdir("/run/orchard", mode=0o700)
        sb.files.write(TOKEN_FILE, token, mode=0o600)
        proc = sb.process.start(
            [
                "python3",
                "/opt/orchard/sites/server.py",
                "--port",
                str(PORT),
                "--token-file",
                TOKEN_FILE,
            ],
            tag="sites",
        )
        site = Sites(gui_client, sb, token)
        deadline = time.monotonic() + 20
        while True:
            try:
                if site.get("__orchard/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            info = sb.process.get(proc.id)
            assert info.status == "running" and time.monotonic() < deadline, sb.process.output(
                proc.id, "stderr"
            ).data
            time.sleep(0.1)
        yield site
    finally:
        sb.delete()


@pytest.fixture
def fresh(sites: Sites) -> Sites:
    sites.reset()
    return sites


def names_in_order(html: str) -> list[str]:
    return re.findall(r'<a href="[^"]*/product/p-\d+"><b>([^<]+)</b>', html)


def test_hidden_endpoints_need_the_token(fresh: Sites) -> None:
    assert fresh.get("__orchard/health").json() == {"ok": True}
    for token in (None, "", "wrong-" + fresh.token):
        r = fresh.get("__orchard/state", token=token)
        assert r.status_code == 404 and r.text == fresh.get("no/such/page").text == "not found"
        assert fresh.request("POST", "__orchard/reset", token=token).status_code == 404
    state = fresh.state()
    assert set(state) == {"shop", "wiki", "mail"}
    assert state["shop"]["cart"] == [] and state["shop"]["last_search"] is None
    assert len(state["mail"]["messages"]) == 20
    assert fresh.get("__orchard/nothing", token=fresh.token).status_code == 404


def test_shop_search_filters_and_sort(fresh: Sites) -> None:
    html = fresh.page("shop/search?category=shoes&brand=Nordwind&size=42&sort=price_asc")
    assert names_in_order(html) == ["Nordwind Road Glide", "Nordwind Trail Runner 2"]
    assert "2 results" in html
    html = fresh.page("shop/search?category=headphones&min_rating=4.5&sort=price_desc")
    assert names_in_order(html) == [
        "Auralis Reference One",
        "Solace Studio ANC",
        "Brightline Wave 500 ANC",
    ]
    html = fresh.page("shop/search?q=noise+cancelling&max_price=200&sort=rating_desc")
    assert names_in_order(html) == ["Brightline Wave 500 ANC", "Auralis Commuter"]
    html = fresh.page("shop/search?category=backpacks&colour=black&sort=reviews_desc")
    assert names_in_order(html)[0] == "Alpina Daypack 22"
    assert "No products match" in fresh.page("shop/search?q=submarine")
    assert fresh.state()["shop"]["last_search"] == {
        "q": "submarine",
        "sort": "relevance",
    }
    assert len(fresh.state()["shop"]["searches"]) == 5


def test_shop_product_cart_and_checkout(fresh: Sites) -> None:
    html = fresh.page("shop/product/p-003")
    assert "Veloce Sprint Pro" in html and "$129.99" in html and "Add to cart" in html
    assert fresh.get("shop/product/p-999").status_code == 404
    r = fresh.get("shop/cart/add?product=p-003&colour=red&qty=1")
    assert r.status_code == 400 and "Please choose a size" in r.text
    r = fresh.get("shop/cart/add?product=p-003&colour=green&size=42")
    assert r.status_code == 400 and "not sold in green" in r.text
    r = fresh.get("shop/cart/add?product=p-003&colour=red&size=42&qty=1", follow=False)
    assert r.status_code == 303 and r.headers["location"] == "/shop/cart?added=p-003"
    fresh.get("shop/cart/add?product=p-003&colour=red&size=42&qty=2")  # merges into line 0
    fresh.get("shop/cart/add?product=p-040&qty=1")
    cart = fresh.state()["shop"]["cart"]
    assert [(c["product_id"], c["qty"], c["options"]) for c in cart] == [
        ("p-003", 3, {"colour": "red", "size": "42"}),
        ("p-040", 1, {"colour": "clear"}),
    ]
    assert "Subtotal: $414.47" in fresh.page("shop/cart")
    fresh.get("shop/cart/update?line=0&qty=1")
    fresh.get("shop/cart/remove?line=1")
    assert [c["qty"] for c in fresh.state()["shop"]["cart"]] == [1]
    assert "Place order" in fresh.page("shop/checkout")
    r = fresh.get("shop/checkout/place?name=Sam&address=&city=X&zip=1")
    assert r.status_code == 400 and "address" in r.text
    r = fresh.get("shop/checkout/place?name=Sam&address=1+Road&city=X&zip=1&coupon=FREE")
    assert r.status_code == 400 and "FREE is not valid" in r.text
    html = fresh.page(
        "shop/checkout/place?name=Sam+Rivera&address=12+Harbour+Road&city=Port+Aldrin"
        "&zip=4401&shipping=express&coupon=spring10"
    )
    assert "Order O-1001" in html and "Thank you" in html and "Total: $131.98" in html
    order = fresh.state()["shop"]["orders"][-1]
    assert order["coupon"] == "SPRING10" and order["shipping"]["method"] == "express"
    assert (order["subtotal"], order["discount"], order["shipping_cost"], order["total"]) == (
        129.99,
        13.0,
        14.99,
        131.98,
    )
    assert fresh.state()["shop"]["cart"] == []
    assert "O-1001" in fresh.page("shop/orders")
    assert fresh.get("shop/checkout").status_code == 400  # empty cart


def test_wiki_articles_search_watch_and_edit(fresh: Sites) -> None:
    html = fresh.page("wiki/wiki/verlay-lighthouse")
    assert "<th>Completed</th><td>1889</td>" in html
    assert 'href="/wiki/wiki/edda-voss">Edda Voss</a>' in html
    assert "Mereth Isles" in fresh.page("wiki/")
    assert len(re.findall(r"<li><a href=", fresh.page("wiki/all"))) == 25
    r = fresh.get("wiki/search?q=aldrin+bridge", follow=False)  # an exact title: go there
    assert r.status_code == 303 and r.headers["location"] == "/wiki/wiki/aldrin-bridge"
    html = fresh.page("wiki/search?q=lighthouse")
    assert "Verlay Lighthouse" in html and "Search results" in html
    assert fresh.get("wiki/wiki/atlantis").status_code == 404
    fresh.get("wiki/watch?page=sorrel-river")
    assert "Unwatch" in fresh.page("wiki/wiki/sorrel-river")
    assert "Sorrel River" in fresh.page("wiki/watchlist")
    text = "The market opened in 1898. It is open Monday to Saturday."
    assert "Save page" in fresh.page("wiki/edit?page=brell-fish-market")
    fresh.get(f"wiki/save?page=brell-fish-market&summary=hours&text={text.replace(' ', '+')}")
    assert "open Monday to Saturday" in fresh.page("wiki/wiki/brell-fish-market")
    state = fresh.state()["wiki"]
    assert state["watchlist"] == ["sorrel-river"]
    assert state["edits"] == [{"page": "brell-fish-market", "summary": "hours", "text": text}]
    assert state["searches"] == ["aldrin bridge", "lighthouse"]


def test_mail_read_organise_and_send(fresh: Sites) -> None:
    inbox = fresh.page("mail/")
    assert "Quarterly report figures" in inbox and "<b>(5)</b>" in inbox  # unread count
    assert "Lighthouse question" in fresh.page("mail/folder/work")
    html = fresh.page("mail/message/m-01")
    assert "Could you send me the final figures" in html and "Reply" in html
    fresh.get("mail/message/m-05/star")
    fresh.get("mail/message/m-02/move?folder=Archive")
    fresh.get("mail/message/m-04/delete")
    fresh.get("mail/message/m-07/unread")
    assert fresh.get("mail/message/m-02/move?folder=Starred").status_code == 400
    assert "Boiler inspection" in fresh.page("mail/folder/starred")
    assert "FREE cruise" in fresh.page("mail/folder/trash")
    assert "ferry booking" in fresh.page("mail/search?q=TF-20931")
    assert "Re: Quarterly report figures" in fresh.page("mail/compose?reply=m-01")
    r = fresh.get("mail/send?to=not-an-address&subject=x&body=y&action=send")
    assert r.status_code == 400 and "not-an-address" in r.text
    assert "Your message was sent" in fresh.page(
        "mail/send?to=Priya+%3Cpriya.natarajan%40orchard.test%3E&cc=&subject=Re%3A+Figures"
        "&body=By+Friday.&in_reply_to=m-01&action=send"
    )
    assert "Draft saved" in fresh.page(
        "mail/send?to=helpdesk%40orchard.test&subject=Password+reset&body=Please&action=draft"
    )
    state = fresh.state()["mail"]
    by_id = {m["id"]: m for m in state["messages"]}
    assert by_id["m-01"]["read"] and by_id["m-05"]["starred"] and not by_id["m-07"]["read"]
    assert (by_id["m-02"]["folder"], by_id["m-04"]["folder"]) == ("Archive", "Trash")
    assert state["sent"] == [
        {
            "to": ["priya.natarajan@orchard.test"],
            "cc": [],
            "subject": "Re: Figures",
            "body": "By Friday.",
            "in_reply_to": "m-01",
            "forward_of": None,
        },
    ]
    assert [d["subject"] for d in state["drafts"]] == ["Password reset"]
    # Sending a draft removes it from the drafts.
    fresh.get("mail/send?to=helpdesk%40orchard.test&subject=Password+reset&draft=0&action=send")
    state = fresh.state()["mail"]
    assert state["drafts"] == [] and len(state["sent"]) == 2


def test_reset_restores_every_site(fresh: Sites) -> None:
    seed = fresh.state()
    fresh.get("shop/cart/add?product=p-040")
    fresh.get("wiki/watch?page=kessa")
    fresh.get("mail/message/m-20/delete")
    assert fresh.state() != seed
    fresh.reset()
    assert fresh.state() == seed
    assert "Your cart is empty" in fresh.page("shop/cart")


def test_host_routing_and_bind_address_inside_the_sandbox(sites: Sites) -> None:
    """Chromium reaches the sites by name; the server also binds 0.0.0.0 on request."""
    script = (
        "import json, urllib.request, subprocess, time\n"
        "def get(host, path, port=8000):\n"
        "    url = f'http://127.0.0.1:{port}{path}'\n"
        "    req = urllib.request.Request(url, headers={'Host': host})\n"
        "    with urllib.request.urlopen(req) as r: return r.read().decode()\n"
        "out = {n: get(f'{n}.localhost:8000', p) for n, p in "
        "[('shop', '/product/p-017'), ('wiki', '/wiki/kessa'), ('mail', '/folder/inbox')]}\n"
        "p = subprocess.Popen(['python3', '/opt/orchard/sites/server.py', '--host', '0.0.0.0',"
        " '--port', '8001'])\n"
        "for _ in range(100):\n"
        "    try: out['any'] = get('shop.localhost', '/', 8001); break\n"
        "    except OSError: time.sleep(0.05)\n"
        "p.terminate()\n"
        "print(json.dumps(out))\n"
    )
    r = sites.sb.exec(["python3", "-c", script], timeout_s=60)
    assert r.exit_code == 0, r.stderr
    out = json.loads(r.stdout)
    assert "Solace Studio ANC" in out["shop"] and 'href="/cart"' in out["shop"]
    assert "Mount Orrin" in out["wiki"] and "Orchard Mail" in out["mail"]
    assert "Welcome to Orchard Shop" in out["any"]
