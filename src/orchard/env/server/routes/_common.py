"""Route pieces every router shares: the per-sandbox prefix, error and content docs."""

from __future__ import annotations

from typing import Any

from orchard.env.models import ErrorResponse

SB = "/v1/sandboxes/{sandbox_id}"
ERRORS: dict[int | str, dict[str, Any]] = {
    s: {"model": ErrorResponse} for s in (400, 401, 404, 409, 410, 413, 422, 429, 501, 503)
}
NDJSON: dict[int | str, dict[str, Any]] = {
    200: {"content": {"application/x-ndjson": {}}, "description": "StreamEvent lines"}
}
