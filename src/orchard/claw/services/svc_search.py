"""Web search over a local corpus: BM25 ranking, and fetching a page by url."""

from __future__ import annotations

import math
import re

from .common import Item, Service, ToolError

_WORD = re.compile(r"[a-z0-9]+")
K1, B = 1.2, 0.75


def _tokens(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _snippet(text: str, terms: list[str], width: int = 160) -> str:
    low = text.lower()
    hits = [low.find(t) for t in terms if low.find(t) >= 0]
    start = max(0, min(hits) - 40) if hits else 0
    piece = text[start : start + width].replace("\n", " ")
    return ("..." if start else "") + piece + ("..." if start + width < len(text) else "")


class Search(Service):
    name = "search"

    def __init__(self, fixture: Item) -> None:
        super().__init__(fixture)
        self.data.setdefault("documents", [])
        self._index()

    def _index(self) -> None:
        self._docs = [_tokens(d["title"] + " " + d["text"]) for d in self.data["documents"]]
        self._avg = sum(map(len, self._docs)) / max(1, len(self._docs))
        self._df: dict[str, int] = {}
        for toks in self._docs:
            for t in set(toks):
                self._df[t] = self._df.get(t, 0) + 1

    def _score(self, toks: list[str], terms: list[str]) -> float:
        n, score = len(self._docs), 0.0
        for t in terms:
            tf = toks.count(t)
            if tf:
                idf = math.log(1 + (n - self._df[t] + 0.5) / (self._df[t] + 0.5))
                score += idf * tf * (K1 + 1) / (tf + K1 * (1 - B + B * len(toks) / self._avg))
        return score

    def search_web(self, query: str, k: int = 5) -> Item:
        terms = _tokens(query)
        if not terms:
            raise ToolError("argument 'query': no words to search for")
        scored = [(self._score(toks, terms), i) for i, toks in enumerate(self._docs)]
        ranked = sorted((s, i) for s, i in scored if s > 0)
        ranked.sort(key=lambda si: (-si[0], si[1]))
        results = []
        for s, i in ranked[:k]:
            doc = self.data["documents"][i]
            results.append(
                {
                    "url": doc["url"],
                    "title": doc["title"],
                    "snippet": _snippet(doc["text"], terms),
                    "score": round(s, 3),
                }
            )
        return {"query": query, "results": results}

    def search_fetch_page(self, url: str) -> Item:
        for doc in self.data["documents"]:
            if doc["url"] == url or doc["url"].rstrip("/") == url.rstrip("/"):
                return {"url": doc["url"], "title": doc["title"], "text": doc["text"]}
        raise ToolError(f"page not found: {url} (use a url from search_web results)", 404)
