"""API keys kept out of logs: every `orchard_key` query parameter blanked in log records."""

from __future__ import annotations

import logging
import re
from urllib.parse import unquote_plus

from orchard.env.server.auth import KEY_QUERY

# A query parameter, in whatever spelling the service would still read as `orchard_key`
# (`orchard%5Fkey=` decodes to it too).
_PARAM = re.compile(r"([?&;])([^=&\s\"?#]+)=([^&;\s\"#]*)")


def _param(m: re.Match[str]) -> str:
    if unquote_plus(m.group(2)) == KEY_QUERY:
        return f"{m.group(1)}{m.group(2)}=[redacted]"
    return m.group(0)


def redact(value: object) -> object:
    """`value` with the value of every `orchard_key` query parameter blanked."""
    if isinstance(value, str) and "=" in value:
        return _PARAM.sub(_param, value)
    return value


class RedactKeys(logging.Filter):
    """Blank `orchard_key=...` in every log line that may hold a URL: API keys never reach a log.

    The message and each argument are redacted in place, so the record keeps its shape
    (uvicorn's access formatter unpacks its five arguments, and its WebSocket lines log
    the path with the query through `uvicorn.error`).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a) for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: redact(v) for k, v in record.args.items()}
        return True


# The loggers that print request paths with their query (uvicorn's access log, uvicorn's
# WebSocket lines, the HTTP/WebSocket clients at debug level).
URL_LOGGERS = ("uvicorn.access", "uvicorn.error", "httpx", "httpcore", "websockets.client")
REDACT = RedactKeys()
