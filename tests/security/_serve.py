"""Run the real service (`orchard.env.server.serve`) as its own process for the security tests.

Like `orchard serve`, configured from ORCHARD_* variables, plus the test labels on every
container (so a crashed run leaves nothing the session cleanup cannot find) and logging of
every `orchard.*`, uvicorn and HTTP-client logger at the requested level (the log tests
read it all back).
"""

from __future__ import annotations

import json
import logging
import os
import sys

from orchard.env.config import ServiceConfig
from orchard.env.server import serve


def main() -> None:
    port = int(sys.argv[1])
    level = os.environ.get("ORCHARD_TEST_LOG_LEVEL", "info")
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    labels = json.loads(os.environ.get("ORCHARD_TEST_LABELS", "{}"))
    config = ServiceConfig.from_env(extra_labels=labels)
    serve(config, host="127.0.0.1", port=port, log_level=level)


if __name__ == "__main__":
    main()
