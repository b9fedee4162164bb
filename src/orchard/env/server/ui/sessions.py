"""Dashboard sessions: an API key exchanged once for an opaque token that expires.

The page keeps the token in JS memory and sends it as `Authorization: Bearer`, so the key
itself never sits in a URL, a cookie or the page's storage. Only a SHA-256 of each token is
held (a leaked memory dump or a dict lookup's timing gives nothing usable), in this
process's memory: a restart logs everyone out, and replicas do not share sessions.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from dataclasses import dataclass

DEFAULT_TTL_S = 8 * 3600.0
MAX_TTL_S = 24 * 3600.0
MAX_SESSIONS = 10_000  # beyond it the oldest go first: a login flood cannot grow memory
# Beyond it the owner's own oldest go: one tenant's login loop cannot log the others out.
MAX_PER_OWNER = 64


@dataclass(frozen=True)
class Session:
    token: str
    owner: str
    expires_at: float  # unix time


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class SessionStore:
    """token digest -> (owner, expiry), thread-safe (the exec fast path runs off the loop)."""

    def __init__(self) -> None:
        self._by_digest: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()

    def create(self, owner: str, ttl_s: float = DEFAULT_TTL_S) -> Session:
        """A fresh token for `owner` (256 random bits), valid for `ttl_s` (capped)."""
        ttl = min(max(ttl_s, 0.0), MAX_TTL_S)
        token = "orchs_" + secrets.token_urlsafe(32)
        expires = time.time() + ttl
        with self._lock:
            self._prune(time.time())
            mine = [k for k, (o, _) in self._by_digest.items() if o == owner]
            for key in mine[: max(0, len(mine) - MAX_PER_OWNER + 1)]:
                del self._by_digest[key]
            while len(self._by_digest) >= MAX_SESSIONS:
                self._by_digest.pop(next(iter(self._by_digest)))
            self._by_digest[_digest(token)] = (owner, expires)
        return Session(token, owner, expires)

    def owner_for(self, token: str | None) -> str | None:
        """The owner of a live session token; None for an unknown or expired one."""
        if not token or not token.startswith("orchs_"):
            return None
        key = _digest(token)
        with self._lock:
            found = self._by_digest.get(key)
            if found is None:
                return None
            owner, expires = found
            if time.time() >= expires:
                del self._by_digest[key]
                return None
        return owner

    def revoke(self, token: str | None) -> bool:
        """End a session (logout); whether it existed."""
        if not token:
            return False
        with self._lock:
            return self._by_digest.pop(_digest(token), None) is not None

    def _prune(self, now: float) -> None:
        for key in [k for k, (_, exp) in self._by_digest.items() if exp <= now]:
            del self._by_digest[key]
