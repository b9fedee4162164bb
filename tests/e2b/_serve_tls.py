"""The service as `orchard serve --host ADDRESS --port PORT --tls-cert CERT --tls-key KEY`
runs it, plus the test labels on every container (tests/security/_serve.py does the same
for plain HTTP): `python _serve_tls.py ADDRESS PORT CERT KEY`."""

from __future__ import annotations

import json
import logging
import os
import sys

from orchard.env.config import ServiceConfig
from orchard.env.server import serve


def main() -> None:
    address, port, cert, key = sys.argv[1:5]
    level = os.environ.get("ORCHARD_TEST_LOG_LEVEL", "info")
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    labels = json.loads(os.environ.get("ORCHARD_TEST_LABELS", "{}"))
    config = ServiceConfig.from_env(extra_labels=labels)
    serve(config, host=address, port=int(port), log_level=level, tls_cert=cert, tls_key=key)


if __name__ == "__main__":
    main()
