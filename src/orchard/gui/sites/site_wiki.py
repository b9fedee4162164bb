"""The wiki: articles with infoboxes and links, search, a watchlist and page edits.

Article text is a tiny wikitext: paragraphs split by blank lines, links as `[[slug|label]]`.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

from .sitekit import Request, Response, SiteBase, esc, redirect

LINK = re.compile(r"\[\[([^|\]]+)(?:\|([^\]]+))?\]\]")


def plain(text: str) -> str:
    """The text a reader sees: links reduced to their labels."""
    return LINK.sub(lambda m: m.group(2) or m.group(1), text)


class Wiki(SiteBase):
    colour = "#3b4a5a"

    def __init__(self, data_dir: Path) -> None:
        self.data: dict[str, Any] = json.loads((data_dir / "wiki.json").read_text())
        self.name = self.data["name"]
        self.reset()

    def reset(self) -> None:
        self.articles: dict[str, dict[str, Any]] = copy.deepcopy(self.data["articles"])
        self.watchlist: list[str] = []
        self.edits: list[dict[str, str]] = []
        self.searches: list[str] = []
        self.viewed: list[str] = []

    def state(self) -> dict[str, Any]:
        return copy.deepcopy(
            {
                "watchlist": self.watchlist,
                "edits": self.edits,
                "searches": self.searches,
                "viewed": self.viewed,
            }
        )

    def handle(self, req: Request) -> Response:
        path = req.path.rstrip("/") or "/"
        if path == "/":
            return self.article(req, self.data["main"])
        if path.startswith("/wiki/"):
            return self.article(req, path.removeprefix("/wiki/"))
        routes = {
            "/search": self.search,
            "/all": self.all_pages,
            "/watch": self.watch,
            "/unwatch": self.unwatch,
            "/watchlist": self.watchlist_page,
            "/edit": self.edit,
            "/save": self.save,
        }
        if path in routes:
            return routes[path](req)
        return self.error(req, 404, "There is no page at this address.")

    def nav(self) -> list[tuple[str, str]]:
        return [("Main page", "/"), ("All articles", "/all"), ("Watchlist", "/watchlist")]

    def html_text(self, req: Request, text: str) -> str:
        def link(m: re.Match[str]) -> str:
            slug, label = m.group(1), m.group(2) or m.group(1)
            return f'<a href="{esc(req.url("/wiki/" + slug))}">{esc(label)}</a>'

        paras = [p.strip() for p in text.split("\n\n") if p.strip()]
        out = ""
        for para in paras:
            pieces, last = [], 0
            for m in LINK.finditer(para):
                pieces.append(esc(para[last : m.start()]) + link(m))
                last = m.end()
            out += "<p>" + "".join(pieces) + esc(para[last:]) + "</p>"
        return out

    def article(self, req: Request, slug: str) -> Response:
        a = self.articles.get(slug)
        if a is None:
            return self.error(req, 404, f"There is no article called {slug!r}.")
        self.viewed.append(slug)
        del self.viewed[:-50]
        info = "".join(
            f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in a["infobox"].items()
        )
        watching = slug in self.watchlist
        watch = (
            f'<a class="button light" href="{esc(req.url("/unwatch", page=slug))}">'
            "&#9733; Unwatch</a>"
            if watching
            else f'<a class="button light" href="{esc(req.url("/watch", page=slug))}">'
            "&#9734; Watch this page</a>"
        )
        cats = ", ".join(esc(c) for c in a["categories"])
        body = (
            '<div class="layout"><div class="panel grow">'
            f"<h1>{esc(a['title'])}</h1><p>{watch}"
            f'<a class="button light" href="{esc(req.url("/edit", page=slug))}">Edit</a></p>'
            f"{self.html_text(req, a['text'])}<p class=muted>Categories: {cats}</p></div>"
            f'<aside class="panel side"><h2>{esc(a["title"])}</h2><table>{info}</table></aside>'
            "</div>"
        )
        return self.render(req, a["title"], body)

    def search(self, req: Request) -> Response:
        q = req.get("q")
        self.searches.append(q)
        del self.searches[:-50]
        words = q.lower().split()
        exact = next((s for s, a in self.articles.items() if a["title"].lower() == q.lower()), "")
        if exact:
            return redirect(req.url("/wiki/" + exact))
        hits = []
        for slug, a in self.articles.items():
            text = plain(a["text"])
            hay = " ".join([a["title"], text, *a["infobox"].values()]).lower()
            if words and all(w in hay for w in words):
                score = sum(a["title"].lower().count(w) * 10 + hay.count(w) for w in words)
                hits.append((-score, a["title"], slug, text))
        hits.sort()
        items = "".join(
            f'<li><a href="{esc(req.url("/wiki/" + slug))}"><b>{esc(title)}</b></a>'
            f"<br><span class=muted>{esc(text[:160])}&hellip;</span></li>"
            for _, title, slug, text in hits
        )
        body = (
            f'<div class="panel"><h1>Search results for &ldquo;{esc(q)}&rdquo;</h1>'
            + (f"<ol>{items}</ol>" if items else "<p>No articles match.</p>")
            + "</div>"
        )
        return self.render(req, "Search", body, query=q)

    def all_pages(self, req: Request) -> Response:
        items = "".join(
            f'<li><a href="{esc(req.url("/wiki/" + slug))}">{esc(a["title"])}</a></li>'
            for slug, a in sorted(self.articles.items(), key=lambda kv: kv[1]["title"])
        )
        body = f'<div class="panel"><h1>All articles</h1><ul>{items}</ul></div>'
        return self.render(req, "All articles", body)

    def watch(self, req: Request) -> Response:
        slug = req.get("page")
        if slug not in self.articles:
            return self.error(req, 404, "No such article.")
        if slug not in self.watchlist:
            self.watchlist.append(slug)
        return redirect(req.url("/wiki/" + slug))

    def unwatch(self, req: Request) -> Response:
        slug = req.get("page")
        if slug in self.watchlist:
            self.watchlist.remove(slug)
        return redirect(req.url("/wiki/" + slug))

    def watchlist_page(self, req: Request) -> Response:
        items = "".join(
            f'<li><a href="{esc(req.url("/wiki/" + s))}">{esc(self.articles[s]["title"])}</a>'
            f' &middot; <a href="{esc(req.url("/unwatch", page=s))}">unwatch</a></li>'
            for s in self.watchlist
        )
        body = '<div class="panel"><h1>Your watchlist</h1>' + (
            f"<ul>{items}</ul></div>" if items else "<p>Your watchlist is empty.</p></div>"
        )
        return self.render(req, "Watchlist", body)

    def edit(self, req: Request) -> Response:
        slug = req.get("page")
        a = self.articles.get(slug)
        if a is None:
            return self.error(req, 404, "No such article.")
        body = (
            f'<form class="panel" action="{esc(req.url("/save"))}" method="get">'
            f"<h1>Editing {esc(a['title'])}</h1>"
            f'<input type="hidden" name="page" value="{esc(slug)}">'
            '<label for="text">Article text (links are written [[page|label]])</label>'
            '<textarea id="text" aria-label="Article text"'
            f' name="text" rows="14">{esc(a["text"])}</textarea>'
            '<label for="summary">Edit summary</label>'
            '<input type="text" id="summary" aria-label="Edit summary" name="summary">'
            '<button type="submit">Save page</button>'
            f'<a class="button light" href="{esc(req.url("/wiki/" + slug))}">Cancel</a></form>'
        )
        return self.render(req, "Edit " + a["title"], body)

    def save(self, req: Request) -> Response:
        slug = req.get("page")
        a = self.articles.get(slug)
        text = req.params.get("text", [""])[0].replace("\r\n", "\n").strip()
        if a is None or not text:
            return self.error(req, 400, "Choose an article and give it some text.")
        if text != a["text"]:
            a["text"] = text
            self.edits.append({"page": slug, "summary": req.get("summary"), "text": text})
        return redirect(req.url("/wiki/" + slug))
