"""API keys kept out of logs, at every level: one filter on every logger and handler.

What a log record may carry a key in, and what is blanked there:
- a URL's `orchard_key` query parameter (uvicorn's access and WebSocket lines, the HTTP
  clients at debug level), in whatever spelling the service would still read;
- a credential header's value: `Authorization` and `Proxy-Authorization` (API keys, the
  agent token), `X-API-Key`, `X-Access-Token`, `Cookie` (an `orchard_key` cookie, or any
  other holding a key): as a `name: value` line (the websockets handshake dumps, which log
  the name and value as two arguments), or quoted in a repr (`'authorization': b'...'`);
- a `Bearer <token>` anywhere;
- the literal value of every configured API key and of the service secret (belt and
  braces: a key pasted into a path, a WebSocket frame, an exception).
"""

from __future__ import annotations

import logging
import re
import traceback
from collections.abc import Iterable
from urllib.parse import unquote_plus

from orchard.env.server.auth import KEY_QUERY

R = "[redacted]"
# A query parameter, in whatever spelling the service would still read as `orchard_key`
# (`orchard%5Fkey=` decodes to it too).
_PARAM = re.compile(r"([?&;])([^=&\s\"?#]+)=([^&;\s\"#]*)")
# The headers whose values are credentials (the agent's token goes as Authorization).
SECRET_HEADERS = frozenset(
    ("authorization", "proxy-authorization", "x-api-key", "x-access-token", "cookie")
)
_NAMES = "|".join(re.escape(h) for h in sorted(SECRET_HEADERS, key=len, reverse=True))
# `'authorization': 'Bearer ...'`, `(b'cookie', b'...')`, `"X-API-Key"="..."`: the quoted value.
_QUOTED = re.compile(rf"(?i)(\b(?:{_NAMES})['\"]?\s*[:,=]\s*b?)(['\"])(.*?)(?<!\\)\2")
# `Authorization: Bearer ...` up to the end of its line (a header dump, a raw head).
_LINE = re.compile(rf"(?im)(\b(?:{_NAMES})[ \t]*:[ \t]*)([^'\"\r\n][^\r\n]*)")
_HEADER = re.compile(_NAMES)  # on lower-cased text: a cheap test before the two above
_BEARER = re.compile(r"(?i)(\bbearer\s+)(?!\[redacted\])[^\s'\",;]+")
# Literal values shorter than this are left to the rules above (they would blank words).
MIN_LITERAL = 8


def _param(m: re.Match[str]) -> str:
    if unquote_plus(m.group(2)) == KEY_QUERY:
        return f"{m.group(1)}{m.group(2)}={R}"
    return m.group(0)


def redact_query(value: str) -> str:
    """`value` with the value of every `orchard_key` query parameter blanked."""
    return _PARAM.sub(_param, value) if "=" in value else value


class RedactKeys(logging.Filter):
    """Blank every credential in a log record (see the module's docstring); never drops one.

    Each argument is redacted in place, so the record keeps its shape (uvicorn's access
    formatter unpacks its five arguments); only a record whose arguments hold a header's
    name apart from its value (`"> %s: %s"`) is formatted here, then redacted whole.
    """

    def __init__(self) -> None:
        super().__init__()
        self._literals: set[str] = set()
        self._literal: re.Pattern[str] | None = None

    def add_secrets(self, values: Iterable[str | bytes]) -> None:
        """Blank these literal values too (the configured API keys, the service secret)."""
        for v in values:
            text = v.decode(errors="replace") if isinstance(v, bytes) else v
            if len(text) >= MIN_LITERAL:
                self._literals.add(text)
        if self._literals:
            alts = sorted(self._literals, key=len, reverse=True)
            self._literal = re.compile("|".join(re.escape(v) for v in alts))

    def redact(self, value: str) -> str:
        """`value` with every credential the rules know blanked (cheap checks first: most
        log arguments, an address, a method, a plain path, match no rule)."""
        out = redact_query(value)
        low = out.lower()
        if "bearer" in low:
            out = _BEARER.sub(rf"\g<1>{R}", out)
        if (":" in out or "," in out or "=" in out) and _HEADER.search(low):
            out = _QUOTED.sub(rf"\g<1>\g<2>{R}\g<2>", out)
            out = _LINE.sub(rf"\g<1>{R}", out)
        if self._literal is not None and self._literal.search(out):
            out = self._literal.sub(R, out)
        return out

    def _arg(self, value: object) -> object:
        return self.redact(value) if isinstance(value, str) else value

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "orchard_redacted", False):
            return True  # seen by a logger's filter and then a handler's: once is enough
        setattr(record, "orchard_redacted", True)  # noqa: B010 (not a LogRecord field)
        msg = record.msg if isinstance(record.msg, str) else str(record.msg)
        if isinstance(record.args, tuple) and record.args:
            args = tuple(self._arg(a) for a in record.args)
            if any(_whole(a) for a in args):
                # A header's name and value as separate arguments, or a container or object
                # whose text may hold one (a headers list): redact the line whole.
                record.msg, record.args = self.redact(_format(msg, args)), ()
            else:
                record.msg, record.args = self.redact(msg), args
        elif record.args:  # a mapping (`%(name)s`, or one dict logged with `%s`)
            record.msg, record.args = self.redact(_format(msg, record.args)), ()
        else:
            record.msg = self.redact(msg)
        if record.exc_info and not record.exc_text:
            # Formatted here, so the handler prints the redacted text (Formatter reuses it).
            record.exc_text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        if record.stack_info:
            record.stack_info = self.redact(record.stack_info)
        return True


def _whole(arg: object) -> bool:
    if isinstance(arg, str):
        return arg.strip().lower() in SECRET_HEADERS
    return not isinstance(arg, int | float | type(None))


def _format(msg: str, args: object) -> str:
    try:
        return msg % args
    except (TypeError, ValueError):
        return f"{msg} {args}"


# The loggers that print requests, their headers or a URL with its query (uvicorn's access
# log, uvicorn's WebSocket lines and handshake dumps, the HTTP/WebSocket clients and
# servers at debug level); records of loggers not named here are still redacted by the
# filter on every handler (`install`).
LOGGERS = (
    "uvicorn",
    "uvicorn.access",
    "uvicorn.error",
    "httpx",
    "httpcore",
    "h11",
    "websockets",
    "websockets.client",
    "websockets.server",
    "websockets.protocol",
    "orchard",
)
URL_LOGGERS = LOGGERS  # the older name
REDACT = RedactKeys()


def install(secrets: Iterable[str | bytes] = ()) -> RedactKeys:
    """Put the filter on the loggers above and on every handler configured now (the root's,
    uvicorn's, `logging.lastResort`), so no logger's record escapes it; `secrets` are
    blanked literally too. Idempotent (a filter is added once per logger or handler)."""
    REDACT.add_secrets(secrets)
    loggers: list[logging.Logger] = [logging.getLogger(), *map(logging.getLogger, LOGGERS)]
    for lg in loggers:
        lg.addFilter(REDACT)
    known = logging.Logger.manager.loggerDict.values()
    handlers = [logging.lastResort] if logging.lastResort else []
    for lg in [*loggers, *(x for x in known if isinstance(x, logging.Logger))]:
        handlers += lg.handlers
    for h in handlers:
        h.addFilter(REDACT)
    return REDACT


def redact(value: object) -> object:
    """`value` with every credential blanked (strings only; anything else as it is)."""
    return REDACT.redact(value) if isinstance(value, str) else value
