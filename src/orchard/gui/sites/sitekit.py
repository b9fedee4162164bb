"""Shared plumbing of the offline sites: requests, responses, HTML pages.

Runs inside the sandbox under Debian's python3 with the standard library only.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlencode


@dataclass
class Request:
    """One request as a site sees it: `path` has the site prefix (if any) removed."""

    method: str
    path: str
    params: dict[str, list[str]]
    base: str = ""  # "" when routed by Host, "/shop" etc. on the path-prefixed fallback

    def get(self, name: str, default: str = "") -> str:
        values = self.params.get(name)
        return values[0].strip() if values else default

    def url(self, path: str, **query: Any) -> str:
        """A link inside the same site, keeping the prefix of the fallback routing."""
        q = {k: v for k, v in query.items() if v not in (None, "")}
        return self.base + path + ("?" + urlencode(q) if q else "")


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "text/html; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)


def parse_params(query: str, body: str = "") -> dict[str, list[str]]:
    params = parse_qs(query, keep_blank_values=True)
    for k, v in parse_qs(body, keep_blank_values=True).items():
        params.setdefault(k, []).extend(v)
    return params


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def redirect(location: str) -> Response:
    # 303: the browser follows with a GET, and the action URL never enters the history,
    # so going back or reloading does not repeat it.
    return Response(303, b"", headers={"Location": location})


CSS = """
* { box-sizing: border-box; }
body { margin: 0; font: 17px/1.45 "DejaVu Sans", Arial, sans-serif; color: #1d1d1f;
       background: #f4f5f7; }
header { display: flex; align-items: center; gap: 24px; padding: 12px 28px; color: #fff; }
header a.brand { color: #fff; font-size: 26px; font-weight: bold; text-decoration: none; }
header nav a { color: #fff; margin-right: 18px; font-weight: bold; }
header form { margin-left: auto; display: flex; gap: 8px; }
main { max-width: 1200px; margin: 18px auto; padding: 0 24px; }
.panel { background: #fff; border: 1px solid #d5d8dd; border-radius: 8px; padding: 16px 20px;
         margin-bottom: 16px; }
.layout { display: flex; gap: 20px; align-items: flex-start; }
.side { width: 270px; flex: none; }
.grow { flex: 1; }
a { color: #0645ad; }
h1 { font-size: 30px; margin: 6px 0 14px; }
h2 { font-size: 22px; margin: 8px 0; }
label { display: block; font-weight: bold; margin: 10px 0 4px; }
input[type=text], input[type=number], input[type=email], select, textarea {
  font: inherit; padding: 7px 9px; border: 2px solid #8a8f98; border-radius: 6px;
  width: 100%; background: #fff; }
header input[type=text] { width: 360px; }
header button { background: #fff; color: #1d1d1f; border-color: #fff; }
textarea { min-height: 180px; }
button, .button { display: inline-block; font: inherit; font-weight: bold; padding: 8px 18px;
  border: 2px solid #1a4fa0; border-radius: 6px; background: #2563c9; color: #fff;
  cursor: pointer; text-decoration: none; margin: 6px 6px 6px 0; }
.button.light, button.light { background: #fff; color: #1a4fa0; }
.button.danger, button.danger { background: #c62828; border-color: #8e1b1b; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 8px 10px; border-bottom: 1px solid #e1e3e7; }
.notice { background: #e7f6e7; border: 2px solid #3b8f3b; padding: 10px 14px;
          border-radius: 6px; margin-bottom: 14px; }
.error { background: #fdecea; border: 2px solid #c62828; padding: 10px 14px;
         border-radius: 6px; margin-bottom: 14px; }
.muted { color: #5f6368; }
.price { font-size: 20px; font-weight: bold; color: #b12704; }
.stars { color: #e08a00; font-weight: bold; }
"""


def page(
    req: Request,
    *,
    title: str,
    site: str,
    colour: str,
    nav: list[tuple[str, str]],
    body: str,
    search: str = "",
    query: str = "",
) -> Response:
    """A whole HTML page: coloured header with the site name, links and a search box."""
    links = "".join(f'<a href="{esc(req.url(href))}">{esc(text)}</a>' for text, href in nav)
    form = ""
    if search:
        form = (
            f'<form action="{esc(req.url(search))}" method="get" role="search">'
            f'<input type="text" name="q" value="{esc(query)}" placeholder="Search {esc(site)}"'
            f' aria-label="Search {esc(site)}"><button type="submit">Search</button></form>'
        )
    doc = (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>{esc(title)} - {esc(site)}</title><style>{CSS}</style></head>"
        f'<body><header style="background:{colour}">'
        f'<a class="brand" href="{esc(req.url("/"))}">{esc(site)}</a><nav>{links}</nav>{form}'
        f"</header><main>{body}</main></body></html>"
    )
    return Response(200, doc.encode())


class SiteBase:
    """What the sites share: a name, a header colour and links, and the page frame."""

    name = ""
    colour = "#333"

    def nav(self) -> list[tuple[str, str]]:
        return [("Home", "/")]

    def render(self, req: Request, title: str, body: str, query: str = "") -> Response:
        return page(
            req,
            title=title,
            site=self.name,
            colour=self.colour,
            nav=self.nav(),
            body=body,
            search="/search",
            query=query,
        )

    def error(self, req: Request, status: int, message: str) -> Response:
        resp = self.render(
            req,
            "Error",
            f'<div class="error">{esc(message)}</div>'
            '<p><a href="javascript:history.back()">Go back</a></p>',
        )
        resp.status = status
        return resp


def options_html(pairs: list[tuple[str, str]], selected: str, blank: str | None = None) -> str:
    """`<option>`s from (value, label) pairs, the selected one marked."""
    out = f'<option value="">{esc(blank)}</option>' if blank is not None else ""
    for value, label in pairs:
        sel = " selected" if value == selected else ""
        out += f'<option value="{esc(value)}"{sel}>{esc(label)}</option>'
    return out
